"""Tree attention: tree-node queries over the KV-cache prefix plus their tree ancestors.

Public op :func:`tree_attention` with the contract of
:func:`eagle_kernels.ops.reference.tree_attention`. It serves the target's verify pass (every
tree node is a query and a key) and the draft head's drafting steps (a frontier of queries over
all nodes drafted so far). Backends: ``torch`` (reference); Triton and CUDA kernels to come.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import register, resolve
from ._validate import (FLOAT_DTYPES, check_int, check_range, check_same_device, check_tensor,
                        value_checks_enabled)


def tree_attention(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale: float | None = None,
                   num_tree_keys: int | None = None, backend: str = "auto") -> torch.Tensor:
    """Attention of N tree-node queries over the prefix and their ancestors (packed mask).

    Parameters
    ----------
    q : [B, Nq, Hq, D] float16 / bfloat16 / float32, contiguous.
    k_cache, v_cache : [B, max_len, Hkv, D], dtype of ``q``, contiguous; ``Hq % Hkv == 0``;
        the T tree keys sit at ``[cache_lens[b], cache_lens[b] + T)``.
    cache_lens : [B] int32 committed prefix lengths, ``cache_lens[b] + T <= max_len``.
    tree_mask : [B, Nq, ceil(T / 32)] int32 packed ancestor bits.
    sm_scale : float, optional. Default ``D ** -0.5``.
    num_tree_keys : int, optional. T, default Nq.
    backend : "auto", "cuda", "triton" or "torch".

    Returns
    -------
    [B, Nq, Hq, D], dtype of ``q``.
    """
    check_tensor("q", q, FLOAT_DTYPES, (None, None, None, None))
    batch, num_queries, q_heads, head_dim = q.shape
    check_int("q.shape[1] (query count)", num_queries, 1)
    check_tensor("k_cache", k_cache, (q.dtype,), (batch, None, None, head_dim), q.device)
    check_tensor("v_cache", v_cache, (q.dtype,), tuple(k_cache.shape), q.device)
    kv_heads, max_len = k_cache.shape[2], k_cache.shape[1]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"k_cache: expected a KV head count dividing the {q_heads} query heads, "
                         f"got {kv_heads}")
    tree_keys = check_int("num_tree_keys", num_queries if num_tree_keys is None else num_tree_keys,
                          1, max_len)
    check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), q.device)
    check_tensor("tree_mask", tree_mask, (torch.int32,),
                 (batch, num_queries, reference.mask_words(tree_keys)), q.device)
    check_same_device(q=q, k_cache=k_cache, cache_lens=cache_lens)
    check_range("cache_lens", cache_lens, 0, max_len - tree_keys + 1,
                f" (prefix plus {tree_keys} tree keys must fit max_len {max_len})")
    if sm_scale is not None and not isinstance(sm_scale, (int, float)):
        raise TypeError(f"sm_scale: expected a float, got {type(sm_scale).__name__}")
    if value_checks_enabled() and tree_keys % 32:
        spare = reference.unpack_tree_mask(tree_mask, reference.mask_words(tree_keys) * 32)
        if bool(spare[..., tree_keys:].any()):
            raise ValueError(f"tree_mask: bits past the {tree_keys} tree keys must be zero")
    _, implementation = resolve("tree_attention", backend, q.device)
    return implementation(q, k_cache, v_cache, cache_lens, tree_mask, sm_scale, tree_keys)


register("tree_attention", "torch", reference.tree_attention)
