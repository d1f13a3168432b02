"""Acceptance: which drafted tokens the target keeps, plus the bonus token.

Public ops with the contracts of the same-named functions in :mod:`eagle_kernels.ops.reference`:
:func:`greedy_accept_tree`, :func:`greedy_accept_chain`, :func:`stochastic_accept_tree`,
:func:`stochastic_accept_chain` and the target sampling distribution :func:`target_probs`.
Randomness always comes in as tensors of uniform samples, so results are reproducible and the
ops are safe under CUDA-graph capture. Backends: ``torch`` (reference) everywhere; ``cuda``
(``csrc/acceptance.cu`` greedy, ``csrc/sampling.cu`` stochastic and target_probs) and
``triton`` (this file and :mod:`eagle_kernels.ops.sampling`) for every op; ``cpu``
(``csrc/cpu/acceptance.h``) for the greedy ops, what ``auto`` runs on CPU. GPU kernels are
explicit only (``auto=False``) until proven against the reference on a GPU.

Triton kernels (no host syncs, one program per row, per sequence or per vocabulary chunk):

* greedy: ``_argmax_kernel`` (one program per node row: blockwise max, lowest index on ties),
  then ``_greedy_paths_kernel`` (one program per sequence: every path row scored at once as a
  [P, W] tile, first mismatch = accepted length, best row by argmax, outputs as vectors).
* stochastic: the temperature / top-k / top-p statistics of every node row, sort-free
  (:func:`sampling.row_stats_triton`), then one program per sequence decides with O(1) token
  probabilities (the tree walked in ascending node order; a chain's nodes all at once) and
  leaves the bonus row, which :func:`sampling.draw_bonus` samples by an inverse CDF over
  2048-entry chunks (one program per chunk, then one per sequence).
"""

from __future__ import annotations

import torch

from . import reference
from .sampling import (LOGIT_DTYPE_CODES, check_sampling, row_stats_cuda, row_stats_triton,
                       draw_bonus, temperature_args, token_prob, vocab_block)
from ._backend import (cpu_extension, cuda_extension, cuda_limit, cuda_stream, register,
                       resolve)
from ._triton import tl, triton
from ._validate import (FLOAT_DTYPES, check_int, check_logits, check_parents, check_range,
                        check_same_device, check_tensor, check_uniforms, first_found,
                        value_checks_enabled)
from .reference import AcceptResult
from .tree import check_max_depth


def _check_tree_logits(tokens: torch.Tensor,
                       target_logits: torch.Tensor) -> tuple[int, int, int, torch.Tensor | None]:
    """(B, N, V, the logits' row maxima where value checks ran)."""
    check_tensor("tokens", tokens, (torch.int64,), (None, None))
    batch, num_nodes = tokens.shape
    check_int("tokens.shape[1] (tree size N)", num_nodes, 1)
    check_tensor("target_logits", target_logits, FLOAT_DTYPES, (batch, num_nodes, None))
    vocab = target_logits.shape[2]
    check_same_device(tokens=tokens, target_logits=target_logits)
    check_range("tokens", tokens, 0, vocab, " (token ids within the target vocabulary)")
    return batch, num_nodes, vocab, check_logits("target_logits", target_logits)


def _check_uniforms(batch: int, num_nodes: int, device, accept_uniforms, bonus_uniforms) -> None:
    check_tensor("accept_uniforms", accept_uniforms, (torch.float32,), (batch, num_nodes), device)
    check_tensor("bonus_uniforms", bonus_uniforms, (torch.float32,), (batch,), device)
    check_uniforms("accept_uniforms", accept_uniforms)
    check_uniforms("bonus_uniforms", bonus_uniforms)


def _check_path_rows(paths) -> None:
    """Every row a root-to-leaf path as build_tree emits them (the root, then strictly
    increasing node indices: a parent's index is below its child's), then -1 padding; row 0
    of every tree a path, a later row possibly all padding. A row that broke this would be
    accepted as given: a path starting elsewhere, or one node's token taken twice."""
    bad = paths[:, :1, 0] != 0  # [B, 1]: nothing to check in a tree of no rows
    if bool(bad.any()):
        tree = int(torch.nonzero(bad)[0, 0])
        raise ValueError("paths: expected row 0 of every tree to start at the root (node 0); "
                         "build_tree always emits at least one root-to-leaf row; got paths["
                         f"{tree}, 0] = {paths[tree, 0].tolist()}")
    used = paths >= 0
    for bad, expected in (
            (used[..., 0] & (paths[..., 0] != 0),
             "every row to start at the root (node 0) or be all -1 padding"),
            ((used[..., 1:] & ~used[..., :-1]).any(-1),
             "a row's -1 padding after its nodes, never between"),
            (((paths[..., 1:] <= paths[..., :-1]) & used[..., 1:]).any(-1),
             "strictly increasing node indices along a row (a parent's index is below its "
             "child's)")):
        if bool(bad.any()):
            tree, row = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"paths: expected {expected}; got paths[{tree}, {row}] = "
                             f"{paths[tree, row].tolist()}")


def greedy_accept_tree(tokens, paths, target_logits, backend: str = "auto") -> AcceptResult:
    """Greedy tree verification (see :func:`reference.greedy_accept_tree`).

    Parameters
    ----------
    tokens : [B, N] int64;  paths : [B, P, D + 1] int32 (-1 padded);
    target_logits : [B, N, V] float16 / bfloat16 / float32.  All contiguous, one device.
    """
    batch, num_nodes, _, _ = _check_tree_logits(tokens, target_logits)
    check_tensor("paths", paths, (torch.int32,), (batch, None, None), tokens.device)
    check_int("paths.shape[1] (path count)", paths.shape[1], 1)
    check_int("paths.shape[2] (max_depth + 1)", paths.shape[2], 1)
    check_range("paths", paths, -1, num_nodes, " (node indices, -1 for padding)")
    if value_checks_enabled():
        _check_path_rows(paths)
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
    batch, num_nodes, _, row_max = _check_tree_logits(tokens, target_logits)
    check_tensor("parents", parents, (torch.int32,), (batch, num_nodes), tokens.device)
    check_parents("parents", parents)
    max_depth = check_max_depth(parents, max_depth)
    _check_uniforms(batch, num_nodes, tokens.device, accept_uniforms, bonus_uniforms)
    check_sampling(batch, tokens.device, temperature, top_k, top_p, row_max)
    _, implementation = resolve("stochastic_accept_tree", backend, tokens.device,
                                num_nodes=num_nodes)
    return implementation(tokens, parents, target_logits, accept_uniforms, bonus_uniforms,
                          max_depth, temperature, top_k, top_p)


def stochastic_accept_chain(tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms,
                            temperature=1.0, top_k=0, top_p=1.0,
                            backend: str = "auto") -> AcceptResult:
    """Speculative sampling of chains with draft probabilities q (see
    :func:`reference.stochastic_accept_chain` for shapes and the exact procedure)."""
    batch, num_nodes, vocab, row_max = _check_tree_logits(tokens, target_logits)
    check_tensor("draft_probs", draft_probs, (torch.float32,), (batch, num_nodes - 1, vocab),
                 tokens.device)
    if value_checks_enabled():
        bad = (draft_probs < 0) | draft_probs.isnan()
        if bool(bad.any()):
            raise ValueError("draft_probs: expected non-negative probabilities, "
                             f"{first_found(draft_probs, bad)}")
    _check_uniforms(batch, num_nodes, tokens.device, accept_uniforms, bonus_uniforms)
    check_sampling(batch, tokens.device, temperature, top_k, top_p, row_max)
    _, implementation = resolve("stochastic_accept_chain", backend, tokens.device,
                                num_nodes=num_nodes)
    return implementation(tokens, draft_probs, target_logits, accept_uniforms, bonus_uniforms,
                          temperature, top_k, top_p)


def _empty_outputs(batch: int, width: int, device) -> AcceptResult:
    """Uninitialised AcceptResult buffers of widths ``width`` that a kernel fills."""
    return AcceptResult(torch.empty(batch, width, dtype=torch.int64, device=device),
                        torch.empty(batch, dtype=torch.int32, device=device),
                        torch.empty(batch, width, dtype=torch.int32, device=device))


def _greedy_accept_tree_cuda(tokens, paths, target_logits) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    _, num_paths, width = paths.shape
    device = tokens.device
    stream = cuda_stream(device)
    extension = cuda_extension()
    target_ids = torch.empty(batch, num_nodes, dtype=torch.int64, device=device)
    extension.argmax_rows(target_logits.data_ptr(), target_ids.data_ptr(), batch * num_nodes,
                          vocab, LOGIT_DTYPE_CODES[target_logits.dtype], stream)
    result = _empty_outputs(batch, width, device)
    extension.greedy_accept_paths(tokens.data_ptr(), paths.data_ptr(), target_ids.data_ptr(),
                                  result.output_tokens.data_ptr(), result.num_accepted.data_ptr(),
                                  result.accepted_nodes.data_ptr(), batch, num_nodes, num_paths,
                                  width, stream)
    return result


def _chain_as_tree(greedy_accept_tree_impl):
    """greedy_accept_chain from a backend's greedy_accept_tree: a chain is a tree with one
    path 0..N-1, so the tree kernels run with that paths tensor."""
    def greedy_accept_chain_impl(tokens, target_logits) -> AcceptResult:
        batch, num_nodes = tokens.shape
        paths = reference.chain_paths(batch, num_nodes, tokens.device).contiguous()
        return greedy_accept_tree_impl(tokens, paths, target_logits)
    return greedy_accept_chain_impl


def _stochastic_cuda_supports(num_nodes, **_) -> str | None:
    most = cuda_limit("STOCHASTIC_ACCEPT_MAX_NODES")  # per-node shared memory of the kernels
    if most and num_nodes > most:
        return (f"tokens: expected at most {most} nodes (_C.STOCHASTIC_ACCEPT_MAX_NODES), got "
                f"{num_nodes}")
    return None


def _stochastic_accept_tree_cuda(tokens, parents, target_logits, accept_uniforms,
                                 bonus_uniforms, max_depth, temperature, top_k,
                                 top_p) -> AcceptResult:
    """Row stats of every node row, then one block per sequence (csrc/sampling.cu)."""
    batch, num_nodes, vocab = target_logits.shape
    result = _empty_outputs(batch, max_depth + 1, tokens.device)
    if batch:
        temperature, stats = row_stats_cuda(target_logits, temperature, top_k, top_p)
        cuda_extension().stochastic_accept_tree(
            tokens.data_ptr(), parents.data_ptr(), target_logits.data_ptr(),
            accept_uniforms.data_ptr(), bonus_uniforms.data_ptr(),
            *(s.data_ptr() for s in stats), temperature.data_ptr(),
            *(r.data_ptr() for r in result), batch, num_nodes, vocab, max_depth + 1,
            LOGIT_DTYPE_CODES[target_logits.dtype],
            cuda_stream(tokens.device))
    return result


def _stochastic_accept_chain_cuda(tokens, draft_probs, target_logits, accept_uniforms,
                                  bonus_uniforms, temperature, top_k, top_p) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    result = _empty_outputs(batch, num_nodes, tokens.device)
    if batch:
        temperature, stats = row_stats_cuda(target_logits, temperature, top_k, top_p)
        cuda_extension().stochastic_accept_chain(
            tokens.data_ptr(), draft_probs.data_ptr(), target_logits.data_ptr(),
            accept_uniforms.data_ptr(), bonus_uniforms.data_ptr(),
            *(s.data_ptr() for s in stats), temperature.data_ptr(),
            *(r.data_ptr() for r in result), batch, num_nodes, vocab,
            LOGIT_DTYPE_CODES[target_logits.dtype],
            cuda_stream(tokens.device))
    return result


# --------------------------------------------------------------------------------------------
# Triton: greedy acceptance
# --------------------------------------------------------------------------------------------


@triton.jit
def _argmax_kernel(logits_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    """out[row] = argmax of logits[row] (ties: lowest index; a block only replaces the running
    best when strictly larger, and tl.argmax breaks ties to the left)."""
    row = tl.program_id(0).to(tl.int64)
    best = tl.full([], float("-inf"), tl.float32)
    best_index = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(logits_ptr + row * vocab + offs, mask=offs < vocab,
                    other=float("-inf")).to(tl.float32)
        block_best = tl.max(x, 0)
        block_index = start + tl.argmax(x, 0, tie_break_left=True).to(tl.int64)
        better = block_best > best
        best_index = tl.where(better, block_index, best_index)
        best = tl.where(better, block_best, best)
    tl.store(out_ptr + row, best_index)


@triton.jit
def _greedy_paths_kernel(tokens_ptr, paths_ptr, target_ptr, out_tokens_ptr, num_acc_ptr,
                         out_nodes_ptr, num_nodes, num_paths, width, BLOCK_P: tl.constexpr,
                         BLOCK_W: tl.constexpr):
    """One program per sequence: score all path rows as a [P, W] tile, keep the best."""
    b = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, BLOCK_P)[:, None]
    cols = tl.arange(0, BLOCK_W)[None, :]
    base = paths_ptr + b * num_paths * width + rows * width
    here = tl.load(base + cols, mask=(rows < num_paths) & (cols < width - 1), other=-1)
    after = tl.load(base + cols + 1, mask=(rows < num_paths) & (cols < width - 1), other=-1)
    seq_tokens = tokens_ptr + b * num_nodes
    seq_targets = target_ptr + b * num_nodes
    # Path entries outside [0, N) end a path and are never used as addresses (with value checks
    # off nothing else stops them), like acceptance::is_node in csrc/acceptance.cuh.
    here_ok = (here >= 0) & (here < num_nodes)
    after_ok = (after >= 0) & (after < num_nodes)
    predicted = tl.load(seq_targets + tl.where(here_ok, here, 0), mask=here_ok, other=-1)
    drafted = tl.load(seq_tokens + tl.where(after_ok, after, 0), mask=after_ok, other=-2)
    match = here_ok & after_ok & (drafted == predicted)
    # accepted length = first mismatching column (columns past width - 2 never match)
    length = tl.min(tl.where(match, BLOCK_W, cols), 1)
    first = tl.load(paths_ptr + b * num_paths * width + tl.arange(0, BLOCK_P) * width,
                    mask=tl.arange(0, BLOCK_P) < num_paths, other=-1)
    length = tl.where((first >= 0) & (first < num_nodes), length, -1)
    length = tl.where(tl.arange(0, BLOCK_P) < num_paths, length, -2)
    best = tl.argmax(length, 0, tie_break_left=True)
    accepted = tl.maximum(tl.max(length, 0), 0)
    j = tl.arange(0, BLOCK_W)
    row_ok = tl.minimum(num_paths, 1) * tl.where(tl.max(length, 0) >= 0, 1, 0)
    path = tl.load(paths_ptr + b * num_paths * width + best * width + j,
                   mask=j < width * row_ok, other=-1)
    # no valid row at all: "root only", like the CUDA kernel (a valid row keeps its path[0])
    path = tl.where((j == 0) & (row_ok == 0), 0, path)
    nodes = tl.where(j <= accepted, path, -1)
    next_node = tl.load(paths_ptr + b * num_paths * width + best * width + j + 1,
                        mask=j < tl.minimum(accepted, width - 1), other=0)
    drafted = tl.load(seq_tokens + tl.maximum(next_node, 0))
    last = tl.sum(tl.where(j == accepted, nodes, 0), 0)
    bonus = tl.load(seq_targets + last)
    out = tl.where(j < accepted, drafted, tl.where(j == accepted, bonus, -1))
    tl.store(out_tokens_ptr + b * width + j, out, mask=j < width)
    tl.store(out_nodes_ptr + b * width + j, nodes, mask=j < width)
    tl.store(num_acc_ptr + b, accepted)


def _argmax_triton(target_logits) -> torch.Tensor:
    batch, num_nodes, vocab = target_logits.shape
    target_ids = torch.empty(batch, num_nodes, dtype=torch.int64, device=target_logits.device)
    if target_ids.numel():
        _argmax_kernel[(batch * num_nodes,)](target_logits, target_ids, vocab,
                                             BLOCK=vocab_block(vocab))
    return target_ids


def _greedy_accept_tree_triton(tokens, paths, target_logits) -> AcceptResult:
    batch, num_nodes, _ = target_logits.shape
    _, num_paths, width = paths.shape
    target_ids = _argmax_triton(target_logits)
    result = _empty_outputs(batch, width, tokens.device)
    if batch:
        _greedy_paths_kernel[(batch,)](
            tokens, paths, target_ids, *result, num_nodes, num_paths, width,
            BLOCK_P=triton.next_power_of_2(max(num_paths, 1)),
            BLOCK_W=triton.next_power_of_2(width + 1))
    return result


# --------------------------------------------------------------------------------------------
# Triton: stochastic acceptance
# --------------------------------------------------------------------------------------------


@triton.jit
def _node_probs(tokens, rows, logits_ptr, m_ptr, kkey_ptr, tau_ptr, z_ptr, t, vocab, valid):
    """p(token of node i) under row rows[i], for all nodes at once: the walk below then runs on
    registers instead of one dependent global load per node."""
    m = tl.load(m_ptr + rows, mask=valid, other=0.0)
    kkey = tl.load(kkey_ptr + rows, mask=valid, other=0)
    tau = tl.load(tau_ptr + rows, mask=valid, other=0.0)
    z = tl.load(z_ptr + rows, mask=valid, other=1.0)
    # a lane that is no node gets token -1, which token_prob reads nothing for: its row may lie
    # past the logits (the chain's padding lanes j >= num_nodes address rows seq + j - 1)
    tokens = tl.where(valid, tokens, -1)
    return tl.where(valid, token_prob(logits_ptr + rows * vocab, tokens, vocab, t, m, kkey, tau,
                                      z), 0.0)


@triton.jit
def _stochastic_tree_kernel(tokens_ptr, parents_ptr, logits_ptr, accept_u_ptr, m_ptr, kkey_ptr,
                            tau_ptr, z_ptr, temp_ptr, temp, out_tokens_ptr, num_acc_ptr,
                            out_nodes_ptr, bonus_row_ptr, removed_ptr, num_removed_ptr,
                            num_nodes, vocab, width, TEMP_PER_ROW: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program per sequence. A child is only ever tried under its parent's distribution, so
    every node's p(token) is gathered up front. Children have larger indices than their parent,
    so one ascending scan visits, in order, exactly the children of the current node: child x
    is accepted iff u * (1 - removed mass) < p(x) (the reference's renormalised residual), else
    p(x) joins the removed set (a token already removed is rejected outright)."""
    b = tl.program_id(0).to(tl.int64)
    t = temp
    if TEMP_PER_ROW:  # inline, not a jit helper: cheaper in the interpreter
        t = tl.load(temp_ptr + b)
    slot = tl.arange(0, BLOCK_N)
    valid = slot < num_nodes
    seq = b * num_nodes
    tokens = tl.load(tokens_ptr + seq + slot, mask=valid, other=0)
    parents = tl.load(parents_ptr + seq + slot, mask=valid, other=-1)
    uniforms = tl.load(accept_u_ptr + seq + slot, mask=valid, other=1.0)
    # a parent outside [0, i) is never the current node (which is always < i), so its row is
    # never needed; masking it keeps out-of-contract parents from addressing other rows
    parent_ok = valid & (slot > 0) & (parents >= 0) & (parents < slot)
    probs = _node_probs(tokens, seq + tl.where(parent_ok, parents, 0), logits_ptr, m_ptr,
                        kkey_ptr, tau_ptr, z_ptr, t, vocab, parent_ok)
    j = tl.arange(0, BLOCK_W)
    out = tl.full([BLOCK_W], -1, tl.int64)
    nodes = tl.where(j == 0, 0, -1)
    removed = tl.full([BLOCK_N], -1, tl.int64)
    num_removed = tl.full([], 0, tl.int32)
    removed_mass = tl.full([], 0.0, tl.float32)
    cur = tl.full([], 0, tl.int32)
    accepted = tl.full([], 0, tl.int32)
    stopped = tl.full([], 0, tl.int1)
    for i in range(1, num_nodes):
        # node i's values out of the register vectors (masked sums; inline rather than a jit
        # helper, which the interpreter pays for per call)
        token = tl.sum(tl.where(slot == i, tokens, 0), 0)
        p = tl.sum(tl.where(slot == i, probs, 0), 0)
        u = tl.sum(tl.where(slot == i, uniforms, 0), 0)
        tried = (~stopped) & (tl.sum(tl.where(slot == i, parents, 0), 0) == cur)
        gone = tl.sum((removed == token).to(tl.int32), 0) > 0
        wins = tried & (~gone) & (u * (1.0 - removed_mass) < p)
        # a tree deeper than max_depth (outside the contract) stops the walk where the outputs
        # are full, exactly like csrc/sampling.cuh tree_walk's `accepted + 1 >= width` break
        full = wins & (accepted + 1 >= width)
        stopped = stopped | full
        accept = wins & (~full)
        fresh = tried & (~wins) & (~gone)
        removed = tl.where((slot == num_removed) & fresh, token, removed)
        removed_mass = tl.where(fresh, removed_mass + p, removed_mass)
        num_removed = tl.where(fresh, num_removed + 1, num_removed)
        out = tl.where((j == accepted) & accept, token, out)
        nodes = tl.where((j == accepted + 1) & accept, i, nodes)
        accepted = tl.where(accept, accepted + 1, accepted)
        cur = tl.where(accept, i, cur)
        removed = tl.where(accept, -1, removed)
        num_removed = tl.where(accept, 0, num_removed)
        removed_mass = tl.where(accept, 0.0, removed_mass)
    tl.store(out_tokens_ptr + b * width + j, out, mask=j < width)
    tl.store(out_nodes_ptr + b * width + j, nodes, mask=j < width)
    tl.store(num_acc_ptr + b, accepted)
    # the bonus draw (sampling.draw_bonus): the final node's target minus the removed tokens
    tl.store(bonus_row_ptr + b, seq + cur)
    tl.store(removed_ptr + b * BLOCK_N + slot, removed)
    tl.store(num_removed_ptr + b, num_removed)


@triton.jit
def _stochastic_chain_kernel(tokens_ptr, draft_ptr, logits_ptr, accept_u_ptr, m_ptr, kkey_ptr,
                             tau_ptr, z_ptr, temp_ptr, temp, out_tokens_ptr, num_acc_ptr,
                             out_nodes_ptr, bonus_row_ptr, q_row_ptr, num_nodes, vocab,
                             TEMP_PER_ROW: tl.constexpr, BLOCK_W: tl.constexpr):
    """One program per sequence: node i accepted iff u * q(x) < p(x) with p the target at node
    i - 1, so the accepted count is the first rejected node - 1, all nodes decided at once.
    The bonus row (sampling.draw_bonus): that node's parent with residual max(0, p - q) at a
    rejection, else the last node's target. Outputs but the bonus token are written here."""
    b = tl.program_id(0).to(tl.int64)
    t = temp
    if TEMP_PER_ROW:
        t = tl.load(temp_ptr + b)
    j = tl.arange(0, BLOCK_W)
    drafted = (j > 0) & (j < num_nodes)
    seq = b * num_nodes
    tokens = tl.load(tokens_ptr + seq + j, mask=drafted, other=0)
    uniforms = tl.load(accept_u_ptr + seq + j, mask=drafted, other=1.0)
    probs = _node_probs(tokens, seq + tl.maximum(j - 1, 0), logits_ptr, m_ptr, kkey_ptr,
                        tau_ptr, z_ptr, t, vocab, drafted)
    q_rows = b * (num_nodes - 1) + tl.maximum(j - 1, 0)
    # a token outside the vocabulary reads no q (and gets p = 0 from token_prob)
    in_vocab = drafted & (tokens >= 0) & (tokens < vocab)
    draft = tl.load(draft_ptr + q_rows * vocab + tl.where(in_vocab, tokens, 0), mask=in_vocab,
                    other=0.0)
    rejected = drafted & ~(uniforms * draft < probs)
    first_rejected = tl.min(tl.where(rejected, j, num_nodes), 0)
    accepted = first_rejected - 1
    out = tl.load(tokens_ptr + seq + j + 1, mask=j < accepted, other=-1)
    tl.store(out_tokens_ptr + seq + j, out, mask=j < num_nodes)
    tl.store(out_nodes_ptr + seq + j, tl.where(j <= accepted, j, -1), mask=j < num_nodes)
    tl.store(num_acc_ptr + b, accepted)
    tl.store(bonus_row_ptr + b, seq + accepted)
    tl.store(q_row_ptr + b, tl.where(first_rejected < num_nodes, b * (num_nodes - 1) + accepted,
                                     -1))


def _stochastic_accept_tree_triton(tokens, parents, target_logits, accept_uniforms,
                                   bonus_uniforms, max_depth, temperature, top_k,
                                   top_p) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    width = max_depth + 1
    result = _empty_outputs(batch, width, tokens.device)
    if batch == 0:
        return result
    logits = target_logits.view(batch * num_nodes, vocab)
    stats = row_stats_triton(logits, num_nodes, temperature, top_k, top_p)
    block_n = triton.next_power_of_2(num_nodes)
    bonus_rows = torch.empty(batch, dtype=torch.int64, device=tokens.device)
    removed = torch.empty(batch, block_n, dtype=torch.int64, device=tokens.device)
    num_removed = torch.empty(batch, dtype=torch.int32, device=tokens.device)
    _stochastic_tree_kernel[(batch,)](
        tokens, parents, target_logits, accept_uniforms, *stats,
        out_tokens_ptr=result.output_tokens, num_acc_ptr=result.num_accepted,
        out_nodes_ptr=result.accepted_nodes, bonus_row_ptr=bonus_rows, removed_ptr=removed,
        num_removed_ptr=num_removed, num_nodes=num_nodes, vocab=vocab, width=width,
        BLOCK_N=block_n, BLOCK_W=triton.next_power_of_2(width),
        **temperature_args(temperature, target_logits))
    draw_bonus(logits, None, stats, bonus_rows, None, bonus_uniforms, result, temperature,
               removed, num_removed)
    return result


def _stochastic_accept_chain_triton(tokens, draft_probs, target_logits, accept_uniforms,
                                    bonus_uniforms, temperature, top_k, top_p) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    result = _empty_outputs(batch, num_nodes, tokens.device)
    if batch == 0:
        return result
    logits = target_logits.view(batch * num_nodes, vocab)
    stats = row_stats_triton(logits, num_nodes, temperature, top_k, top_p)
    bonus_rows, q_rows = torch.empty(2, batch, dtype=torch.int64, device=tokens.device)
    _stochastic_chain_kernel[(batch,)](
        tokens, draft_probs, target_logits, accept_uniforms, *stats,
        out_tokens_ptr=result.output_tokens, num_acc_ptr=result.num_accepted,
        out_nodes_ptr=result.accepted_nodes, bonus_row_ptr=bonus_rows, q_row_ptr=q_rows,
        num_nodes=num_nodes, vocab=vocab, BLOCK_W=triton.next_power_of_2(num_nodes),
        **temperature_args(temperature, target_logits))
    draw_bonus(logits, draft_probs, stats, bonus_rows, q_rows, bonus_uniforms, result,
               temperature)
    return result


# --------------------------------------------------------------------------------------------
# CPU kernels (csrc/cpu/acceptance.h): greedy acceptance, what auto runs on CPU
# --------------------------------------------------------------------------------------------

def _greedy_accept_tree_cpu(tokens, paths, target_logits) -> AcceptResult:
    batch, num_nodes, vocab = target_logits.shape
    _, num_paths, width = paths.shape
    logits = target_logits.float().contiguous()  # fp16 / bf16 upcast exactly: the same argmax
    target_ids = torch.empty(batch, num_nodes, dtype=torch.int64, device=tokens.device)
    result = _empty_outputs(batch, width, tokens.device)
    cpu_extension().greedy_accept(logits.data_ptr(), tokens.data_ptr(), paths.data_ptr(),
                                  target_ids.data_ptr(), [t.data_ptr() for t in result], batch,
                                  num_nodes, vocab, num_paths, width)
    return result


register("greedy_accept_tree", "cpu", _greedy_accept_tree_cpu)
register("greedy_accept_chain", "cpu", _chain_as_tree(_greedy_accept_tree_cpu))
register("greedy_accept_tree", "torch", reference.greedy_accept_tree)
register("greedy_accept_tree", "cuda", _greedy_accept_tree_cuda, auto=False)
register("greedy_accept_tree", "triton", _greedy_accept_tree_triton, auto=False)
register("greedy_accept_chain", "torch", reference.greedy_accept_chain)
register("greedy_accept_chain", "cuda", _chain_as_tree(_greedy_accept_tree_cuda), auto=False)
register("greedy_accept_chain", "triton", _chain_as_tree(_greedy_accept_tree_triton),
         auto=False)
register("stochastic_accept_tree", "torch", reference.stochastic_accept_tree)
register("stochastic_accept_tree", "cuda", _stochastic_accept_tree_cuda, auto=False,
         supports=_stochastic_cuda_supports)
register("stochastic_accept_tree", "triton", _stochastic_accept_tree_triton, auto=False)
register("stochastic_accept_chain", "torch", reference.stochastic_accept_chain)
register("stochastic_accept_chain", "cuda", _stochastic_accept_chain_cuda, auto=False,
         supports=_stochastic_cuda_supports)
register("stochastic_accept_chain", "triton", _stochastic_accept_chain_triton, auto=False)
