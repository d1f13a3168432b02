"""Backend registry: which implementation of an op runs, and why the others cannot.

Every op has up to three backends with one signature and one contract:

* ``"cuda"``   kernels from ``csrc/`` compiled into ``eagle_kernels._C`` (CUDA tensors only);
* ``"triton"`` Triton kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``);
* ``"torch"``  the reference ops of :mod:`eagle_kernels.ops.reference` (any device).

``backend="auto"`` (the default of every public op) takes the environment variable
``EAGLE_KERNELS_BACKEND`` when it is set, which forces one backend for every op (useful in tests
and benchmarks); otherwise the first of cuda, triton, torch that is available here, supports
the inputs' device and is enabled for ``auto`` for this op. A kernel is enabled for ``auto``
only once it has been proven against the reference on a GPU; until then it is reachable by
naming its backend explicitly.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Callable, NamedTuple

import torch

BACKENDS = ("cuda", "triton", "torch")
BACKEND_ENV = "EAGLE_KERNELS_BACKEND"


class BackendStatus(NamedTuple):
    available: bool
    reason: str


class _Implementation(NamedTuple):
    fn: Callable
    auto: bool


_REGISTRY: dict[str, dict[str, _Implementation]] = {}


def register(op: str, backend: str, fn: Callable, auto: bool = True) -> None:
    """Register ``fn`` as ``backend``'s implementation of ``op``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    _REGISTRY.setdefault(op, {})[backend] = _Implementation(fn, auto)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _import_status(module: str) -> BackendStatus:
    try:
        importlib.import_module(module)
    except Exception as error:  # an extension can fail with OSError as well as ImportError
        return BackendStatus(False, f"cannot import {module}: {error}")
    return BackendStatus(True, f"{module} imported")


def cuda_extension():
    """The compiled ``eagle_kernels._C`` module; raises ImportError if it was not built."""
    return importlib.import_module("eagle_kernels._C")


def cuda_stream(device: torch.device) -> int:
    """Raw handle of torch's current stream on ``device``: what the ``_C`` launchers take."""
    return torch.cuda.current_stream(device).cuda_stream


def backend_status(backend: str) -> BackendStatus:
    """Whether ``backend`` can run on this machine, and why (not)."""
    if backend == "torch":
        return BackendStatus(True, f"torch {torch.__version__}")
    if backend == "triton":
        imported = _import_status("triton")
        if not imported.available:
            return imported
        if torch.cuda.is_available():
            return BackendStatus(True, "triton on CUDA device")
        if _interpreting():
            return BackendStatus(True, "triton interpreter on CPU (TRITON_INTERPRET=1)")
        return BackendStatus(False, "no CUDA device (TRITON_INTERPRET=1 runs kernels on CPU)")
    if backend == "cuda":
        imported = _import_status("eagle_kernels._C")
        if not imported.available:
            return BackendStatus(False, "eagle_kernels._C not built (no nvcc at install time?): "
                                 + imported.reason)
        if not torch.cuda.is_available():
            return BackendStatus(False, "eagle_kernels._C built, but torch sees no CUDA device")
        return BackendStatus(True, "eagle_kernels._C on CUDA device")
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def available_backends() -> dict[str, BackendStatus]:
    """Map each backend name to whether it runs here and why (not)."""
    return {name: backend_status(name) for name in BACKENDS}


def _supports_device(backend: str, device: torch.device) -> bool:
    if backend == "torch":
        return True
    if backend == "triton":
        return device.type == "cuda" or (device.type == "cpu" and _interpreting())
    return device.type == "cuda"


def _requested_backend(backend: str) -> str:
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced and forced != "auto" and forced not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}: expected 'auto' or one of {BACKENDS}, got {forced!r}")
    return forced or "auto"


def resolve(op: str, backend: str, device: torch.device) -> tuple[str, Callable]:
    """Pick the implementation of ``op`` for tensors on ``device``.

    Raises ValueError naming the backend when an explicitly requested (or forced) backend has
    no implementation of ``op``, cannot run on this machine, or cannot take ``device`` tensors.
    """
    implementations = _REGISTRY[op]
    requested = _requested_backend(backend)
    if requested == "auto":
        for name in BACKENDS:
            impl = implementations.get(name)
            if (impl is not None and impl.auto and backend_status(name).available
                    and _supports_device(name, device)):
                return name, impl.fn
        return "torch", implementations["torch"].fn
    impl = implementations.get(requested)
    if impl is None:
        raise ValueError(f"backend: {op} has no {requested!r} implementation "
                         f"(it has: {sorted(implementations)})")
    status = backend_status(requested)
    if not status.available:
        raise ValueError(f"backend: {requested!r} is not available here: {status.reason}")
    if not _supports_device(requested, device):
        raise ValueError(f"backend: {requested!r} cannot run {op} on {device.type} tensors")
    return requested, impl.fn


def op_backends() -> dict[str, dict[str, str]]:
    """For each op: backend -> 'auto' (chosen by auto when available) or 'explicit only'."""
    return {op: {name: ("auto" if impl.auto else "explicit only")
                 for name, impl in sorted(impls.items())}
            for op, impls in sorted(_REGISTRY.items())}


def backend_report() -> str:
    """Human-readable table of backend availability and each op's implementations."""
    lines = ["backends on this machine:"]
    for name, status in available_backends().items():
        lines.append(f"  {name:<7} {'yes' if status.available else 'no ':<4} {status.reason}")
    lines.append("ops (backend: used by auto / explicit only):")
    for op, impls in op_backends().items():
        lines.append(f"  {op:<24} " + ", ".join(f"{b}: {how}" for b, how in impls.items()))
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        lines.append(f"{BACKEND_ENV}={forced} forces that backend for backend='auto'")
    return "\n".join(lines)
