"""Tree construction: parents -> depth, packed ancestor mask, root-to-leaf paths.

Public op :func:`build_tree` with the contract of :func:`eagle_kernels.ops.reference.build_tree`.
Backends: ``torch`` (reference), ``cuda`` (``csrc/tree.cu``) and ``triton`` (below); both
kernels are explicit only until they have been proven on a GPU.

Triton kernel (one program per tree, N <= :data:`TRITON_MAX_NODES`): :func:`tree_body` walks
every node's ancestor chain at once (a vector of N cursors stepping to their parents until all
reach the root), which gives depth and the packed mask rows in one walk; leaf flags come from a
scatter of zeros at every parent index into a small workspace, leaf rows from a cumsum of the
flags, and a second walk from the leaves writes the paths. ``eagle2_rerank``'s Triton kernel
(:mod:`eagle_kernels.ops.topk`) ends with the same :func:`tree_body`, so a whole draft tree is
built in one launch. Invalid parents (outside ``[0, node)``) end a walk as if at the root: no
access leaves its row, as in the CUDA kernel.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import cuda_extension, cuda_limit, cuda_stream, register, resolve
from ._triton import tl, triton
from ._validate import check_int, check_parents, check_tensor, value_checks_enabled


def tree_depth(parents: torch.Tensor) -> torch.Tensor:
    """[B, N] int64 depth of every node of topologically ordered trees (root 0)."""
    depth = torch.zeros(parents.shape, dtype=torch.int64, device=parents.device)
    for node in range(1, parents.shape[1]):
        depth[:, node] = depth.gather(1, parents[:, node:node + 1].long()).squeeze(1) + 1
    return depth


def check_max_depth(parents: torch.Tensor, max_depth: int | None) -> int:
    """Resolve ``max_depth`` (default N - 1) and, with value checks on, that trees fit in it."""
    num_nodes = parents.shape[1]
    max_depth = check_int("max_depth", num_nodes - 1 if max_depth is None else max_depth, 0)
    if value_checks_enabled() and num_nodes > 1:
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
        :data:`TRITON_MAX_NODES`, 1024) or "torch" (see :mod:`eagle_kernels.ops._backend`).

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


register("build_tree", "torch", reference.build_tree)
register("build_tree", "triton", _build_tree_triton, auto=False,
         supports=triton_nodes_unsupported)
register("build_tree", "cuda", _build_tree_cuda, auto=False, supports=_cuda_supports)
