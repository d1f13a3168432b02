"""The public ops as ``torch.library`` custom ops: ``torch.ops.eagle_kernels.<name>``.

Registered ops are visible to ``torch.compile`` (no graph break: each op is one opaque node
with a fake implementation for shapes and dtypes), ``torch.export`` and engines that compose
registered custom ops (vLLM, SGLang). Each op's implementation calls the same-named public
function of :mod:`eagle_kernels.ops` with the same arguments, so validation, backend choice
(``backend="auto" | "cuda" | "triton" | "torch"``; ``"cpu"`` too for the decoder ops) and results
are exactly those of the plain function::

    import eagle_kernels  # registers the ops
    depth, tree_mask, paths = torch.ops.eagle_kernels.build_tree(parents)
    out = torch.ops.eagle_kernels.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask)
    output_tokens, num_accepted, accepted_nodes = torch.ops.eagle_kernels.greedy_accept_tree(
        tokens, paths, logits)

Differences from the Python functions, all forced by the schema language:

* NamedTuple results are plain tuples: ``AcceptResult`` -> (output_tokens, num_accepted,
  accepted_nodes); ``eagle2_rerank`` -> (tokens, parents, depth, scores, tree_mask, paths,
  selected), the six ``DraftTree`` fields then ``selected``.
* Sampling parameters are scalars (``temperature: float``, ``top_k: int``, ``top_p: float``);
  per-sequence values go in the optional tensors ``temperatures`` / ``top_ks`` / ``top_ps``
  ([B], or [R] for ``target_probs``), which replace the scalar when given.
* ``linear_group`` takes ``biases`` (``Tensor?[]``, one entry per weight, None for none)
  as a required argument.
* ``rms_norm`` has no ``residual``; the fused residual form is ``rms_norm_residual(x, residual,
  weight, eps)`` -> (normed, x + residual).
* ``compact_kv`` is declared as mutating ``caches`` (``Tensor(a!)[]``) and returns nothing.
* ``soft_cross_entropy`` has an autograd formula (``(softmax(x) - softmax(y)) * grad``) in
  torch ops; the other ops are inference-only.

The runtime keeps calling the plain functions (CUDA-graph capture is unchanged by this module).
"""

from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import acceptance, attention, decoder, kv, loss, sampling, topk, tree

NAMESPACE = "eagle_kernels"
OPS = ("tree_attention", "topk_log_softmax", "eagle2_expand", "eagle2_rerank", "build_tree",
       "greedy_accept_tree", "greedy_accept_chain", "stochastic_accept_tree",
       "stochastic_accept_chain", "target_probs", "compact_kv", "soft_cross_entropy", "linear",
       "linear_group", "rms_norm", "rms_norm_residual", "silu_mul", "apply_rope", "write_kv",
       "rope_write_kv")


def _op(name: str, mutates_args=()):
    return torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=mutates_args)


def _sampling(temperature, top_k, top_p, temperatures, top_ks, top_ps):
    """The public ops' sampling arguments: a per-sequence tensor where given, else the scalar."""
    return (temperature if temperatures is None else temperatures,
            top_k if top_ks is None else top_ks,
            top_p if top_ps is None else top_ps)


def _accept_like(batch, width, device) -> Tuple[Tensor, Tensor, Tensor]:
    """Fake AcceptResult: output_tokens [B, W] int64, num_accepted [B] int32, accepted_nodes
    [B, W] int32."""
    return (torch.empty(batch, width, dtype=torch.int64, device=device),
            torch.empty(batch, dtype=torch.int32, device=device),
            torch.empty(batch, width, dtype=torch.int32, device=device))


def _contiguous(*tensors: Tensor) -> Tuple[Tensor, ...]:
    return tuple(t.contiguous() for t in tensors)


# ------------------------------------------------------------------------------ attention


@_op("tree_attention")
def _tree_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor,
                    tree_mask: Tensor, sm_scale: Optional[float] = None,
                    num_tree_keys: Optional[int] = None, backend: str = "auto") -> Tensor:
    return attention.tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale,
                                    num_tree_keys, backend).contiguous()


@_tree_attention.register_fake
def _(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale=None, num_tree_keys=None,
      backend="auto"):
    return q.new_empty(q.shape)


# ------------------------------------------------------------------------------ top-k / rerank


@_op("topk_log_softmax")
def _topk_log_softmax(logits: Tensor, k: int, d2t: Optional[Tensor] = None,
                      backend: str = "auto") -> Tuple[Tensor, Tensor]:
    return _contiguous(*topk.topk_log_softmax(logits, k, d2t, backend))


@_topk_log_softmax.register_fake
def _(logits, k, d2t=None, backend="auto"):
    rows = logits.shape[0]
    return (logits.new_empty(rows, k, dtype=torch.float32),
            logits.new_empty(rows, k, dtype=torch.int64))


@_op("eagle2_expand")
def _eagle2_expand(frontier_scores: Tensor, child_log_probs: Tensor, top_k: int,
                   backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    return _contiguous(*topk.eagle2_expand(frontier_scores, child_log_probs, top_k, backend))


@_eagle2_expand.register_fake
def _(frontier_scores, child_log_probs, top_k, backend="auto"):
    batch, frontier, children = child_log_probs.shape
    return (frontier_scores.new_empty(batch, frontier * children, dtype=torch.float32),
            frontier_scores.new_empty(batch, top_k, dtype=torch.int64),
            frontier_scores.new_empty(batch, top_k, dtype=torch.float32))


@_op("eagle2_rerank")
def _eagle2_rerank(root_tokens: Tensor, candidate_tokens: Tensor, candidate_scores: Tensor,
                   candidate_parents: Tensor, num_nodes: int, max_depth: Optional[int] = None,
                   backend: str = "auto"
                   ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    draft_tree, selected = tree.eagle2_rerank(root_tokens, candidate_tokens, candidate_scores,
                                              candidate_parents, num_nodes, max_depth, backend)
    return _contiguous(*draft_tree, selected)


def _tree_like(batch, num_nodes, max_depth, device):
    """Fake depth [B, N] int32, tree_mask [B, N, ceil(N/32)] int32, paths [B, N, D+1] int32."""
    width = (num_nodes - 1 if max_depth is None else max_depth) + 1
    return (torch.empty(batch, num_nodes, dtype=torch.int32, device=device),
            torch.empty(batch, num_nodes, (num_nodes + 31) // 32, dtype=torch.int32,
                        device=device),
            torch.empty(batch, num_nodes, width, dtype=torch.int32, device=device))


@_eagle2_rerank.register_fake
def _(root_tokens, candidate_tokens, candidate_scores, candidate_parents, num_nodes,
      max_depth=None, backend="auto"):
    batch, device = candidate_tokens.shape[0], candidate_tokens.device
    depth, tree_mask, paths = _tree_like(batch, num_nodes, max_depth, device)
    return (torch.empty(batch, num_nodes, dtype=torch.int64, device=device),
            torch.empty(batch, num_nodes, dtype=torch.int32, device=device), depth,
            torch.empty(batch, num_nodes, dtype=torch.float32, device=device), tree_mask, paths,
            torch.empty(batch, num_nodes - 1, dtype=torch.int64, device=device))


# ------------------------------------------------------------------------------ tree


@_op("build_tree")
def _build_tree(parents: Tensor, max_depth: Optional[int] = None,
                backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    return _contiguous(*tree.build_tree(parents, max_depth, backend))


@_build_tree.register_fake
def _(parents, max_depth=None, backend="auto"):
    return _tree_like(parents.shape[0], parents.shape[1], max_depth, parents.device)


# ------------------------------------------------------------------------------ acceptance


@_op("greedy_accept_tree")
def _greedy_accept_tree(tokens: Tensor, paths: Tensor, target_logits: Tensor,
                        backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    return _contiguous(*acceptance.greedy_accept_tree(tokens, paths, target_logits, backend))


@_greedy_accept_tree.register_fake
def _(tokens, paths, target_logits, backend="auto"):
    return _accept_like(tokens.shape[0], paths.shape[2], tokens.device)


@_op("greedy_accept_chain")
def _greedy_accept_chain(tokens: Tensor, target_logits: Tensor,
                         backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    return _contiguous(*acceptance.greedy_accept_chain(tokens, target_logits, backend))


@_greedy_accept_chain.register_fake
def _(tokens, target_logits, backend="auto"):
    return _accept_like(tokens.shape[0], tokens.shape[1], tokens.device)


@_op("stochastic_accept_tree")
def _stochastic_accept_tree(tokens: Tensor, parents: Tensor, target_logits: Tensor,
                            accept_uniforms: Tensor, bonus_uniforms: Tensor,
                            max_depth: Optional[int] = None, temperature: float = 1.0,
                            top_k: int = 0, top_p: float = 1.0,
                            temperatures: Optional[Tensor] = None,
                            top_ks: Optional[Tensor] = None, top_ps: Optional[Tensor] = None,
                            backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    params = _sampling(temperature, top_k, top_p, temperatures, top_ks, top_ps)
    return _contiguous(*acceptance.stochastic_accept_tree(
        tokens, parents, target_logits, accept_uniforms, bonus_uniforms, max_depth, *params,
        backend=backend))


@_stochastic_accept_tree.register_fake
def _(tokens, parents, target_logits, accept_uniforms, bonus_uniforms, max_depth=None,
      temperature=1.0, top_k=0, top_p=1.0, temperatures=None, top_ks=None, top_ps=None,
      backend="auto"):
    batch, num_nodes = tokens.shape
    width = (num_nodes - 1 if max_depth is None else max_depth) + 1
    return _accept_like(batch, width, tokens.device)


@_op("stochastic_accept_chain")
def _stochastic_accept_chain(tokens: Tensor, draft_probs: Tensor, target_logits: Tensor,
                             accept_uniforms: Tensor, bonus_uniforms: Tensor,
                             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                             temperatures: Optional[Tensor] = None,
                             top_ks: Optional[Tensor] = None, top_ps: Optional[Tensor] = None,
                             backend: str = "auto") -> Tuple[Tensor, Tensor, Tensor]:
    params = _sampling(temperature, top_k, top_p, temperatures, top_ks, top_ps)
    return _contiguous(*acceptance.stochastic_accept_chain(
        tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms, *params,
        backend=backend))


@_stochastic_accept_chain.register_fake
def _(tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms, temperature=1.0,
      top_k=0, top_p=1.0, temperatures=None, top_ks=None, top_ps=None, backend="auto"):
    return _accept_like(tokens.shape[0], tokens.shape[1], tokens.device)


@_op("target_probs")
def _target_probs(logits: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  temperatures: Optional[Tensor] = None, top_ks: Optional[Tensor] = None,
                  top_ps: Optional[Tensor] = None, backend: str = "auto") -> Tensor:
    params = _sampling(temperature, top_k, top_p, temperatures, top_ks, top_ps)
    return sampling.target_probs(logits, *params, backend=backend).contiguous()


@_target_probs.register_fake
def _(logits, temperature=1.0, top_k=0, top_p=1.0, temperatures=None, top_ks=None, top_ps=None,
      backend="auto"):
    return logits.new_empty(logits.shape, dtype=torch.float32)


# ------------------------------------------------------------------------------ KV cache


@_op("compact_kv", mutates_args=("caches",))
def _compact_kv(caches: List[Tensor], cache_lens: Tensor, accepted_nodes: Tensor,
                num_accepted: Tensor, backend: str = "auto") -> None:
    kv.compact_kv(caches, cache_lens, accepted_nodes, num_accepted, backend)


@_compact_kv.register_fake
def _(caches, cache_lens, accepted_nodes, num_accepted, backend="auto"):
    return None


@_op("write_kv", mutates_args=("k_cache", "v_cache"))
def _write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor,
              offset: int = 0, backend: str = "auto") -> None:
    kv.write_kv(k, v, k_cache, v_cache, cache_lens, offset, backend)


@_write_kv.register_fake
def _(k, v, k_cache, v_cache, cache_lens, offset=0, backend="auto"):
    return None


@_op("rope_write_kv", mutates_args=("k_cache", "v_cache"))
def _rope_write_kv(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos: Tensor, sin: Tensor,
                   k_cache: Tensor, v_cache: Tensor, cache_lens: Tensor, offset: int = 0,
                   backend: str = "auto") -> Tensor:
    return kv.rope_write_kv(q, k, v, positions, cos, sin, k_cache, v_cache, cache_lens, offset,
                            backend)


@_rope_write_kv.register_fake
def _(q, k, v, positions, cos, sin, k_cache, v_cache, cache_lens, offset=0, backend="auto"):
    return torch.empty_like(q)


# ------------------------------------------------------------------------------ training loss


@_op("soft_cross_entropy")
def _soft_cross_entropy(draft_logits: Tensor, target_logits: Tensor,
                        backend: str = "auto") -> Tensor:
    with torch.no_grad():
        return loss.soft_cross_entropy(draft_logits, target_logits, backend).contiguous()


@_soft_cross_entropy.register_fake
def _(draft_logits, target_logits, backend="auto"):
    return draft_logits.new_empty(draft_logits.shape[0], dtype=torch.float32)


def _soft_cross_entropy_setup(ctx, inputs, output):
    draft_logits, target_logits, _ = inputs
    ctx.save_for_backward(draft_logits, target_logits)


def _soft_cross_entropy_backward(ctx, grad):
    draft_logits, target_logits = ctx.saved_tensors
    probs = torch.softmax(draft_logits.float(), dim=-1)
    target = torch.softmax(target_logits.float(), dim=-1)
    return ((probs - target) * grad.unsqueeze(-1)).to(draft_logits.dtype), None, None


_soft_cross_entropy.register_autograd(_soft_cross_entropy_backward,
                                      setup_context=_soft_cross_entropy_setup)


# ------------------------------------------------------------------------------ decoder ops


@_op("linear")
def _linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None,
            backend: str = "auto") -> Tensor:
    return decoder.linear(x, weight, bias, backend)


@_linear.register_fake
def _(x, weight, bias=None, backend="auto"):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@_op("linear_group")
def _linear_group(x: Tensor, weights: Sequence[Tensor], biases: Sequence[Optional[Tensor]],
                  backend: str = "auto") -> List[Tensor]:
    return list(decoder.linear_group(x, list(weights), list(biases), backend))


@_linear_group.register_fake
def _(x, weights, biases, backend="auto"):
    return [x.new_empty(*x.shape[:-1], w.shape[0]) for w in weights]


@_op("rms_norm")
def _rms_norm(x: Tensor, weight: Tensor, eps: float, backend: str = "auto") -> Tensor:
    return decoder.rms_norm(x, weight, eps, None, backend)


@_rms_norm.register_fake
def _(x, weight, eps, backend="auto"):
    return torch.empty_like(x)


@_op("rms_norm_residual")
def _rms_norm_residual(x: Tensor, residual: Tensor, weight: Tensor, eps: float,
                       backend: str = "auto") -> Tuple[Tensor, Tensor]:
    return tuple(decoder.rms_norm(x, weight, eps, residual, backend))


@_rms_norm_residual.register_fake
def _(x, residual, weight, eps, backend="auto"):
    return torch.empty_like(x), torch.empty_like(x)


@_op("silu_mul")
def _silu_mul(gate: Tensor, up: Tensor, backend: str = "auto") -> Tensor:
    return decoder.silu_mul(gate, up, backend)


@_silu_mul.register_fake
def _(gate, up, backend="auto"):
    return torch.empty_like(gate)


@_op("apply_rope")
def _apply_rope(x: Tensor, positions: Tensor, cos: Tensor, sin: Tensor,
                backend: str = "auto") -> Tensor:
    return decoder.apply_rope(x, positions, cos, sin, backend)


@_apply_rope.register_fake
def _(x, positions, cos, sin, backend="auto"):
    return torch.empty_like(x)

