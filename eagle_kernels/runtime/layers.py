"""Building blocks of Llama-family decoders (Llama 2/3, Vicuna, Qwen2, Mistral) and EAGLE heads.

Module and parameter names follow transformers' Llama code, so HF checkpoints and the official
EAGLE heads load by name. Every attention layer writes its new K/V into a static
:class:`~eagle_kernels.runtime.kv_cache.KVCache` and attends through
:func:`eagle_kernels.ops.tree_attention`: prefill (a chain mask, i.e. causal), one decode token,
a verify tree and a drafting frontier are all the same call with a different packed mask.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .. import ops
from .kv_cache import KVCache


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 like transformers' LlamaRMSNorm."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config) -> dict:
    """The RoPE settings of a transformers config (v5 ``rope_parameters`` or v4 fields)."""
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    scaling = dict(getattr(config, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    scaling.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return scaling


class RotaryEmbedding(nn.Module):
    """cos/sin tables for arbitrary position ids; scaling types come from transformers."""

    def __init__(self, config):
        super().__init__()
        params = rope_parameters(config)
        rope_type = params.get("rope_type", "default")
        dim = head_dim_of(config)
        if rope_type == "default":
            base = params.get("rope_theta", 10000.0)
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            scaling = 1.0
        elif rope_type == "dynamic":
            raise ValueError("config.rope_parameters: rope_type 'dynamic' recomputes frequencies "
                             "per sequence length, which a static cache cannot follow; not "
                             "supported")
        elif rope_type in ROPE_INIT_FUNCTIONS:
            inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
        else:
            raise ValueError(f"config.rope_parameters: rope_type {rope_type!r} is not supported "
                             f"(expected 'default' or one of {sorted(ROPE_INIT_FUNCTIONS)})")
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.scaling = float(scaling)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin [B, T, D] for integer ``positions`` [B, T]."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return (angles.cos() * self.scaling).to(dtype), (angles.sin() * self.scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, T, H, D] by the cos/sin tables [B, T, D]."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """GQA self-attention over a static KV cache; ``input_size`` is 2H in EAGLE-3's midlayer."""

    def __init__(self, config, layer_index: int, input_size: int | None = None,
                 qkv_bias: bool = False, o_bias: bool = False):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        width = input_size or config.hidden_size
        self.q_proj = nn.Linear(width, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=o_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
                tree_mask: torch.Tensor, tree_offset: int = 0) -> torch.Tensor:
        """Attend ``x`` [B, T, in] to the cache prefix plus the tree keys.

        The T new keys are written at ``cache.lens + tree_offset``; the queries see every key
        below ``cache.lens`` and the ``tree_offset + T`` tree keys their packed ``tree_mask``
        row [B, T, ceil((tree_offset + T) / 32)] allows.
        """
        batch, count, _ = x.shape
        q = self.q_proj(x).view(batch, count, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(batch, count, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, count, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        cache.write(self.layer_index, k, v, tree_offset)
        out = ops.tree_attention(q.contiguous(), cache.keys[self.layer_index],
                                 cache.values[self.layer_index], cache.lens, tree_mask,
                                 num_tree_keys=tree_offset + count)
        return self.o_proj(out.reshape(batch, count, -1))


class MLP(nn.Module):
    """Gated MLP: down(act(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


def attention_biases(config) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias): Qwen2 always biases q/k/v; Llama follows attention_bias."""
    if getattr(config, "model_type", "") == "qwen2":
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer. EAGLE-1's draft layer has no input_layernorm (``input_norm``)."""

    def __init__(self, config, layer_index: int, input_norm: bool = True):
        super().__init__()
        qkv_bias, o_bias = attention_biases(config)
        self.self_attn = Attention(config, layer_index, qkv_bias=qkv_bias, o_bias=o_bias)
        self.mlp = MLP(config)
        if input_norm:
            self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, cache, tree_mask, tree_offset: int = 0) -> torch.Tensor:
        norm = getattr(self, "input_layernorm", None)
        h = x + self.self_attn(norm(x) if norm is not None else x, rope, cache, tree_mask,
                               tree_offset)
        return h + self.mlp(self.post_attention_layernorm(h))
