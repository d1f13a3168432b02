"""Building blocks of Llama-family decoders (Llama 2/3, Vicuna, Qwen2, Mistral) and EAGLE heads.

Module and parameter names follow transformers' Llama code, so HF checkpoints and the official
EAGLE heads load by name. Every attention layer writes its new K/V into a static
:class:`~eagle_kernels.runtime.kv_cache.KVCache` and attends through
:func:`eagle_kernels.ops.tree_attention`: prefill (a chain mask, i.e. causal), one decode token,
a verify tree and a drafting frontier are all the same call with a different packed mask.

Inference runs every step through :mod:`eagle_kernels.ops` (``linear_group``, ``rms_norm``,
``apply_rope`` and ``write_kv`` or ``rope_write_kv`` where a kernel serves it, ``silu_mul``,
``tree_attention``; on CPU the whole layer as ``decoder_layer``), so ``backend="auto"`` picks
the fast kernels of the device: on CPU the row-invariant C++ kernels, which make a token's
hidden state the same bit for bit whatever else is computed with it. Where autograd is needed
(training a head), the same modules run the torch reference math instead
(:func:`differentiable`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .. import ops
from ..ops._backend import resolve
from ..ops._validate import check_range, no_value_checks
from .kv_cache import KVCache


# Bumped whenever any module anywhere gets a parameter or submodule assigned, or one of this
# file's parameter-holding modules converts its parameters (.to(), .float(), ...): a layer's
# bound weights (layer_weights) are made again from the module only after such a change, not
# on every call (looking them up was half of a decode step's Python time per layer). Not seen:
# writes straight into ``module._parameters`` (torch.func.functional_call): call
# ``_structure_changed()`` after those. In-place changes and moved storage are seen by the
# binding itself (ops.LayerWeights).
_STRUCTURE_CHANGES = [0]


def _structure_changed(*_args) -> None:
    _STRUCTURE_CHANGES[0] += 1


nn.modules.module.register_module_parameter_registration_hook(_structure_changed)
nn.modules.module.register_module_module_registration_hook(_structure_changed)


class _TracksConversion:
    """Mixin for modules that own parameters: a conversion may replace them (see above)."""

    def _apply(self, fn, recurse=True):
        _structure_changed()
        return super()._apply(fn, recurse)


def differentiable(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd must see this computation (grad mode on and a tensor needs grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def hook_dicts(modules) -> tuple:
    """The forward and forward-pre hook dicts of ``modules`` (filled in place when a hook is
    registered, so a kept tuple stays current)."""
    return tuple(d for m in modules for d in (m._forward_hooks, m._forward_pre_hooks))


def any_hook(dicts) -> bool:
    """Whether a global forward hook or one in ``dicts`` (:func:`hook_dicts`) would see a
    module run."""
    return bool(nn.modules.module._global_forward_hooks
                or nn.modules.module._global_forward_pre_hooks or any(dicts))


class Linear(_TracksConversion, nn.Linear):
    """nn.Linear whose inference goes through :func:`eagle_kernels.ops.linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if differentiable(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return ops.linear(x.contiguous(), self.weight, self.bias)


def linear_group(x: torch.Tensor, layers: list[nn.Linear]) -> tuple[torch.Tensor, ...]:
    """Several linear layers of one input in one op call (q/k/v, gate/up)."""
    if differentiable(x, *(layer.weight for layer in layers)):
        return tuple(F.linear(x, layer.weight, layer.bias) for layer in layers)
    return ops.linear_group(x.contiguous(), [layer.weight for layer in layers],
                            [layer.bias for layer in layers])


class RMSNorm(_TracksConversion, nn.Module):
    """x / rms(x) * weight, computed in fp32 like transformers' LlamaRMSNorm."""

    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """norm(x), or (norm(x + residual), x + residual) when ``residual`` is given."""
        if differentiable(x, residual, self.weight):
            return ops.reference.rms_norm(x, self.weight, self.eps, residual)
        return ops.rms_norm(x.contiguous(), self.weight, self.eps,
                            None if residual is None else residual.contiguous())


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

        self._tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """cos, sin [B, T, D] for integer ``positions`` [B, T]."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return (angles.cos() * self.scaling).to(dtype), (angles.sin() * self.scaling).to(dtype)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, size: int) -> "Rope":
        """The rotation of ``positions`` [B, T] (each < ``size``) by table lookup.

        The cos/sin tables of positions [0, size) are computed once (grown by doubling) and
        indexed, so a position's rotation is the same bits in every pass, whatever the other
        positions of the call.
        """
        check_range("positions", positions, 0, size, " (rows of the rotary tables)")
        key = (dtype, positions.device)
        cached = self._tables.get(key)
        if cached is None or cached[0].shape[0] < size:
            rows = max(size, 2 * cached[0].shape[0] if cached is not None else 0, 64)
            cached = self(torch.arange(rows, device=positions.device).unsqueeze(0), dtype)
            cached = (cached[0][0].contiguous(), cached[1][0].contiguous())
            self._tables[key] = cached
        return Rope(positions.contiguous(), *cached)


class Rope(NamedTuple):
    """Positions [B, T] int64 and the cos / sin tables [P, D] they index."""

    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [B, T, H, D] (see :func:`eagle_kernels.ops.apply_rope`)."""
        if differentiable(x):
            return ops.reference.apply_rope(x, self.positions, self.cos, self.sin)
        with no_value_checks():  # positions were range-checked once, by tables()
            return ops.apply_rope(x.contiguous(), self.positions, self.cos, self.sin)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [B, T, H, D] by the cos/sin rows [B, T, D] (training's per-call tables)."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return x * cos + ops.reference.rotate_half(x) * sin


def _prologue_in_one_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the attention's RoPE and cache write run as ops.rope_write_kv: not under
    autograd, and where a kernel serves it (auto's pick on a GPU whose verdict proves it, or a
    forced backend). Its torch backend is the separate ops' references: where it would run,
    the separate ops run instead, each on its own backend (a proven apply_rope or write_kv
    kernel, KVCache.write's unchecked reference on CPU)."""
    if differentiable(q, k, v):
        return False
    return resolve("rope_write_kv", "auto", q.device, dtype=q.dtype)[0] != "torch"


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
        self.q_proj = Linear(width, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(width, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(width, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=o_bias)

    def forward(self, x: torch.Tensor, rope: Rope, cache: KVCache, tree_mask: torch.Tensor,
                tree_offset: int = 0) -> torch.Tensor:
        """Attend ``x`` [B, T, in] to the cache prefix plus the tree keys.

        The T new keys are written at ``cache.lens + tree_offset``; the queries see every key
        below ``cache.lens`` and the ``tree_offset + T`` tree keys their packed ``tree_mask``
        row [B, T, ceil((tree_offset + T) / 32)] allows.
        """
        batch, count, _ = x.shape
        q, k, v = linear_group(x, [self.q_proj, self.k_proj, self.v_proj])
        q = q.view(batch, count, self.num_heads, self.head_dim)
        k = k.view(batch, count, self.kv_heads, self.head_dim)
        v = v.view(batch, count, self.kv_heads, self.head_dim)
        if _prologue_in_one_op(q, k, v):  # both rotations and the cache write in one launch
            index = self.layer_index
            q = ops.rope_write_kv(q, k, v, rope.positions, rope.cos, rope.sin, cache.keys[index],
                                  cache.values[index], cache.lens, tree_offset)
        else:
            q, k = rope.apply(q), rope.apply(k)
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
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]
        self.silu = config.hidden_act == "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear_group(x, [self.gate_proj, self.up_proj])
        if self.silu and not differentiable(gate, up):
            return self.down_proj(ops.silu_mul(gate, up))
        return self.down_proj(self.act_fn(gate) * up)


def attention_biases(config) -> tuple[bool, bool]:
    """(q/k/v bias, o_proj bias): Qwen2 always biases q/k/v; Llama follows attention_bias."""
    if getattr(config, "model_type", "") == "qwen2":
        return True, False
    bias = bool(getattr(config, "attention_bias", False))
    return bias, bias


def layer_step(x: torch.Tensor, rope: Rope, cache: KVCache, tree_mask: torch.Tensor,
               tree_offset: int = 0) -> ops.DecoderStep | None:
    """The arguments every layer of this forward shares, checked once, where the fused cpu
    layer runs it (fp32 CPU tensors, no autograd); else None (the layers run op by op, so GPU
    backends of tree attention keep serving them)."""
    if differentiable(x) or ops.decoder_layer_backend(x.device, x.dtype) != "cpu":
        return None
    batch, count = x.shape[:2]
    return ops.DecoderStep(batch, count, rope.positions, rope.cos, rope.sin,
                           cache.keys[0].shape, cache.lens, tree_mask, tree_offset, x.dtype,
                           x.device)


def _layer_tensors(attention: Attention, mlp: MLP, post_norm: RMSNorm,
                   input_norm: RMSNorm | None) -> tuple:
    projections = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                   mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    weights = tuple(p.weight for p in projections)
    biases = tuple(p.bias for p in projections)
    return weights, biases, None if input_norm is None else input_norm.weight, post_norm.weight


def fused_layer(owner: nn.Module, x: torch.Tensor, attention: Attention, mlp: MLP,
                post_norm: RMSNorm, input_norm: RMSNorm | None, step: ops.DecoderStep | None,
                cache: KVCache, residual: torch.Tensor | None = None) -> torch.Tensor | None:
    """The whole layer as one cpu kernel call (:meth:`eagle_kernels.ops.DecoderStep.run`)
    where ``step`` says the fused path runs, else None (the caller runs op by op). Same result
    bit for bit either way.

    The layer's checked and packed weights (:class:`eagle_kernels.ops.LayerWeights`) are kept
    on ``owner`` and rebuilt when a parameter object was replaced (looked at only after a
    structure change, see ``_STRUCTURE_CHANGES``); in-place changes and moved storage are
    caught by the binding itself.
    """
    if step is None or differentiable(x, residual):
        return None
    binding = layer_weights(owner, attention, mlp, post_norm, input_norm)
    if binding is None or any_hook(owner.__dict__["_layer_hooks"]):  # a hook must see its module
        return None
    index = attention.layer_index
    return step.run(binding, x.contiguous(), cache.keys[index], cache.values[index],
                    None if residual is None else residual.contiguous())


def layer_weights(owner: nn.Module, attention: Attention, mlp: MLP, post_norm: RMSNorm,
                  input_norm: RMSNorm | None) -> ops.LayerWeights | None:
    """The layer's weights checked and packed for the fused cpu kernel, kept on ``owner``; None
    where that kernel cannot run the layer (not SiLU, or autograd must see the weights)."""
    if not mlp.silu or differentiable(attention.q_proj.weight):
        return None
    binding, made_at = owner.__dict__.get("_layer_weights", (None, -1))
    if made_at != _STRUCTURE_CHANGES[0]:  # bound again (checks included; packs are cached)
        weights, biases, norm, post = _layer_tensors(attention, mlp, post_norm, input_norm)
        binding = ops.LayerWeights(list(weights), list(biases), norm, post, post_norm.eps)
        owner.__dict__["_layer_weights"] = (binding, _STRUCTURE_CHANGES[0])
        owner.__dict__["_layer_hooks"] = hook_dicts(owner.modules())
    return binding


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

    def forward(self, x, rope: Rope, cache, tree_mask, tree_offset: int = 0,
                step: ops.DecoderStep | None = None) -> torch.Tensor:
        """``step``: :func:`layer_step` of this forward, made once by a caller that runs many
        layers (made here when not given)."""
        norm = getattr(self, "input_layernorm", None)
        if step is None:
            step = layer_step(x, rope, cache, tree_mask, tree_offset)
        elif step.tree_offset != tree_offset or step.tree_mask is not tree_mask:
            raise ValueError("step: made for another tree_offset / tree_mask than this call's")
        fused = fused_layer(self, x, self.self_attn, self.mlp, self.post_attention_layernorm, norm,
                            step, cache)
        if fused is not None:
            return fused
        delta, stream, _ = self.apart(x, None, rope, cache, tree_mask, tree_offset)
        return stream + delta

    def apart(self, x: torch.Tensor, residual: torch.Tensor | None, rope: Rope, cache: KVCache,
              tree_mask: torch.Tensor, tree_offset: int = 0):
        """The layer op by op with its residual stream kept apart: the layer's input is ``x +
        residual`` (``x`` where ``residual`` is None), added by the input norm. Returns (the
        MLP's output, the stream after attention, the layer's input), the first two summing to
        :meth:`forward`'s output. A stack hands them to the next layer's input norm, which adds
        them in its own launch (one launch fewer per layer on a GPU), rounding the sum as
        torch's add does: the same bits as :meth:`forward`'s layers."""
        norm = getattr(self, "input_layernorm", None)
        if residual is None:
            stream, normed = x, (norm(x) if norm is not None else x)
        elif norm is not None:
            normed, stream = norm(x, residual=residual)
        else:
            stream = normed = x + residual
        attended = self.self_attn(normed, rope, cache, tree_mask, tree_offset)
        normed, after = self.post_attention_layernorm(attended, residual=stream)
        return self.mlp(normed), after, stream

    def fused_weights(self) -> ops.LayerWeights | None:
        """This layer's weights for the fused cpu kernel (see :func:`layer_weights`)."""
        return layer_weights(self, self.self_attn, self.mlp, self.post_attention_layernorm,
                             getattr(self, "input_layernorm", None))
