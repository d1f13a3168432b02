"""The target model: a Llama-family decoder over a static KV cache.

Covers Llama 2/3 (llama3 RoPE scaling included), Vicuna, Qwen2 (q/k/v bias) and Mistral
(full attention: a cache longer than a configured sliding window is refused). Parameter names are
transformers' (``model.layers.3.self_attn.q_proj.weight``), so a HF safetensors checkpoint
directory loads by name and strictly; GGUF files load through transformers' own GGUF reader.

One forward serves every pass of speculative decoding: prefill (chain mask), a decode step
(one token), the verify tree (the draft tree's packed mask); it can also hand back the inputs
of chosen layers, the features EAGLE-3 heads read.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from .kv_cache import KVCache
from . import layers as _layers
from .layers import (DecoderLayer, Linear, RMSNorm, RotaryEmbedding, any_hook, differentiable,
                     head_dim_of, hook_dicts, layer_step)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def check_model_type(config) -> None:
    model_type = getattr(config, "model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"config.model_type: expected one of {SUPPORTED_MODEL_TYPES}, "
                         f"got {model_type!r}")


class Backbone(nn.Module):
    """Embeddings, decoder layers and final norm (transformers' ``model.`` prefix)."""

    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


def sliding_window(config) -> int | None:
    """The model's active sliding window; None when attention is full."""
    window = getattr(config, "sliding_window", None)
    return window if window is not None and getattr(config, "use_sliding_window", True) else None


class TargetModel(nn.Module):
    """A Llama-family causal LM whose attention runs through :mod:`eagle_kernels.ops`."""

    def __init__(self, config):
        super().__init__()
        check_model_type(config)
        self.config = config
        self.model = Backbone(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    # ---------------------------------------------------------------- shapes the runtime needs
    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def eagle3_feature_layers(self) -> tuple[int, int, int]:
        """Layers whose inputs EAGLE-3 fuses: 2, N // 2 and N - 3 (as the official code)."""
        n = self.num_layers
        if not 2 < n // 2 < n - 3:
            raise ValueError(f"target: EAGLE-3 needs layers 2, N//2 and N-3 to be distinct "
                             f"(N >= 7), the target has {n} layers")
        return (2, n // 2, n - 3)

    def allocate_cache(self, batch: int, max_len: int, used: int | None = None) -> KVCache:
        """A static cache of ``max_len`` positions per sequence. ``used`` (default max_len):
        the positions whose outputs the caller keeps; past an active sliding window they are
        refused (sliding-window attention is not implemented: full attention equals it only
        within the window). The generation loop's room for a verify tree past prompt + budget
        holds nodes whose outputs decide no recorded token, so it may lie past the window."""
        window = sliding_window(self.config)
        used = max_len if used is None else used
        if window is not None and used > window:
            raise ValueError(f"max_len: {used} exceeds the model's sliding_window {window}; "
                             f"sliding-window attention is not implemented, keep prompt + new "
                             f"tokens within the window")
        return KVCache.allocate(self.num_layers, batch, max_len, self.config.num_key_value_heads,
                                head_dim_of(self.config), self.dtype, self.device)

    # ---------------------------------------------------------------------------- forward
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache,
                tree_mask: torch.Tensor, feature_layers: tuple[int, ...] = ()):
        """Run T new tokens per sequence over the cache.

        Parameters
        ----------
        input_ids : [B, T] int64 tokens; their K/V are written at ``[cache.lens, cache.lens+T)``.
        positions : [B, T] int64 RoPE positions (``cache.lens + depth`` for a tree).
        cache : the static KV cache; ``cache.lens`` is read, not advanced (the caller commits).
        tree_mask : [B, T, ceil(T / 32)] int32 packed visibility among the new tokens.
        feature_layers : indices of layers whose *inputs* to return (EAGLE-3 features).

        Returns
        -------
        hidden : [B, T, H] final-normed hidden states (EAGLE-1's feature; ``logits(hidden)``).
        features : [B, T, F * H], the inputs of the F distinct layers of ``feature_layers``
            within [0, num_layers) concatenated in increasing layer order, or None when there
            are none.
        """
        x = self.model.embed_tokens(input_ids)
        rope = self.model.rotary_emb.tables(positions, x.dtype, cache.max_len)
        step = layer_step(x, rope, cache, tree_mask)  # checked once for every layer
        bound = self._fused_weights() if step is not None else None
        norm = self.model.norm
        if bound is not None:  # one C++ call: the layers, the features, the final norm
            capture = [i for i in feature_layers if 0 <= i < len(bound)]
            norm_apart = bool(not isinstance(norm, RMSNorm) or norm._forward_hooks
                              or norm._forward_pre_hooks or differentiable(norm.weight))
            result = step.run_layers(bound, x.contiguous(), cache.keys, cache.values,
                                     capture=capture,
                                     final_norm=None if norm_apart else (norm.weight, norm.eps))
            x, features = result if capture else (result, None)
            return (norm(x) if norm_apart else x), features
        captured = []
        if step is None and self._runs_apart():
            x, residual = self._layers_apart(x, rope, cache, tree_mask, feature_layers, captured)
            normed = norm(x) if residual is None else norm(x, residual=residual)[0]
        else:
            for index, layer in enumerate(self.model.layers):
                if index in feature_layers:
                    captured.append(x)
                x = layer(x, rope, cache, tree_mask, step=step)
            normed = norm(x)
        features = torch.cat(captured, dim=-1) if captured else None
        return normed, features

    def _layers_apart(self, x, rope, cache, tree_mask, feature_layers, captured):
        """The layers op by op with the residual stream kept apart (DecoderLayer.apart): each
        layer's residual add done by the next norm. Returns the last (MLP output, stream),
        whose sum is the last layer's output (residual None: no layers); appends the inputs of
        ``feature_layers`` to ``captured``."""
        residual = None
        for index, layer in enumerate(self.model.layers):
            x, residual, layer_input = layer.apart(x, residual, rope, cache, tree_mask)
            if index in feature_layers:
                captured.append(layer_input)
        return x, residual

    def _kept(self, name: str, build, keep: bool = True):
        """``build()``'s answer about the layers' structure, kept under ``name`` until the
        structure changes; with ``keep`` False built afresh, neither read nor kept. The layers
        themselves are part of the key (held, so compared by identity): deleting or inserting
        into a ModuleList bypasses the registration hooks that bump the stamp."""
        stamp, current = _layers._STRUCTURE_CHANGES[0], tuple(self.model.layers)
        cached = self.__dict__.get(name)
        if (keep and cached is not None and cached[0] == stamp and len(cached[1]) == len(current)
                and all(a is b for a, b in zip(cached[1], current))):
            return cached[2]
        answer = build()
        if keep:
            self.__dict__[name] = (stamp, current, answer)
        return answer

    def _runs_apart(self) -> bool:
        """Whether the layers may run with their residual stream apart: what that changes (each
        layer's forward not called, its input norm and the final norm called with a residual)
        must be unseen. So every layer exactly a DecoderLayer, its input norm and the final norm
        exactly RMSNorms (or no input norm), none with a forward of its own, and no forward hook
        on any of them (a hook expects each layer's whole output, one call each)."""
        changed = self._kept("_apart_kept", self._apart_modules)
        return changed is not None and not _watched(*changed)

    def _apart_modules(self) -> tuple | None:
        """(hook dicts, modules) of the modules whose calls running apart changes, or None where
        the structure forbids it (a layer not exactly a DecoderLayer, a norm not exactly an
        RMSNorm)."""
        layers, norms = self.model.layers, [self.model.norm]
        if any(type(layer) is not DecoderLayer for layer in layers):
            return None
        norms += [layer.input_layernorm for layer in layers
                  if getattr(layer, "input_layernorm", None) is not None]
        if any(type(norm) is not RMSNorm for norm in norms):
            return None
        changed = (*layers, *norms)
        return hook_dicts(changed), changed

    def _fused_weights(self) -> list | None:
        """Every layer's :class:`eagle_kernels.ops.LayerWeights` when all run fused, else None
        (also when a forward hook watches a layer or a module inside one, or a layer has a
        forward of its own: the stacked call would skip them)."""
        def build():
            bound = [layer.fused_weights() for layer in self.model.layers]
            # the hooks of every module inside the layers (~400 at 30 layers): listed once, read
            # each call (filled in place when a hook is registered)
            hooks = hook_dicts(m for layer in self.model.layers for m in layer.modules())
            return (None if any(b is None for b in bound) else bound), hooks

        # Without grad mode the list depends only on the modules' structure: kept (asking 30
        # layers again took ~0.3 ms of a 15 ms decode step, every step). In grad mode asked
        # afresh: weights that need grad bind to None (autograd must see the layers).
        bound, hooks = self._kept("_fused_layers", build, keep=not torch.is_grad_enabled())
        return None if _watched(hooks, self.model.layers) else bound

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of final-normed hidden states, in fp32."""
        return self.lm_head(hidden).float()


def _watched(hooks: tuple, called_modules) -> bool:
    """Whether running ``called_modules`` other than by calling them would be seen: a forward
    hook in ``hooks`` (:func:`hook_dicts`) or a global one, or a forward set on one of
    ``called_modules``' instances."""
    return any_hook(hooks) or any("forward" in module.__dict__ for module in called_modules)


# ------------------------------------------------------------------------------- loading


def _read_safetensors_dir(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"path: no *.safetensors file in {path}")
    state = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except SafetensorError as error:  # a plain Exception: the CLI would print a traceback
            raise ValueError(f"path: {file} is not a readable safetensors file ({error})") \
                from None
    return state


def load_state(model: nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Load ``state`` strictly, raising ValueError that lists missing and unexpected keys."""
    expected = set(model.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{what}: checkpoint keys do not match the model: missing "
                         f"{missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected "
                         f"{unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
    for name, tensor in model.state_dict().items():
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise ValueError(f"{what}: {name} has shape {tuple(state[name].shape)}, "
                             f"expected {tuple(tensor.shape)} from its config")
    model.load_state_dict(state, strict=True)


def target_from_state(config, state: dict[str, torch.Tensor], dtype: torch.dtype,
                      device: torch.device | str) -> TargetModel:
    """Build a :class:`TargetModel` from a config and a transformers-named state dict."""
    check_model_type(config)
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if getattr(config, "tie_word_embeddings", False) and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: one tensor
    with torch.device("meta"):
        model = TargetModel(config)
    model = model.to_empty(device="cpu")
    model.model.rotary_emb = RotaryEmbedding(config)
    load_state(model, state, "target checkpoint")
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()


def load_target(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", gguf_file: str | None = None) -> TargetModel:
    """Load a target model from a HF checkpoint directory, or from a GGUF file.

    ``path`` is a directory with ``config.json`` and ``*.safetensors``; with ``gguf_file`` (or a
    ``path`` ending in ``.gguf``) the weights are read (and dequantised) by transformers.
    """
    path = Path(path)
    if gguf_file is None and path.suffix == ".gguf":
        path, gguf_file = path.parent, path.name
    if gguf_file is not None:
        from .default_model import load_gguf_model

        hf_model, _ = load_gguf_model(path / gguf_file, dtype=torch.float32)
        return target_from_state(hf_model.config, hf_model.state_dict(), dtype, device)
    if not (path / "config.json").is_file():
        raise ValueError(f"path: expected a checkpoint directory with config.json, got {path}")
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    return target_from_state(config, _read_safetensors_dir(path), dtype, device)

