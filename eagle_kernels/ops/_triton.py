"""Optional Triton: ``triton``, ``tl`` and ``HAS_TRITON`` for the ops modules.

Triton is a default dependency, but ``import eagle_kernels`` and the torch (and cpu / cuda)
backends must work where it is missing (a CPU-only install, a platform without wheels). Every
ops module imports ``triton`` and ``tl`` from here instead of from Triton itself. Without
Triton:

* ``triton.jit`` returns a stub that raises when launched or called, so the kernel
  definitions still execute at import time (their bodies are never parsed or run);
* ``triton.next_power_of_2`` and ``triton.cdiv`` are plain-Python equivalents (host code of the
  cuda backend uses them too);
* ``tl`` answers any attribute with an inert placeholder (``tl.constexpr(x)`` returns ``x``),
  which covers module-level constants; annotations are strings (``from __future__ import
  annotations`` in every ops module), so ``BLOCK: tl.constexpr`` is never evaluated;
* :func:`eagle_kernels.ops._backend.backend_status` reports the triton backend unavailable
  with reason :data:`MISSING_REASON`, so ``auto`` never picks it and an explicit request raises.
"""

from __future__ import annotations

MISSING_REASON = "triton is not installed"

try:
    import triton
    import triton.language as tl
    HAS_TRITON = True
    # JITFunction, or InterpretedFunction under TRITON_INTERPRET=1 (also autotune's wrappers)
    KERNEL_TYPES: tuple = (triton.runtime.jit.KernelInterface,)
except ImportError:  # also raised when sys.modules["triton"] is None (how the tests block it)
    HAS_TRITON = False

    class _Kernel:
        """Stand-in for a ``@triton.jit`` function: indexing (a launch) or calling raises."""

        def __init__(self, fn):
            self.fn = fn
            self.__name__ = getattr(fn, "__name__", "kernel")
            self.__doc__ = getattr(fn, "__doc__", None)

        def _missing(self, *args, **kwargs):
            raise RuntimeError(f"{self.__name__}: {MISSING_REASON} (use backend='torch')")

        __call__ = _missing

        def __getitem__(self, grid):
            return self._missing

    class _Triton:
        """The few host-side helpers of the triton module the ops use, in plain Python."""

        @staticmethod
        def jit(fn=None, **_options):
            if fn is None:  # @triton.jit(...) with options
                return _Kernel
            return _Kernel(fn)

        @staticmethod
        def next_power_of_2(n: int) -> int:
            return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()

        @staticmethod
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

    class _Placeholder:
        """Any ``tl`` attribute: callable (returns its first argument) and attribute-bearing."""

        def __call__(self, *args, **_kwargs):
            return args[0] if args else self

        def __getattr__(self, name):
            return _Placeholder()

    class _Language(_Placeholder):
        pass

    triton = _Triton()
    tl = _Language()
    KERNEL_TYPES = (_Kernel,)


def is_kernel(obj) -> bool:
    """Whether ``obj`` is a ``@triton.jit`` function (without Triton: its stand-in); its
    ``obj.fn`` is the Python function it was made from (or, for ``triton.autotune``'s
    wrapper, the jit function it wraps)."""
    return isinstance(obj, KERNEL_TYPES)


__all__ = ["HAS_TRITON", "MISSING_REASON", "is_kernel", "tl", "triton"]
