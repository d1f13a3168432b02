"""Helpers for tests of the cpu backend (eagle_kernels._cpu): skip where it is not built (a
failing build under CI=true is an error, since CI machines have a C++ compiler), and run a
check once per instruction set the processor supports."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest

from eagle_kernels.ops import available_backends


def _cpu_status():
    return available_backends()["cpu"]


def cpu_backend_missing_reason() -> str | None:
    status = _cpu_status()
    return None if status.available else status.reason


if os.environ.get("CI") == "true" and cpu_backend_missing_reason() is not None:
    raise RuntimeError(f"CI=true but the cpu backend is missing: {cpu_backend_missing_reason()}")

needs_cpu_backend = pytest.mark.skipif(cpu_backend_missing_reason() is not None,
                                       reason=f"cpu backend: {cpu_backend_missing_reason()}")


def each_cpu_isa() -> Iterator[str]:
    """Yield with the kernels switched to each supported instruction set, then restore."""
    from eagle_kernels import _cpu

    default = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            yield isa
    finally:
        _cpu.set_isa(default)


CPU_ISAS = ("avx512", "avx2", "generic")


@contextlib.contextmanager
def using_cpu_isa(isa: str):
    """The cpu kernels switched to ``isa`` for the block (the test is skipped where the backend
    is not built or the processor lacks ``isa``), restored afterwards."""
    if cpu_backend_missing_reason() is not None:
        pytest.skip(f"cpu backend: {cpu_backend_missing_reason()}")
    from eagle_kernels import _cpu

    if isa not in _cpu.supported_isas():
        pytest.skip(f"this processor lacks {isa}")
    default = _cpu.isa()
    _cpu.set_isa(isa)
    try:
        yield isa
    finally:
        _cpu.set_isa(default)
