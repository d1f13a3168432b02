"""The interpreter bounds check (tests/interpreter_bounds.py) catches what it exists for."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="checks the Triton interpreter (CPU runs)")


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, extra, store_extra, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    values = tl.load(src_ptr + offs, mask=offs < n + extra, other=0.0)
    tl.store(dst_ptr + offs, values, mask=offs < n + store_extra)


@triton.jit
def _unmasked_kernel(src_ptr, dst_ptr, at):
    tl.store(dst_ptr, tl.load(src_ptr + at))


def _copy(n, extra=0, store_extra=0, src=None, as_keywords=False):
    buffer = torch.arange(32, dtype=torch.float32)
    src = buffer[:n] if src is None else src
    dst = buffer[16:16 + n]  # right after src's storage span: a neighbour in the same buffer
    if as_keywords:
        _copy_kernel[(1,)](src_ptr=src, dst_ptr=dst, n=n, extra=extra, store_extra=store_extra,
                           BLOCK=16)
    else:
        _copy_kernel[(1,)](src, dst, n, extra, store_extra, BLOCK=16)
    return dst.tolist()


def test_masked_accesses_inside_the_views_pass():
    assert _copy(5) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert _copy(5, as_keywords=True) == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_a_load_one_element_past_its_view_is_caught_inside_the_storage():
    with pytest.raises(Exception, match="_copy_kernel: load of 6 lane"):
        _copy(5, extra=1)
    with pytest.raises(Exception, match="_copy_kernel: load"):
        _copy(5, extra=1, as_keywords=True)


def test_a_store_past_its_view_is_caught():
    with pytest.raises(Exception, match="_copy_kernel: store"):
        _copy(5, store_extra=1)


def test_a_read_running_into_a_neighbouring_argument_is_caught():
    """src = buffer[:16], dst = buffer[16:32]: lane 16 of src lands inside dst, still wrong."""
    buffer = torch.arange(32, dtype=torch.float32)
    with pytest.raises(Exception, match="not inside one tensor argument"):
        _copy_kernel[(1,)](buffer[:16], buffer[16:32], 16, 1, 0, BLOCK=32)


def test_unmasked_loads_are_checked_too():
    src, dst = torch.arange(4, dtype=torch.float32), torch.zeros(1)
    _unmasked_kernel[(1,)](src, dst, 3)
    assert dst.item() == 3.0
    with pytest.raises(Exception, match="_unmasked_kernel: load of 1 lane"):
        _unmasked_kernel[(1,)](src, dst, 4)


def test_a_strided_view_covers_its_whole_extent():
    base = torch.arange(32, dtype=torch.float32)
    assert _copy(5, src=base[::2][:8]) == [0.0, 1.0, 2.0, 3.0, 4.0]
