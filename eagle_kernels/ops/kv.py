"""KV compaction: move the accepted path's K/V entries next to the committed prefix.

Public op :func:`compact_kv` with the contract of :func:`eagle_kernels.ops.reference.compact_kv`
(in place, every layer's K and V cache in one call). Backends: ``torch`` (reference); Triton and
CUDA kernels to come.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import reference
from ._backend import register, resolve
from ._validate import check_range, check_tensor, value_checks_enabled


def compact_kv(caches: Sequence[torch.Tensor], cache_lens, accepted_nodes, num_accepted,
               backend: str = "auto") -> None:
    """Copy entry ``cache_lens[b] + accepted_nodes[b, j]`` to ``cache_lens[b] + j`` in place.

    Parameters
    ----------
    caches : sequence of [B, max_len, H, D] tensors (every layer's K and V), contiguous, on one
        device; shapes may differ between layers but B and max_len may not.
    cache_lens : [B] int32 committed lengths before this step.
    accepted_nodes : [B, W] int32 root then accepted node indices, -1 padded.
    num_accepted : [B] int32, ``0 <= num_accepted[b] < W``.
    backend : "auto", "cuda", "triton" or "torch".
    """
    if isinstance(caches, torch.Tensor) or not isinstance(caches, (list, tuple)) or not caches:
        raise TypeError("caches: expected a non-empty list or tuple of [B, max_len, H, D] tensors")
    first = check_tensor("caches[0]", caches[0], None, (None, None, None, None))
    batch, max_len = first.shape[:2]
    for index, cache in enumerate(caches):
        check_tensor(f"caches[{index}]", cache, None, (batch, max_len, None, None), first.device)
    check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), first.device)
    check_tensor("accepted_nodes", accepted_nodes, (torch.int32,), (batch, None), first.device)
    check_tensor("num_accepted", num_accepted, (torch.int32,), (batch,), first.device)
    width = accepted_nodes.shape[1]
    check_range("num_accepted", num_accepted, 0, width, " (accepted_nodes has that many columns)")
    if value_checks_enabled():
        _check_accepted_path(cache_lens, accepted_nodes, num_accepted, max_len)
    _, implementation = resolve("compact_kv", backend, first.device)
    implementation(list(caches), cache_lens, accepted_nodes, num_accepted)


def _check_accepted_path(cache_lens, accepted_nodes, num_accepted, max_len: int) -> None:
    """Root first, strictly increasing node indices, every source and target inside the cache."""
    column = torch.arange(accepted_nodes.shape[1], device=accepted_nodes.device)
    used = column <= num_accepted.unsqueeze(1)
    if bool((accepted_nodes[:, 0] != 0).any()):
        raise ValueError("accepted_nodes: expected the root (node 0) in column 0")
    steps = accepted_nodes[:, 1:] - accepted_nodes[:, :-1]
    if bool(((steps <= 0) & used[:, 1:]).any()):
        raise ValueError("accepted_nodes: expected strictly increasing node indices along the path")
    source_end = cache_lens + torch.where(used, accepted_nodes, 0).amax(1)
    check_range("cache_lens + accepted_nodes", source_end, 0, max_len, " (inside the cache)")


register("compact_kv", "torch", reference.compact_kv)
