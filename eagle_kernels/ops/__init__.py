"""Public ops of eagle_kernels: validate inputs -> pick a backend -> call.

Each op takes ``backend="auto" | "cuda" | "triton" | "torch"`` and has the contract of the
same-named reference op in :mod:`eagle_kernels.ops.reference`. ``EAGLE_KERNELS_BACKEND`` forces
one backend wherever ``backend="auto"``; :func:`available_backends` and :func:`backend_report`
say which backends run on this machine and why the others do not.
"""

from . import reference
from ._backend import BACKEND_ENV, BACKENDS, available_backends, backend_report, op_backends
from ._validate import CHECK_VALUES_ENV, value_checks_enabled, weights_unchanged
from .acceptance import (greedy_accept_chain, greedy_accept_tree, stochastic_accept_chain,
                         stochastic_accept_tree)
from .attention import tree_attention
from . import attention_triton  # noqa: F401,E402  registers the triton tree_attention
from .decoder import (apply_rope, cpu_activations, linear, linear_group, rms_norm,
                      set_cpu_activations, silu_mul)
from . import decoder_triton  # noqa: F401,E402  registers the triton decoder ops
from .layer import DecoderStep, LayerWeights, decoder_layer, decoder_layer_backend
from .kv import compact_kv, rope_write_kv, write_kv
from .loss import soft_cross_entropy
from .reference import AcceptResult, DraftTree
from .sampling import target_probs
from .topk import eagle2_expand, topk_log_softmax
from .tree import build_tree, eagle2_rerank, pack_tree_mask, unpack_tree_mask

__all__ = [
    "AcceptResult", "BACKENDS", "BACKEND_ENV", "CHECK_VALUES_ENV", "DecoderStep", "DraftTree",
    "LayerWeights", "apply_rope", "available_backends", "backend_report", "build_tree",
    "compact_kv", "cpu_activations", "decoder_layer", "decoder_layer_backend", "eagle2_expand",
    "eagle2_rerank", "greedy_accept_chain", "greedy_accept_tree", "linear", "linear_group",
    "op_backends", "pack_tree_mask", "reference", "rms_norm", "rope_write_kv",
    "set_cpu_activations", "silu_mul",
    "soft_cross_entropy", "stochastic_accept_chain", "stochastic_accept_tree", "target_probs",
    "topk_log_softmax", "tree_attention", "unpack_tree_mask", "value_checks_enabled",
    "weights_unchanged", "write_kv",
]
from . import library  # noqa: E402,F401  registers torch.ops.eagle_kernels.* (torch.library)
