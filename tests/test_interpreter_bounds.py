"""The interpreter bounds check (tests/interpreter_bounds.py) catches what it exists for."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from interpreter_bounds import OutOfBounds  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="checks the Triton interpreter (CPU runs)")


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, extra, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(src_ptr + offs, mask=offs < n + extra, other=0.0)
    tl.store(dst_ptr + offs, values, mask=offs < n)


def _launch(n, extra, src=None):
    buffer = torch.arange(16, dtype=torch.float32)
    src = buffer[:n] if src is None else src
    dst = torch.zeros(n)
    _copy_kernel[(1,)](src, dst, n, extra, BLOCK=16)
    return dst


def test_masked_access_inside_the_views_passes():
    assert _launch(5, 0).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_one_element_past_a_view_is_caught_even_inside_its_storage():
    with pytest.raises(Exception, match="_copy_kernel: load of 1 lane"):
        _launch(5, 1)


def test_strided_views_cover_their_whole_extent():
    base = torch.arange(32, dtype=torch.float32)
    assert _launch(5, 0, src=base[::2][:8]).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert issubclass(OutOfBounds, AssertionError)
