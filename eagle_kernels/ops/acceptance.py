"""Acceptance: which drafted tokens the target keeps, plus the bonus token.

Public ops with the contracts of the same-named functions in :mod:`eagle_kernels.ops.reference`:
:func:`greedy_accept_tree`, :func:`greedy_accept_chain`, :func:`stochastic_accept_tree`,
:func:`stochastic_accept_chain` and the target sampling distribution :func:`target_probs`.
Randomness always comes in as tensors of uniform samples, so results are reproducible and the
ops are safe under CUDA-graph capture. Backends: ``torch`` (reference) everywhere; ``cuda``
(``csrc/acceptance.cu``) for greedy tree acceptance, explicit only until proven on a GPU.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import cuda_extension, register, resolve
from ._validate import (FLOAT_DTYPES, check_int, check_logits, check_parents, check_range,
                        check_same_device, check_tensor, check_uniforms, value_checks_enabled)
from .reference import AcceptResult
from .tree import check_max_depth


def _check_tree_logits(tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int, int]:
    check_tensor("tokens", tokens, (torch.int64,), (None, None))
    batch, num_nodes = tokens.shape
    check_int("tokens.shape[1] (tree size N)", num_nodes, 1)
    check_tensor("target_logits", target_logits, FLOAT_DTYPES, (batch, num_nodes, None))
    vocab = target_logits.shape[2]
    check_same_device(tokens=tokens, target_logits=target_logits)
    check_range("tokens", tokens, 0, vocab, " (token ids within the target vocabulary)")
    check_logits("target_logits", target_logits)
    return batch, num_nodes, vocab


def _check_sampling(batch: int, device: torch.device, temperature, top_k, top_p) -> None:
    """Sampling parameters: Python scalars or [B] tensors on the inputs' device."""
    specs = (("temperature", temperature, (torch.float32,)),
             ("top_k", top_k, (torch.int32, torch.int64)),
             ("top_p", top_p, (torch.float32,)))
    for name, value, dtypes in specs:
        if isinstance(value, torch.Tensor):
            check_tensor(name, value, dtypes, (batch,), device)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a number or a [B] tensor, got "
                            f"{type(value).__name__}")
    if not value_checks_enabled():
        return
    if bool(torch.as_tensor(temperature <= 0).any()):
        raise ValueError("temperature: expected > 0 (use the greedy ops for temperature 0)")
    if bool(torch.as_tensor(top_k < 0).any()):
        raise ValueError("top_k: expected >= 0 (0 disables top-k)")
    if bool(torch.as_tensor((top_p <= 0) | (top_p > 1)).any()):
        raise ValueError("top_p: expected values in (0, 1] (1 disables top-p)")


def _check_uniforms(batch: int, num_nodes: int, device, accept_uniforms, bonus_uniforms) -> None:
    check_tensor("accept_uniforms", accept_uniforms, (torch.float32,), (batch, num_nodes), device)
    check_tensor("bonus_uniforms", bonus_uniforms, (torch.float32,), (batch,), device)
    check_uniforms("accept_uniforms", accept_uniforms)
    check_uniforms("bonus_uniforms", bonus_uniforms)


def target_probs(logits, temperature=1.0, top_k=0, top_p=1.0, backend: str = "auto"):
    """The target sampling distribution [R, V] float32 (see :func:`reference.target_probs`)."""
    check_tensor("logits", logits, FLOAT_DTYPES, (None, None))
    check_logits("logits", logits)
    _check_sampling(logits.shape[0], logits.device, temperature, top_k, top_p)
    _, implementation = resolve("target_probs", backend, logits.device)
    return implementation(logits, temperature, top_k, top_p)


def greedy_accept_tree(tokens, paths, target_logits, backend: str = "auto") -> AcceptResult:
    """Greedy tree verification (see :func:`reference.greedy_accept_tree`).

    Parameters
    ----------
    tokens : [B, N] int64;  paths : [B, P, D + 1] int32 (-1 padded);
    target_logits : [B, N, V] float16 / bfloat16 / float32.  All contiguous, one device.
    """
    batch, num_nodes, _ = _check_tree_logits(tokens, target_logits)
    check_tensor("paths", paths, (torch.int32,), (batch, None, None), tokens.device)
    check_int("paths.shape[2] (max_depth + 1)", paths.shape[2], 1)
    check_range("paths", paths, -1, num_nodes, " (node indices, -1 for padding)")
    if value_checks_enabled() and bool((paths[:, :1, 0] != 0).any()):
        raise ValueError("paths: expected row 0 of every tree to start at the root (node 0); "
                         "build_tree always emits at least one root-to-leaf row")
    _, implementation = resolve("greedy_accept_tree", backend, tokens.device)
    return implementation(tokens, paths, target_logits)


def greedy_accept_chain(tokens, target_logits, backend: str = "auto") -> AcceptResult:
    """Greedy chain verification: tokens [B, N] int64 (node 0 the root), logits [B, N, V]."""
    _check_tree_logits(tokens, target_logits)
    _, implementation = resolve("greedy_accept_chain", backend, tokens.device)
    return implementation(tokens, target_logits)


def stochastic_accept_tree(tokens, parents, target_logits, accept_uniforms, bonus_uniforms,
                           max_depth: int | None = None, temperature=1.0, top_k=0, top_p=1.0,
                           backend: str = "auto") -> AcceptResult:
    """Lossless rejection sampling over top-k draft trees (see
    :func:`reference.stochastic_accept_tree` for shapes and the exact procedure)."""
    batch, num_nodes, _ = _check_tree_logits(tokens, target_logits)
    check_tensor("parents", parents, (torch.int32,), (batch, num_nodes), tokens.device)
    check_parents("parents", parents)
    max_depth = check_max_depth(parents, max_depth)
    _check_uniforms(batch, num_nodes, tokens.device, accept_uniforms, bonus_uniforms)
    _check_sampling(batch, tokens.device, temperature, top_k, top_p)
    _, implementation = resolve("stochastic_accept_tree", backend, tokens.device)
    return implementation(tokens, parents, target_logits, accept_uniforms, bonus_uniforms,
                          max_depth, temperature, top_k, top_p)


def stochastic_accept_chain(tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms,
                            temperature=1.0, top_k=0, top_p=1.0,
                            backend: str = "auto") -> AcceptResult:
    """Speculative sampling of chains with draft probabilities q (see
    :func:`reference.stochastic_accept_chain` for shapes and the exact procedure)."""
    batch, num_nodes, vocab = _check_tree_logits(tokens, target_logits)
    check_tensor("draft_probs", draft_probs, (torch.float32,), (batch, num_nodes - 1, vocab),
                 tokens.device)
    if value_checks_enabled() and bool(((draft_probs < 0) | draft_probs.isnan()).any()):
        raise ValueError("draft_probs: expected non-negative probabilities, got negative or NaN")
    _check_uniforms(batch, num_nodes, tokens.device, accept_uniforms, bonus_uniforms)
    _check_sampling(batch, tokens.device, temperature, top_k, top_p)
    _, implementation = resolve("stochastic_accept_chain", backend, tokens.device)
    return implementation(tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms,
                          temperature, top_k, top_p)


_LOGIT_DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def _greedy_accept_tree_cuda(tokens, paths, target_logits) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    _, num_paths, width = paths.shape
    device = tokens.device
    stream = torch.cuda.current_stream(device).cuda_stream
    extension = cuda_extension()
    target_ids = torch.empty(batch, num_nodes, dtype=torch.int64, device=device)
    extension.argmax_rows(target_logits.data_ptr(), target_ids.data_ptr(), batch * num_nodes,
                          vocab, _LOGIT_DTYPE_CODES[target_logits.dtype], stream)
    result = AcceptResult(torch.empty(batch, width, dtype=torch.int64, device=device),
                          torch.empty(batch, dtype=torch.int32, device=device),
                          torch.empty(batch, width, dtype=torch.int32, device=device))
    extension.greedy_accept_paths(tokens.data_ptr(), paths.data_ptr(), target_ids.data_ptr(),
                                  result.output_tokens.data_ptr(), result.num_accepted.data_ptr(),
                                  result.accepted_nodes.data_ptr(), batch, num_nodes, num_paths,
                                  width, stream)
    return result


register("target_probs", "torch", reference.target_probs)
register("greedy_accept_tree", "torch", reference.greedy_accept_tree)
register("greedy_accept_tree", "cuda", _greedy_accept_tree_cuda, auto=False)
register("greedy_accept_chain", "torch", reference.greedy_accept_chain)
register("stochastic_accept_tree", "torch", reference.stochastic_accept_tree)
register("stochastic_accept_chain", "torch", reference.stochastic_accept_chain)
