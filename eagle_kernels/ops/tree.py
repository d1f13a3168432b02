"""Tree construction: parents -> depth, packed ancestor mask, root-to-leaf paths.

Public op :func:`build_tree` with the contract of :func:`eagle_kernels.ops.reference.build_tree`.
Backends: ``torch`` (reference) and ``cuda`` (``csrc/tree.cu``; explicit only until it has been
proven on a GPU).
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import cuda_extension, register, resolve
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
        "auto", "cuda", "triton" or "torch" (see :mod:`eagle_kernels.ops._backend`).

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
    _, implementation = resolve("build_tree", backend, parents.device)
    return implementation(parents, max_depth)


def _build_tree_cuda(parents: torch.Tensor, max_depth: int):
    batch, num_nodes = parents.shape
    depth = torch.empty_like(parents)
    tree_mask = torch.empty(batch, num_nodes, reference.mask_words(num_nodes),
                            dtype=torch.int32, device=parents.device)
    paths = torch.empty(batch, num_nodes, max_depth + 1, dtype=torch.int32, device=parents.device)
    stream = torch.cuda.current_stream(parents.device).cuda_stream
    cuda_extension().build_tree(parents.data_ptr(), depth.data_ptr(), tree_mask.data_ptr(),
                                paths.data_ptr(), batch, num_nodes, max_depth, stream)
    return depth, tree_mask, paths


register("build_tree", "torch", reference.build_tree)
register("build_tree", "cuda", _build_tree_cuda, auto=False)
