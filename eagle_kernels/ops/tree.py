"""Tree construction: parents -> depth, packed ancestor mask, root-to-leaf paths.

Public ops :func:`build_tree` and :func:`eagle2_rerank`, with the contracts of the same-named
functions in :mod:`eagle_kernels.ops.reference`.
Backends: ``torch`` (reference), ``cuda`` (``csrc/tree.cu``), ``triton`` (below) and ``cpu``
(``csrc/cpu/tree.h``, what ``auto`` runs on CPU); the GPU kernels are explicit only until they
have been proven on a GPU.

Triton kernel (one program per tree, N <= :data:`TRITON_MAX_NODES`): :func:`tree_body` walks
every node's ancestor chain at once (a vector of N cursors stepping to their parents until all
reach the root), which gives depth and the packed mask rows in one walk; leaf flags come from a
scatter of zeros at every parent index into a small workspace, leaf rows from a cumsum of the
flags, and a second walk from the leaves writes the paths. :func:`eagle2_rerank` (top N - 1
candidates -> a whole draft tree) lives here too: its Triton kernel ranks the candidates with
the top-k machinery of :mod:`eagle_kernels.ops.topk` and ends with the same :func:`tree_body`,
and its CUDA kernel is in ``csrc/tree.cu``, so a whole draft tree is built in one launch. Invalid parents (outside ``[0, node)``) end a walk as if at the root: no
access leaves its row, as in the CUDA kernel.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import (cpu_extension, cuda_extension, cuda_limit, cuda_stream, register,
                       resolve)
from ._triton import tl, triton
from ._validate import (check_int, check_parents, check_range, check_same_device, check_tensor,
                        first_found, value_checks_enabled)
from .reference import DraftTree
from .topk import NO_KEY, cpu_select_supports, order_key, rank_rows


def tree_depth(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] int64 depth of every node of topologically ordered trees (root 0)."""
    depth = torch.zeros(parents.shape, dtype=torch.int64, device=parents.device)
    for node in range(1, parents.shape[1]):
        depth[:, node] = depth.gather(1, parents[:, node:node + 1].long()).squeeze(1) + 1
    return depth


def pack_tree_mask(dense: torch.Tensor) -> torch.Tensor:
    """[..., K] bool visibility -> [..., ceil(K / 32)] int32 words, key j bit j % 32 of word
    j // 32 (checked :func:`reference.pack_tree_mask`)."""
    check_tensor("dense", dense, (torch.bool,), contiguous=False)
    if dense.dim() < 1:
        raise ValueError("dense: expected shape [..., num_keys], got a 0-d tensor")
    return reference.pack_tree_mask(dense)


def unpack_tree_mask(packed: torch.Tensor, num_keys: int) -> torch.Tensor:
    """[..., W] int32 words -> [..., num_keys] bool, num_keys <= 32 W (checked
    :func:`reference.unpack_tree_mask`)."""
    check_tensor("packed", packed, (torch.int32,), contiguous=False)
    if packed.dim() < 1:
        raise ValueError("packed: expected shape [..., words], got a 0-d tensor")
    check_int("num_keys", num_keys, 0, packed.shape[-1] * reference.MASK_WORD_BITS)
    return reference.unpack_tree_mask(packed, num_keys)


def check_max_depth(parents: torch.Tensor, max_depth: int | None) -> int:
    """Resolve ``max_depth`` (default N - 1) and, with value checks on, that trees fit in it."""
    num_nodes = parents.shape[1]
    # A tree of N nodes is at most N - 1 deep; a larger bound only pads the paths with -1
    # (fixed shapes), up to MAX_PADDED_DEPTH: a typo must not size a buffer of petabytes.
    max_depth = check_int("max_depth", num_nodes - 1 if max_depth is None else max_depth, 0,
                          max(num_nodes - 1, MAX_PADDED_DEPTH))
    if value_checks_enabled() and num_nodes > 1 and parents.shape[0]:
        deepest = int(tree_depth(parents).max())
        if deepest > max_depth:
            raise ValueError(f"max_depth: expected >= the tree depth {deepest}, got {max_depth}")
    return max_depth


def build_tree(
    parents: torch.Tensor, max_depth: int | None = None, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth, packed ancestor mask and paths of a batch of trees.

    Parameters
    ----------
    parents : torch.Tensor
        [B, N] int32, contiguous; ``parents[:, 0] == -1``, ``0 <= parents[b, i] < i``.
    max_depth : int, optional
        D, default N - 1; must be >= every node's depth.
    backend : str
        "auto", "cuda" (N <= ``_C.BUILD_TREE_MAX_NODES``, 8192), "triton" (N <=
        :data:`TRITON_MAX_NODES`, 1024), "cpu" or "torch" (see
        :mod:`eagle_kernels.ops._backend`).

    Returns
    -------
    depth : [B, N] int32
    tree_mask : [B, N, ceil(N / 32)] int32
    paths : [B, N, D + 1] int32, -1 padded (see :func:`reference.build_tree`).
    """
    check_tensor("parents", parents, (torch.int32,), (None, None))
    check_int("parents.shape[1] (tree size N)", parents.shape[1], 1)
    check_parents("parents", parents)
    max_depth = check_max_depth(parents, max_depth)
    _, implementation = resolve("build_tree", backend, parents.device,
                                num_nodes=parents.shape[1])
    return implementation(parents, max_depth)


def eagle2_rerank(root_tokens, candidate_tokens, candidate_scores, candidate_parents,
                  num_nodes: int, max_depth: int | None = None,
                  backend: str = "auto") -> tuple[DraftTree, torch.Tensor]:
    """Best ``num_nodes - 1`` candidates -> a topologically ordered draft tree.

    Parameters
    ----------
    root_tokens : [B] int64.   candidate_tokens : [B, M] int64.
    candidate_scores : [B, M] float32 (non-increasing from parent to child).
    candidate_parents : [B, M] int32, ``-1 <= candidate_parents[b, i] < i``.
    num_nodes : int, 1 <= N <= M + 1.   max_depth : int, optional (default N - 1).
    backend : "auto", "cuda" (M <= ``_C.RERANK_MAX_CANDIDATES``, 2048), "triton" (N <=
        :data:`~eagle_kernels.ops.tree.TRITON_MAX_NODES`, 1024), "cpu" or "torch"; all exact. The
        kernels build the whole tree (depth, mask, paths included) in one launch.

    Returns
    -------
    (DraftTree, selected [B, N - 1] int64); see :func:`reference.eagle2_rerank`.
    """
    check_tensor("candidate_tokens", candidate_tokens, (torch.int64,), (None, None))
    batch, candidates = candidate_tokens.shape
    device = candidate_tokens.device
    check_tensor("root_tokens", root_tokens, (torch.int64,), (batch,), device)
    check_tensor("candidate_scores", candidate_scores, (torch.float32,), (batch, candidates),
                 device)
    check_tensor("candidate_parents", candidate_parents, (torch.int32,), (batch, candidates),
                 device)
    check_same_device(candidate_tokens=candidate_tokens, root_tokens=root_tokens)
    check_int("num_nodes", num_nodes, 1, candidates + 1)
    check_range("root_tokens", root_tokens, 0, 2**62)
    check_range("candidate_tokens", candidate_tokens, 0, 2**62)
    if value_checks_enabled():  # the tree built only to be checked: not with checks off
        with_root = torch.cat([torch.full((batch, 1), -1, dtype=torch.int32, device=device),
                               candidate_parents + 1], dim=1)
        check_parents("candidate_parents (as tree with the root prepended)", with_root)
        bad = torch.isnan(candidate_scores)
        if bool(bad.any()):
            raise ValueError("candidate_scores: expected no NaN, "
                             f"{first_found(candidate_scores, bad)}")
    max_depth = check_int("max_depth", num_nodes - 1 if max_depth is None else max_depth, 0,
                          max(num_nodes - 1, MAX_PADDED_DEPTH))
    name, implementation = resolve("eagle2_rerank", backend, device, candidates=candidates,
                                   num_nodes=num_nodes)
    tree, selected = implementation(root_tokens, candidate_tokens, candidate_scores,
                                    candidate_parents, num_nodes, max_depth)
    if name != "torch":
        _check_kernel_tree(tree, max_depth)
    return tree, selected


def _check_kernel_tree(tree: DraftTree, max_depth: int) -> None:
    """The reference's two errors, read off a kernel's output (kernels never raise).

    A kept candidate whose parent was not kept gets parent -1 from the kernels; a tree deeper
    than ``max_depth`` gets its true depth (paths then drop the deep entries). One host sync,
    only with value checks on.
    """
    if not value_checks_enabled() or tree.parents.shape[1] < 2:
        return
    if bool((tree.parents[:, 1:] < 0).any()):
        raise ValueError("candidate_scores: a kept candidate's parent was not kept; scores must "
                         "not increase from parent to child")
    deepest = int(tree.depth.max())
    if deepest > max_depth:
        raise ValueError(f"max_depth: expected >= the tree depth {deepest}, got {max_depth}")


def _build_tree_cuda(parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    depth = torch.empty_like(parents)
    tree_mask = torch.empty(batch, num_nodes, reference.mask_words(num_nodes),
                            dtype=torch.int32, device=parents.device)
    paths = torch.empty(batch, num_nodes, max_depth + 1, dtype=torch.int32, device=parents.device)
    stream = cuda_stream(parents.device)
    cuda_extension().build_tree(parents.data_ptr(), depth.data_ptr(), tree_mask.data_ptr(),
                                paths.data_ptr(), batch, num_nodes, max_depth, stream)
    return depth, tree_mask, paths


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

MAX_PADDED_DEPTH = 1024  # the largest max_depth accepted beyond a tree's N - 1 (paths padding)
TRITON_MAX_NODES = 1024  # the mask walk keeps an [N, ceil(N / 32)] int32 tile in registers
PATH_COLUMNS = 32  # path padding is written this many columns at a time


@triton.jit
def _checked_parent(parents_ptr, cur):
    """Parent of each cursor when it is a valid step (0 <= parent < cur), else -1."""
    parent = tl.load(parents_ptr + tl.maximum(cur, 0), mask=cur > 0, other=-1)
    return tl.where((parent >= 0) & (parent < cur), parent, -1)


@triton.jit
def tree_body(parents_ptr, depth_ptr, mask_ptr, paths_ptr, flags_ptr, num_nodes, words, width,
              NP: tl.constexpr, WP: tl.constexpr, JB: tl.constexpr):
    """Depth, mask rows and paths of one tree whose [N] parents are at ``parents_ptr``.

    ``flags_ptr`` is an [N] int32 workspace. Pointers are already offset to this tree. Callers
    that wrote ``parents`` in the same program must put a barrier before this call.
    """
    nodes = tl.arange(0, NP)
    real = nodes < num_nodes
    parent = _checked_parent(parents_ptr, tl.where(real, nodes, -1))
    # Leaf flags: every node starts as a leaf, each child clears its parent (all write 0).
    tl.store(flags_ptr + nodes, tl.full([NP], 1, tl.int32), mask=real)
    tl.debug_barrier()
    tl.store(flags_ptr + tl.maximum(parent, 0), tl.zeros([NP], tl.int32), mask=parent >= 0)
    tl.debug_barrier()
    leaf = tl.load(flags_ptr + nodes, mask=real, other=0)
    leaf_row = tl.cumsum(leaf, 0) - 1
    num_leaves = tl.sum(leaf, 0)

    # Walk 1: every node's ancestors (itself included) -> depth and mask bits.
    word_ids = tl.arange(0, WP)
    bits = tl.zeros([NP, WP], tl.int32)
    depth = tl.full([NP], -1, tl.int32)
    cur = tl.where(real, nodes, -1)
    while tl.max(cur, 0) >= 0:
        safe = tl.maximum(cur, 0)
        hit = (word_ids[None, :] == (safe // 32)[:, None]) & (cur >= 0)[:, None]
        bits = bits | tl.where(hit, (1 << (safe % 32))[:, None], 0)
        depth += (cur >= 0).to(tl.int32)
        cur = _checked_parent(parents_ptr, cur)
    tl.store(depth_ptr + nodes, depth, mask=real)
    tl.store(mask_ptr + nodes[:, None] * words + word_ids[None, :], bits,
             mask=real[:, None] & (word_ids < words)[None, :])

    # Walk 2: each leaf writes its path row from the deepest entry up (positions past `width`
    # exist only for trees deeper than max_depth, which the op rejects; they are dropped).
    is_leaf = real & (leaf != 0)
    rows = paths_ptr + tl.maximum(leaf_row, 0).to(tl.int64) * width
    cur = tl.where(is_leaf, nodes, -1)
    pos = depth
    while tl.max(cur, 0) >= 0:
        tl.store(rows + pos, cur, mask=(cur >= 0) & (pos >= 0) & (pos < width))
        cur = _checked_parent(parents_ptr, cur)
        pos -= 1
    # Padding: columns past each leaf's depth, and whole rows past the leaf count.
    all_rows = paths_ptr + nodes.to(tl.int64) * width
    pad_row = real & (nodes >= num_leaves)
    for start in range(0, width, JB):
        cols = start + tl.arange(0, JB)
        inside = (cols < width)[None, :]
        tail = is_leaf[:, None] & (cols[None, :] > depth[:, None]) & inside
        tl.store(rows[:, None] + cols[None, :], tl.full([NP, JB], -1, tl.int32), mask=tail)
        tl.store(all_rows[:, None] + cols[None, :], tl.full([NP, JB], -1, tl.int32),
                 mask=pad_row[:, None] & inside)


@triton.jit
def _build_tree_kernel(parents_ptr, depth_ptr, mask_ptr, paths_ptr, flags_ptr, num_nodes, words,
                       width, NP: tl.constexpr, WP: tl.constexpr, JB: tl.constexpr):
    tree = tl.program_id(0).to(tl.int64)
    tree_body(parents_ptr + tree * num_nodes, depth_ptr + tree * num_nodes,
              mask_ptr + tree * num_nodes * words, paths_ptr + tree * num_nodes * width,
              flags_ptr + tree * num_nodes, num_nodes, words, width, NP, WP, JB)


def tree_block_sizes(num_nodes: int) -> dict:
    """Compile-time tile sizes of :func:`tree_body` for trees of ``num_nodes`` nodes."""
    return {"NP": triton.next_power_of_2(num_nodes),
            "WP": triton.next_power_of_2(reference.mask_words(num_nodes)), "JB": PATH_COLUMNS}


def triton_nodes_unsupported(num_nodes: int, **_) -> str | None:
    """``supports`` of the Triton tree kernels (build_tree, eagle2_rerank)."""
    if num_nodes > TRITON_MAX_NODES:
        return (f"num_nodes: expected trees of at most {TRITON_MAX_NODES} nodes "
                f"(tree.TRITON_MAX_NODES), got {num_nodes}")
    return None


def _cuda_supports(num_nodes: int, **_) -> str | None:
    most = cuda_limit("BUILD_TREE_MAX_NODES")  # one int32 of shared memory per node
    if most and num_nodes > most:
        return (f"parents: expected trees of at most {most} nodes (_C.BUILD_TREE_MAX_NODES), "
                f"got {num_nodes}")
    return None


def _build_tree_triton(parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    words = reference.mask_words(num_nodes)
    depth = torch.empty_like(parents)
    tree_mask = torch.empty(batch, num_nodes, words, dtype=torch.int32, device=parents.device)
    paths = torch.empty(batch, num_nodes, max_depth + 1, dtype=torch.int32, device=parents.device)
    flags = torch.empty_like(parents)
    if batch > 0:
        _build_tree_kernel[(batch,)](parents, depth, tree_mask, paths, flags, num_nodes, words,
                                     max_depth + 1, **tree_block_sizes(num_nodes))
    return depth, tree_mask, paths


@triton.jit
def _rerank_kernel(root_ptr, cand_tokens_ptr, cand_scores_ptr, cand_parents_ptr,
                   tokens_ptr, parents_ptr, depth_ptr, scores_ptr, mask_ptr, paths_ptr,
                   selected_ptr, node_of_ptr, flags_ptr, candidates, num_nodes, words, width,
                   MP: tl.constexpr, RB: tl.constexpr, NP: tl.constexpr, WP: tl.constexpr,
                   JB: tl.constexpr):
    """One program per tree, the whole rerank + tree construction:

    1. rank every candidate by counting better keys ([RB, M] compare tiles); kept iff rank < N-1;
    2. node number = inclusive cumsum of the kept flags (topological: candidate order);
    3. kept candidates write token, score, selected and their parent's node number (0 for a
       child of the root, -1 when the parent was not kept: the op raises on it);
    4. :func:`tree_body` on the parents just written.
    ``node_of_ptr`` ([B, M] int32) and ``flags_ptr`` ([B, N] int32) are workspaces.
    """
    tree = tl.program_id(0).to(tl.int64)
    cand_scores_ptr += tree * candidates
    node_of_ptr += tree * candidates
    cand = tl.arange(0, MP)
    inside = cand < candidates
    all_keys = tl.where(inside, order_key(tl.load(cand_scores_ptr + cand, mask=inside), cand),
                        NO_KEY)
    keep = num_nodes - 1
    for start in range(0, candidates, RB):
        mine = start + tl.arange(0, RB)
        mine_inside = mine < candidates
        my_keys = order_key(tl.load(cand_scores_ptr + mine, mask=mine_inside), mine)
        rank = tl.sum((all_keys[None, :] > my_keys[:, None]).to(tl.int32), 1)
        tl.store(node_of_ptr + mine, (rank < keep).to(tl.int32), mask=mine_inside)
    tl.debug_barrier()
    kept = tl.load(node_of_ptr + cand, mask=inside, other=0)
    node = tl.cumsum(kept, 0)
    tl.debug_barrier()  # every flag is read before node numbers overwrite them
    kept = inside & (kept != 0)
    tl.store(node_of_ptr + cand, tl.where(kept, node, -1), mask=inside)
    tl.debug_barrier()

    parent = tl.load(cand_parents_ptr + tree * candidates + cand, mask=kept, other=-1)
    valid = (parent >= 0) & (parent < cand)
    parent_node = tl.load(node_of_ptr + tl.where(valid, parent, 0), mask=kept & valid, other=-1)
    parent_node = tl.where(parent < 0, 0, parent_node)
    out = tree * num_nodes + node
    tl.store(tokens_ptr + out, tl.load(cand_tokens_ptr + tree * candidates + cand, mask=kept),
             mask=kept)
    tl.store(scores_ptr + out, tl.load(cand_scores_ptr + cand, mask=kept), mask=kept)
    tl.store(parents_ptr + out, parent_node, mask=kept)
    tl.store(selected_ptr + tree * keep + node - 1, cand.to(tl.int64), mask=kept)
    tl.store(tokens_ptr + tree * num_nodes, tl.load(root_ptr + tree))
    tl.store(parents_ptr + tree * num_nodes, -1)
    tl.store(scores_ptr + tree * num_nodes, 0.0)
    tl.debug_barrier()
    tree_body(parents_ptr + tree * num_nodes, depth_ptr + tree * num_nodes,
              mask_ptr + tree * num_nodes * words, paths_ptr + tree * num_nodes * width,
              flags_ptr + tree * num_nodes, num_nodes, words, width, NP, WP, JB)


def _rerank_outputs(batch, num_nodes, max_depth, device):
    """Output tensors of eagle2_rerank: DraftTree fields and selected."""
    def empty(*shape, dtype=torch.int32):
        return torch.empty(*shape, dtype=dtype, device=device)
    tree = DraftTree(empty(batch, num_nodes, dtype=torch.int64), empty(batch, num_nodes),
                     empty(batch, num_nodes), empty(batch, num_nodes, dtype=torch.float32),
                     empty(batch, num_nodes, reference.mask_words(num_nodes)),
                     empty(batch, num_nodes, max_depth + 1))
    return tree, empty(batch, num_nodes - 1, dtype=torch.int64)


def _eagle2_rerank_triton(root_tokens, candidate_tokens, candidate_scores, candidate_parents,
                          num_nodes, max_depth):
    batch, candidates = candidate_tokens.shape
    device = candidate_tokens.device
    tree, selected = _rerank_outputs(batch, num_nodes, max_depth, device)
    if batch > 0:
        rows = triton.next_power_of_2(max(candidates, 1))  # M = 0: the root alone
        node_of = torch.empty(batch, candidates, dtype=torch.int32, device=device)
        flags = torch.empty(batch, num_nodes, dtype=torch.int32, device=device)
        _rerank_kernel[(batch,)](
            root_tokens, candidate_tokens, candidate_scores, candidate_parents, tree.tokens,
            tree.parents, tree.depth, tree.scores, tree.tree_mask, tree.paths, selected,
            node_of, flags, candidates, num_nodes, reference.mask_words(num_nodes),
            max_depth + 1, MP=rows, RB=rank_rows(rows),
            **tree_block_sizes(num_nodes))
    return tree, selected



# --------------------------------------------------------------------------------------------
# CUDA rerank (csrc/tree.cu): raw pointers, sizes and the current stream
# --------------------------------------------------------------------------------------------

def _rerank_cuda_supports(candidates, **_) -> str | None:
    if candidates < 1:  # the root alone: the other backends answer it
        return "candidate_tokens: expected M >= 1 candidates, got 0"
    most = cuda_limit("RERANK_MAX_CANDIDATES")  # 12 bytes of shared memory per candidate
    if most and candidates > most:
        return (f"candidate_tokens: expected M <= {most} candidates (_C.RERANK_MAX_CANDIDATES), "
                f"got {candidates}")
    return None


def _eagle2_rerank_cuda(root_tokens, candidate_tokens, candidate_scores, candidate_parents,
                        num_nodes, max_depth):
    batch, candidates = candidate_tokens.shape
    tree, selected = _rerank_outputs(batch, num_nodes, max_depth, candidate_tokens.device)
    cuda_extension().eagle2_rerank(
        root_tokens.data_ptr(), candidate_tokens.data_ptr(), candidate_scores.data_ptr(),
        candidate_parents.data_ptr(), *(t.data_ptr() for t in tree), selected.data_ptr(),
        batch, candidates, num_nodes, max_depth, cuda_stream(candidate_tokens.device))
    return tree, selected


# --------------------------------------------------------------------------------------------
# CPU kernels (csrc/cpu/tree.h): one tree per OpenMP iteration
# --------------------------------------------------------------------------------------------

def _build_tree_cpu(parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    depth = torch.empty_like(parents)
    tree_mask = torch.empty(batch, num_nodes, reference.mask_words(num_nodes), dtype=torch.int32,
                            device=parents.device)
    paths = torch.empty(batch, num_nodes, max_depth + 1, dtype=torch.int32, device=parents.device)
    cpu_extension().build_tree(parents.data_ptr(), depth.data_ptr(), tree_mask.data_ptr(),
                               paths.data_ptr(), batch, num_nodes, max_depth)
    return depth, tree_mask, paths


def _eagle2_rerank_cpu(root_tokens, candidate_tokens, candidate_scores, candidate_parents,
                       num_nodes, max_depth):
    batch, candidates = candidate_tokens.shape
    tree, selected = _rerank_outputs(batch, num_nodes, max_depth, candidate_tokens.device)
    cpu_extension().eagle2_rerank(
        root_tokens.data_ptr(), candidate_tokens.data_ptr(), candidate_scores.data_ptr(),
        candidate_parents.data_ptr(), [t.data_ptr() for t in (*tree, selected)], batch,
        candidates, num_nodes, max_depth)
    return tree, selected


register("build_tree", "cpu", _build_tree_cpu)
register("eagle2_rerank", "cpu", _eagle2_rerank_cpu,
         supports=lambda num_nodes=1, **_: cpu_select_supports(num_nodes - 1,
                                                                   "num_nodes - 1"))
register("build_tree", "torch", reference.build_tree)
register("build_tree", "triton", _build_tree_triton, auto=False,
         supports=triton_nodes_unsupported)
register("build_tree", "cuda", _build_tree_cuda, auto=False, supports=_cuda_supports)
register("eagle2_rerank", "torch", reference.eagle2_rerank)
register("eagle2_rerank", "triton", _eagle2_rerank_triton, auto=False,
         supports=triton_nodes_unsupported)
register("eagle2_rerank", "cuda", _eagle2_rerank_cuda, auto=False,
         supports=_rerank_cuda_supports)
