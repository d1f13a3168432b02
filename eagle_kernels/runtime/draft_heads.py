"""EAGLE draft heads that load the official SafeAILab/EAGLE checkpoints unchanged.

A head reads pairs (feature of target position t, token at t + 1) and predicts token t + 2.
Both kinds share one interface the drafting loop uses:

* ``project(target_features)``: the target's features -> the head's hidden input;
* ``forward(tokens, hidden, positions, cache, tree_mask, tree_offset)`` -> the head's output
  hidden [B, T, H], which is also the hidden input of the next drafting step;
* ``draft_logits(out_hidden)`` -> [..., draft_vocab] fp32; ``d2t`` maps draft ids to target ids
  (None when the draft vocabulary is the target's).

EAGLE-1/2 (``fc``, ``layers.0.*``): fc over concat(embedding, feature) (bias optional), one
decoder layer without input_layernorm, logits by the target's lm_head; the feature is the
target's final-normed hidden state.
EAGLE-3 (``fc``, ``midlayer.*``, ``norm``, ``lm_head``, ``d2t``, ``t2d``): fc over the
concatenated inputs of target layers 2, N//2, N-3; the midlayer's attention reads
concat(input_layernorm(embedding), hidden_norm(hidden)) (2H wide); own norm and lm_head over a
draft vocabulary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ..ops._validate import check_eps
from .kv_cache import KVCache
from .layers import (MLP, Attention, DecoderLayer, Linear, RMSNorm, RotaryEmbedding,
                     fused_layer, head_dim_of, layer_step, rope_parameters)
from .model import TargetModel, load_state

EAGLE1 = "eagle1"
EAGLE3 = "eagle3"


class DraftHead(nn.Module):
    """What both head kinds share: the target's embedding, RoPE, a one-layer KV cache."""

    kind: str
    feature_layers: tuple[int, ...] = ()

    def __init__(self, config, target: TargetModel):
        super().__init__()
        self.config = config
        self.rotary_emb = RotaryEmbedding(config)
        # The target's embedding is shared, not copied (official heads freeze it).
        self._target = [target]

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self._target[0].model.embed_tokens

    def d2t_offsets(self) -> torch.Tensor | None:
        """The ``d2t`` the top-k op takes, or None when draft ids are target ids."""
        return None

    def allocate_cache(self, batch: int, max_len: int) -> KVCache:
        weight = self.fc.weight
        return KVCache.allocate(1, batch, max_len, self.config.num_key_value_heads,
                                head_dim_of(self.config), weight.dtype, weight.device)


class Eagle1Head(DraftHead):
    """EAGLE-1/2 head: ``fc(concat(embed(token), feature))`` -> one decoder layer."""

    kind = EAGLE1

    def __init__(self, config, target: TargetModel, bias: bool = True):
        super().__init__(config, target)
        self.fc = Linear(2 * config.hidden_size, config.hidden_size, bias=bias)
        self.layers = nn.ModuleList([DecoderLayer(config, 0, input_norm=False)])

    def project(self, target_hidden: torch.Tensor, target_features=None) -> torch.Tensor:
        return target_hidden

    def forward(self, tokens, hidden, positions, cache, tree_mask, tree_offset: int = 0):
        x = self.fc(torch.cat([self.embed_tokens(tokens).to(hidden.dtype), hidden], dim=-1))
        rope = self.rotary_emb.tables(positions, x.dtype, cache.max_len)
        return self.layers[0](x, rope, cache, tree_mask, tree_offset)

    def draft_logits(self, out_hidden: torch.Tensor) -> torch.Tensor:
        return self._target[0].logits(out_hidden)


class Eagle3MidLayer(nn.Module):
    """EAGLE-3's decoder layer: attention over concat(norm(embedding), norm(hidden))."""

    def __init__(self, config):
        super().__init__()
        self.self_attn = Attention(config, 0, input_size=2 * config.hidden_size)
        self.mlp = MLP(config)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embedded, hidden, rope, cache, tree_mask, tree_offset: int = 0):
        both = torch.cat([self.input_layernorm(embedded), self.hidden_norm(hidden)], dim=-1)
        step = layer_step(both, rope, cache, tree_mask, tree_offset)
        fused = fused_layer(self, both, self.self_attn, self.mlp, self.post_attention_layernorm,
                            None, step, cache, residual=hidden)
        if fused is not None:
            return fused
        attended = self.self_attn(both, rope, cache, tree_mask, tree_offset)
        normed, h = self.post_attention_layernorm(attended, residual=hidden)
        return h + self.mlp(normed)


FEATURE_IDS = "eagle_aux_hidden_state_layer_ids"


def draft_vocab_of(config) -> int:
    """An EAGLE-3 head's vocabulary: its config's draft_vocab_size, else the target's."""
    return getattr(config, "draft_vocab_size", None) or config.vocab_size


def eagle3_feature_layers(config, target: TargetModel) -> tuple[int, ...]:
    """The target layers whose inputs an EAGLE-3 head fuses, from its config where it names
    them, in either format: a top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM's: the
    layers whose inputs it captures) or ``eagle_config.eagle_aux_hidden_state_layer_ids``
    (SpecForge / SGLang: the layers whose outputs it takes, i.e. the inputs of id + 1); else
    the official code's 2, N // 2 and N - 3."""
    n = target.num_layers
    eagle = getattr(config, "eagle_config", None)
    nested = eagle.get(FEATURE_IDS) if isinstance(eagle, dict) else None
    top = getattr(config, FEATURE_IDS, None)
    found = [_feature_ids(FEATURE_IDS, top, n - 1, 0, n),
             _feature_ids(f"eagle_config.{FEATURE_IDS}", nested, n - 2, 1, n)]
    found = [layers for layers in found if layers is not None]
    if len(found) == 2 and found[0] != found[1]:
        raise ValueError(f"draft config.json: {FEATURE_IDS} and eagle_config.{FEATURE_IDS} name "
                         f"different layers ({top!r} inputs, {nested!r} outputs)")
    return found[0] if found else target.eagle3_feature_layers()


def _feature_ids(name: str, ids, high: int, shift: int, layers: int) -> tuple[int, ...] | None:
    """Three distinct ints in [0, high], shifted to the layers whose inputs they mean."""
    if ids is None:
        return None
    if not (isinstance(ids, list) and len(set(map(str, ids))) == len(ids) == 3 and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= high for i in ids)):
        raise ValueError(f"draft config.json: {name}: expected 3 distinct layer ids in "
                         f"[0, {high}] (the target has {layers} layers), got {ids!r}")
    return tuple(sorted(i + shift for i in ids))


class Eagle3Head(DraftHead):
    """EAGLE-3 head: ``fc`` over three target layers' inputs, ``midlayer``, own vocabulary."""

    kind = EAGLE3

    def __init__(self, config, target: TargetModel):
        super().__init__(config, target)
        target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        draft_vocab = draft_vocab_of(config)
        self.fc = Linear(3 * target_hidden, config.hidden_size, bias=False)
        self.midlayer = Eagle3MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = Linear(config.hidden_size, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.feature_layers = eagle3_feature_layers(config, target)

    def project(self, target_hidden, target_features: torch.Tensor) -> torch.Tensor:
        return self.fc(target_features)

    def forward(self, tokens, hidden, positions, cache, tree_mask, tree_offset: int = 0):
        embedded = self.embed_tokens(tokens).to(hidden.dtype)
        rope = self.rotary_emb.tables(positions, hidden.dtype, cache.max_len)
        return self.midlayer(embedded, hidden, rope, cache, tree_mask, tree_offset)

    def draft_logits(self, out_hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out_hidden)).float()

    def d2t_offsets(self) -> torch.Tensor | None:
        # As the official code: a draft vocabulary equal to the target's means no mapping.
        if self.lm_head.out_features == self.config.vocab_size:
            return None
        return self.d2t


def round_head_to_q8_0(head: DraftHead) -> int:
    """Round the head's own projection weights (fc, its layer's, an EAGLE-3 lm_head; never the
    target's shared embedding or lm_head) to Q8_0 values in place, so the cpu kernels stream them
    in 8 bits instead of bf16: drafting and the head's commit read ~0.56x the bytes. Lossy for the
    head only: every draft is still checked by the target, so the output is unchanged; the
    acceptance can move (bench_tau measures it). Returns how many weights were rounded (a
    weight :func:`~eagle_kernels.ops.decoder.round_to_q8_0` cannot round stays as it was)."""
    from ..ops.decoder import round_to_q8_0

    rounded = 0
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear) and module.weight.dtype == torch.float32:
                values = round_to_q8_0(module.weight)
                if values is not None:
                    module.weight.copy_(values)  # in place: bumps the version (packs are remade)
                    rounded += 1
    return rounded


# ----------------------------------------------------------------------------- checkpoints


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path / "model.safetensors"))
        except SafetensorError as error:
            raise ValueError(f"draft checkpoint {path / 'model.safetensors'}: not a readable "
                             f"safetensors file ({error})") from None
    if (path / "pytorch_model.bin").is_file():
        try:
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as error:  # pickle, zip and torch's weights-only errors alike
            message = " ".join(str(error).split())[:300]
            raise ValueError(f"draft checkpoint {path / 'pytorch_model.bin'}: not a readable "
                             f"weights file ({type(error).__name__}: {message})") from None
        if not isinstance(state, dict) or not all(
                isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
            raise ValueError(f"draft checkpoint {path / 'pytorch_model.bin'}: expected a dict of "
                             f"named tensors, got {type(state).__name__}")
        return state
    raise ValueError(f"draft: expected model.safetensors or pytorch_model.bin in {path}")


def _config_field_error() -> type:
    """The error newer transformers raise for a config field of the wrong type."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ValueError
    return StrictDataclassError


def _head_config(raw: dict):
    from transformers import LlamaConfig

    raw = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    return LlamaConfig(**raw)


def _check_head_config(path: Path, config) -> None:
    """What the head's layer runs with: an activation transformers knows (SiLU runs fused, any
    other op by op) and a finite eps >= 0."""
    from transformers.activations import ACT2FN

    act = getattr(config, "hidden_act", "silu")
    if not isinstance(act, str) or act not in ACT2FN:
        raise ValueError(f"draft {path / 'config.json'}: hidden_act: expected an activation "
                         f"name transformers knows (e.g. 'silu'), got {act!r}")
    try:
        check_eps("rms_norm_eps", config.rms_norm_eps)
    except (TypeError, ValueError) as error:
        raise ValueError(f"draft {path / 'config.json'}: {error}") from None


def _check_weights(path: Path, state: dict, target_vocab: int) -> None:
    """Finite weights; d2t offsets landing inside the target's vocabulary, on distinct ids, as
    t2d marks them."""
    for name, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"draft checkpoint {path}: {name} holds NaN or inf values")
    d2t = state.get("d2t")
    if d2t is not None:
        if d2t.dim() != 1 or d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
            raise ValueError(f"draft checkpoint {path}: d2t: expected a 1-D integer tensor "
                             f"(draft id -> target id offsets), got {d2t.dtype} of shape "
                             f"{tuple(d2t.shape)}")
        ids = torch.arange(d2t.shape[0]) + d2t.to(torch.int64)
        bad = (ids < 0) | (ids >= target_vocab)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0])
            raise ValueError(f"draft checkpoint {path}: d2t: draft id {i} + offset "
                             f"{int(d2t[i])} = {int(ids[i])} is outside the target's "
                             f"vocabulary [0, {target_vocab})")
        _check_vocab_map(path, ids, state.get("t2d"), target_vocab)


def _check_vocab_map(path: Path, ids: torch.Tensor, t2d, target_vocab: int) -> None:
    """Each target id drafted once, and t2d marking exactly the drafted ones.

    A repeated target id drafts the same token twice (a wasted tree branch); a t2d that
    disagrees with d2t masks the wrong positions of the training loss when training continues
    from this head. ``ids`` [draft_vocab] int64 are the target ids d2t maps to.
    """
    ordered = torch.sort(ids).values
    repeated = ordered[1:] == ordered[:-1]
    if bool(repeated.any()):
        token = int(ordered[1:][repeated][0])
        first, second = (int(i) for i in torch.nonzero(ids == token).flatten()[:2])
        raise ValueError(f"draft checkpoint {path}: d2t: draft ids {first} and {second} both "
                         f"map to target id {token}: expected each target id at most once")
    if t2d is None:
        return  # the mapping check names it where it is needed
    if t2d.dim() != 1 or t2d.is_floating_point() or t2d.is_complex() or \
            (t2d.dtype != torch.bool and bool(((t2d != 0) & (t2d != 1)).any())):
        raise ValueError(f"draft checkpoint {path}: t2d: expected a 1-D bool (or 0/1) tensor of "
                         f"the target ids kept in the draft vocabulary, got {t2d.dtype} of shape "
                         f"{tuple(t2d.shape)}")
    if t2d.shape[0] != target_vocab:
        return  # load_state names the shape
    kept = t2d.to(torch.bool)
    unmarked, marked = int((~kept[ids]).sum()), int(kept.sum())
    if unmarked or marked != ids.numel():
        raise ValueError(f"draft checkpoint {path}: t2d: expected True at exactly the "
                         f"{ids.numel()} target ids d2t maps to, got {marked} marked, "
                         f"{unmarked} of d2t's target ids unmarked")


def _check_against_target(kind: str, raw: dict, config, state: dict,
                          target: TargetModel) -> None:
    for key in ("vocab_size", "hidden_size"):  # else LlamaConfig's defaults would be checked
        if key not in raw:
            raise ValueError(f"draft config.json: expected a {key} (the target's "
                             f"{getattr(target, key)}), got none")
    if config.vocab_size != target.vocab_size:
        raise ValueError(f"draft config.vocab_size: expected the target's {target.vocab_size}, "
                         f"got {config.vocab_size}")
    if config.hidden_size != target.hidden_size:  # both kinds embed with the target's table
        raise ValueError(f"draft config.hidden_size: expected the target's {target.hidden_size}, "
                         f"got {config.hidden_size}")
    if kind == EAGLE3 and "fc.weight" in state:
        width = state["fc.weight"].shape[1]
        if width != 3 * target.hidden_size:
            raise ValueError(f"draft fc.weight: expected {3 * target.hidden_size} input columns "
                             f"(3 x the target's hidden size), got {width}")
    # not a LlamaConfig field, so transformers checks nothing of it: "576" or 576.0 reached
    # nn.Linear as a size (a TypeError), -1 torch.empty
    target_hidden = raw.get("target_hidden_size")
    if target_hidden is not None and (type(target_hidden) is not int
                                      or target_hidden != target.hidden_size):
        raise ValueError(f"draft config.target_hidden_size: expected the target's hidden size "
                         f"{target.hidden_size} (an int) or none, got {target_hidden!r}")
    embed = state.get("embed_tokens.weight")
    if embed is not None and tuple(embed.shape) != (target.vocab_size, target.hidden_size):
        raise ValueError(f"draft embed_tokens.weight: expected {(target.vocab_size, target.hidden_size)},"
                         f" got {tuple(embed.shape)}")


def load_draft_head(path: str | os.PathLike, target: TargetModel) -> DraftHead:
    """Load an official EAGLE-1/2 or EAGLE-3 head directory for ``target``.

    The kind is read from the weights (``midlayer.*`` keys mean EAGLE-3). An
    ``embed_tokens.weight`` in the checkpoint is checked against the target's and then dropped:
    the head always embeds with the target's table, as the official code does.
    """
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"draft: expected a directory with config.json, got {path}")
    with open(path / "config.json") as handle:
        try:
            raw = json.load(handle)
        except json.JSONDecodeError as error:
            raise ValueError(f"draft {path / 'config.json'}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"draft {path / 'config.json'}: expected a JSON object, got "
                         f"{type(raw).__name__}")
    state = _read_weights(path)
    kind = EAGLE3 if any(k.startswith("midlayer.") for k in state) else EAGLE1
    try:
        config = _head_config(raw)
    except (TypeError, ValueError, _config_field_error()) as error:  # transformers' checks
        message = " ".join(str(error).split())
        raise ValueError(f"draft {path / 'config.json'}: {message}") from None
    _check_head_config(path, config)
    _check_against_target(kind, raw, config, state, target)
    _check_weights(path, state, target.vocab_size)
    state.pop("embed_tokens.weight", None)
    if kind == EAGLE3:
        draft_vocab = draft_vocab_of(config)
        if isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int) or \
                not 1 <= draft_vocab <= config.vocab_size:
            raise ValueError(f"draft config.draft_vocab_size: expected 1 .. the target's "
                             f"{config.vocab_size} tokens, got {draft_vocab}")
        head = Eagle3Head(config, target)
        missing = [key for key in ("d2t", "t2d") if key not in state]
        if missing and draft_vocab < config.vocab_size:
            # Zero offsets would silently read draft id i as target id i: wrong tokens drafted.
            raise ValueError(
                f"draft checkpoint {path}: missing {' and '.join(missing)}: a draft vocabulary "
                f"of {draft_vocab} (draft_vocab_size) < the target's {config.vocab_size} tokens "
                f"needs d2t (draft id -> target id offsets) and t2d (target ids kept in the "
                f"draft vocabulary)")
        # A draft vocabulary equal to the target's needs no mapping: identity defaults.
        state.setdefault("d2t", torch.zeros_like(head.d2t))
        state.setdefault("t2d", torch.ones_like(head.t2d))
    else:
        head = Eagle1Head(config, target, bias="fc.bias" in state)
    state = {k: v.to(head.d2t.dtype) if k == "d2t" else v for k, v in state.items()}
    load_state(head, state, f"draft checkpoint {path}")
    return head.to(device=target.device, dtype=target.dtype).eval()


def head_config_dict(kind: str, target: TargetModel, draft_vocab: int | None = None) -> dict:
    """config.json of a new head for ``target`` in the official format."""
    cfg = target.config
    config = {
        "architectures": ["LlamaForCausalLMEagle3" if kind == EAGLE3 else "LlamaForCausalLM"],
        "model_type": "llama", "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": head_dim_of(cfg),
        "hidden_act": cfg.hidden_act, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings, "vocab_size": cfg.vocab_size,
        "num_hidden_layers": 1, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "pad_token_id": getattr(cfg, "pad_token_id", None), "torch_dtype": "float32",
        "rope_theta": rope_theta(cfg), "tie_word_embeddings": False,
    }
    if kind == EAGLE3:
        config["draft_vocab_size"] = draft_vocab or cfg.vocab_size
        config["target_hidden_size"] = cfg.hidden_size
    return config


def rope_theta(config) -> float:
    return float(rope_parameters(config).get("rope_theta", 10000.0))


def new_draft_head(kind: str, target: TargetModel, draft_vocab: int | None = None,
                   seed: int = 0) -> DraftHead:
    """A randomly initialised head for ``target`` (identity d2t when the vocabulary is shared)."""
    config = _head_config(head_config_dict(kind, target, draft_vocab))
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        head = Eagle3Head(config, target) if kind == EAGLE3 else Eagle1Head(config, target)
        if kind == EAGLE3:
            head.t2d.fill_(draft_vocab is None)
    finally:
        torch.random.set_rng_state(generator_state)
    return head.to(device=target.device, dtype=target.dtype).eval()


def _default_feature_layers(target: TargetModel) -> tuple[int, ...] | None:
    try:
        return target.eagle3_feature_layers()
    except ValueError:  # fewer than 7 layers: only a config's own ids can name them
        return None


def save_draft_head(head: DraftHead, path: str | os.PathLike,
                    dtype: torch.dtype | None = None) -> None:
    """Write ``head`` as config.json + model.safetensors with the official key names.

    ``dtype`` converts the floating-point weights (e.g. bfloat16 to halve the file)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    draft_vocab = head.lm_head.out_features if isinstance(head, Eagle3Head) else None
    config = head_config_dict(head.kind, head._target[0], draft_vocab)
    if head.kind == EAGLE3 and head.feature_layers != _default_feature_layers(head._target[0]):
        # a head loaded with its own feature layers keeps them (vLLM's format: layer inputs)
        config[FEATURE_IDS] = list(head.feature_layers)
    if dtype is not None:
        config["torch_dtype"] = str(dtype).removeprefix("torch.")
    with open(path / "config.json", "w") as handle:
        json.dump(config, handle, indent=2)
    state = {k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}
    if dtype is not None:
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(path / "model.safetensors"))
