"""eagle_kernels: Triton and CUDA kernels and a thin runtime for EAGLE speculative decoding.

``eagle_kernels.ops`` holds the fused ops (tree attention, top-k expansion and rerank, tree
construction, acceptance, KV compaction) with a pure-PyTorch reference for each;
``eagle_kernels.runtime`` holds the models and the generation loop.
"""

from . import ops
from .ops import available_backends, backend_report

__version__ = "0.1.0"

__all__ = ["ops", "available_backends", "backend_report", "from_hf", "from_pretrained",
           "__version__"]


def from_pretrained(*args, **kwargs):
    """Load a target model and an EAGLE draft head: :func:`eagle_kernels.runtime.api.from_pretrained`.

    Imported lazily, so ``import eagle_kernels`` for the ops alone does not load transformers.
    """
    from .runtime.api import from_pretrained as load

    return load(*args, **kwargs)


def from_hf(*args, **kwargs):
    """Wrap a loaded transformers model, sharing its weights: :func:`eagle_kernels.runtime.hf.from_hf`."""
    from .runtime.hf import from_hf as wrap

    return wrap(*args, **kwargs)
