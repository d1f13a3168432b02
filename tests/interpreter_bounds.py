"""Bounds checking for every Triton kernel the tests run in the interpreter (CPU).

The interpreter dereferences raw addresses: a kernel that loads a few elements past its tensor
reads whatever lies there, and nothing fails unless a value happens to show (one did, as a
stray ``overflow in exp`` warning: test_kernel_bounds.py). :func:`install` wraps the
interpreter so that, for every load and store, the unmasked lanes must all fall inside ONE of
the launch's tensor arguments (the view's own extent, not its storage: outputs that are views
into sentinel buffers count as out of bounds past the view). One access never spans two
tensors in our kernels, so a read that runs off one tensor into a neighbouring argument (small
CPU tensors often sit side by side) fails too. A violation raises naming the kernel.

What it cannot see: an index that stays inside the same tensor but in the wrong row (the tests
compare results for that), and gaps inside a strided view (which the extent spans).

Cost: a min and a max per memory access, small beside what the interpreter spends on one.
"""

from __future__ import annotations

import inspect
import os

import numpy as np


class OutOfBounds(AssertionError):
    pass


def _extent(tensor) -> tuple[int, int] | None:
    """[first byte, past the last byte) that a strided view can address; None when empty."""
    if tensor.numel() == 0:
        return None
    low = high = 0
    for size, stride in zip(tensor.shape, tensor.stride()):
        reach = (size - 1) * stride
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    item = tensor.element_size()
    return tensor.data_ptr() + low * item, tensor.data_ptr() + (high + 1) * item


def _tensors(value):
    if hasattr(value, "data_ptr") and hasattr(value, "stride"):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _compact_kv_caches(args) -> list[tuple[int, int]]:
    """ops/kv.py's _compact_kv_kernel reaches every layer's cache as its first pointer plus a
    byte offset from a table (one launch for all layers). The extents come from the caches the
    table was built for (its cache key holds their addresses, shapes and dtypes), not from the
    table itself, so a wrong table is caught too."""
    from eagle_kernels.ops import kv

    table = args["offsets_ptr"].data_ptr()
    for key, layout in kv._LAYOUTS.items():
        if layout.addresses.data_ptr() == table:
            return [(address, address + int(np.prod(shape)) * dtype.itemsize)
                    for address, shape, dtype in key[2:]]
    raise OutOfBounds("_compact_kv_kernel: launched with a layout table kv._layout did not build")


# Kernels that address tensors other than their arguments, by design: name -> their extents.
_ADDRESSED_THROUGH_OFFSETS = {"_compact_kv_kernel": _compact_kv_caches}


class _Launch:
    """The extents of the running kernel's tensor arguments (kernels never nest)."""

    name = "?"
    extents: list[tuple[int, int]] = []


def _check(kind: str, ptrs, mask) -> None:
    from triton.runtime.interpreter import _get_np_dtype

    addresses = np.asarray(ptrs.data, dtype=np.uint64)
    active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
    addresses = addresses[active]
    if addresses.size == 0:
        return
    size = _get_np_dtype(ptrs.get_element_ty()).itemsize
    first, last = int(addresses.min()), int(addresses.max()) + size
    if any(low <= first and last <= high for low, high in _Launch.extents):
        return
    raise OutOfBounds(f"{_Launch.name}: {kind} of {addresses.size} lane(s) over "
                      f"[{hex(first)}, {hex(last)}), not inside one tensor argument (extents "
                      f"{[(hex(a), hex(b)) for a, b in _Launch.extents]})")


def install() -> None:
    """Wrap the interpreter's launches, loads and stores (idempotent); nothing to do when
    Triton kernels are compiled (TRITON_INTERPRET unset)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    if getattr(interpreter, "_eagle_bounds_installed", False):
        return
    interpreter._eagle_bounds_installed = True
    executor = interpreter.GridExecutor
    init_args = executor._init_args_hst

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        extents = [_extent(t) for t in _tensors(list(args_hst) + list(kwargs_hst.values()))]
        _Launch.name = getattr(self.fn, "__name__", "?")
        _Launch.extents = [e for e in extents if e is not None]
        if _Launch.name in _ADDRESSED_THROUGH_OFFSETS:
            named = inspect.getcallargs(self.fn, *args_hst, **kwargs_hst)
            _Launch.extents += _ADDRESSED_THROUGH_OFFSETS[_Launch.name](named)
        return args_hst, kwargs_hst

    executor._init_args_hst = init_args_checked
    builder = type(interpreter.interpreter_builder)
    load, store = builder.create_masked_load, builder.create_masked_store

    def load_checked(self, ptrs, mask, other, cache_policy, is_volatile):
        _check("load", ptrs, mask)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def store_checked(self, ptrs, value, mask, cache_policy):
        _check("store", ptrs, mask)
        return store(self, ptrs, value, mask, cache_policy)

    builder.create_masked_load, builder.create_masked_store = load_checked, store_checked
