"""The eagle_kernels._C extension as a whole: it imports wherever it was built, and every
launcher and host twin rejects impossible sizes with ValueError."""

from __future__ import annotations

import pytest

from cuda_support import _import_extension, _missing_extension


def test_extension_imports():
    module, error = _import_extension()
    if module is None:
        _missing_extension(error)
    for name in ("build_tree", "build_tree_host", "argmax_rows", "argmax_rows_host",
                 "greedy_accept_paths", "greedy_accept_paths_host"):
        assert callable(getattr(module, name)), name


def test_bad_sizes_raise_value_error(ext):
    with pytest.raises(ValueError, match="num_nodes"):
        ext.build_tree_host(0, 0, 0, 0, 1, 0, 0)
    with pytest.raises(ValueError, match="dtype_code"):
        ext.argmax_rows_host(0, 0, 1, 4, 7)
    with pytest.raises(ValueError, match="width"):
        ext.greedy_accept_paths_host(0, 0, 0, 0, 0, 0, 1, 4, 1, 0)
