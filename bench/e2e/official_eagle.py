"""Load the official EAGLE code (github.com/SafeAILab/EAGLE) as a peer to time beside ours.

Nothing of it is copied here: ``load(repo, ...)`` imports ``eagle.model.ea_model.EaModel`` from
the user's checkout of that repository and returns it ready for ``eagenerate`` (EAGLE-1/2/3
speculative decoding) and ``naivegenerate`` (its own plain decoding). The official code is
written against transformers 4.x; with transformers 5 its Llama path runs once these
differences are bridged, none of which touches its drafting, tree or verification:

1. ``ea_model`` imports its Qwen2 / Qwen3 / Mixtral files, which import transformers modules
   that version 5 removed: stand-in modules replace those three (a Llama target needs none).
2. transformers 5 wants ``_tied_weights_keys`` as a mapping (the official class has a list):
   lm_head <- embed_tokens where the target's config ties them, else none.
3. transformers 5 keeps ``rope_theta`` in ``config.rope_parameters``; the official layers read
   ``config.rope_theta`` / ``config.rope_scaling``: both set from it (target and head).
4. transformers 5 builds a model on the meta device and loads the checkpoint's tensors into
   it, so tensors a module computes in ``__init__`` (the rotary ``inv_freq`` and cos / sin
   tables) come out unset: every target layer's rotary embedding is built again after loading.
5. An EAGLE-3 config with ``target_hidden_size`` (ours, SpecForge's) makes the official head
   expect its token embedding in the checkpoint, while its own checkpoints leave it out and
   load the target's; the head is loaded from a temporary folder whose config drops the key,
   and the target from one holding a ``model.safetensors.index.json`` (the official head finds
   the target's embedding through that index; a single-file checkpoint has none).

The greedy outputs show the bridge is sound: the official EAGLE output equals the official
plain output, and both equal this runtime's (bench_official_eagle.py counts it per prompt).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch

# (module, class) of the official model files a Llama target does not need
_UNUSED_TARGETS = (("modeling_mixtral_kv", "MixtralForCausalLM"),
                   ("modeling_qwen2_kv", "Qwen2ForCausalLM"),
                   ("modeling_qwen3_kv", "Qwen3ForCausalLM"))


def _import_official(repo: Path):
    """``(ea_model, modeling_llama_kv, configs)`` modules of the checkout at ``repo``."""
    if not (repo / "eagle" / "model" / "ea_model.py").is_file():
        raise ValueError(f"--official-eagle: expected a checkout of SafeAILab/EAGLE (with "
                         f"eagle/model/ea_model.py), got {repo}")
    sys.path.insert(0, str(repo))
    for module, name in _UNUSED_TARGETS:  # bridge 1
        stand_in = types.ModuleType(f"eagle.model.{module}")
        setattr(stand_in, name, type(name, (), {}))
        sys.modules.setdefault(stand_in.__name__, stand_in)
    from eagle.model import configs, ea_model, modeling_llama_kv

    return ea_model, modeling_llama_kv, configs


def _with_rope_attributes(config):
    """Bridge 3: ``rope_theta`` and ``rope_scaling`` (None: plain RoPE) where the official
    layers look for them."""
    parameters = getattr(config, "rope_parameters", None) or {}
    if parameters.get("rope_type", "default") != "default":
        raise ValueError(f"official EAGLE bridge: only plain RoPE is bridged, the target has "
                         f"rope_type {parameters['rope_type']!r}")
    config.rope_theta = parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    config.rope_scaling = None
    return config


def _temporary_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="official-eagle-"))
    atexit.register(shutil.rmtree, folder, True)  # links and two small JSON files
    return folder


def _staging(target_dir: Path, head_dir: Path) -> tuple[Path, Path]:
    """Bridge 5: temporary target and head folders of links to the real files."""
    target_stage, head_stage = _temporary_folder(), _temporary_folder()
    for entry in target_dir.iterdir():
        os.symlink(entry, target_stage / entry.name)
    index = target_stage / "model.safetensors.index.json"
    if not index.exists():
        index.write_text(json.dumps({"weight_map": {
            "model.embed_tokens.weight": "model.safetensors"}}))
    config = json.loads((head_dir / "config.json").read_text())
    target_hidden = config.pop("target_hidden_size", config.get("hidden_size"))
    if target_hidden != config.get("hidden_size"):  # the official head has one width for both
        raise ValueError(f"official EAGLE bridge: the head's target_hidden_size "
                         f"({target_hidden}) differs from its hidden_size "
                         f"({config.get('hidden_size')}), which the official head cannot load")
    (head_stage / "config.json").write_text(json.dumps(config))
    os.symlink(head_dir / "model.safetensors", head_stage / "model.safetensors")
    return target_stage, head_stage


def load(repo: str | os.PathLike, target_dir: str | os.PathLike, head_dir: str | os.PathLike,
         tree: tuple[int, int, int], dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The official ``EaModel`` (EAGLE-3) for a Llama target in HF format at ``target_dir``
    and an EAGLE-3 head at ``head_dir`` (config.json + model.safetensors), drafting trees of
    ``tree`` = (top_k, depth, total_tokens), its weights in ``dtype`` on ``device`` (the head
    follows the target's device, as the official code places it)."""
    ea_model, llama, configs = _import_official(Path(repo))
    from transformers import AutoConfig

    target_stage, head_stage = _staging(Path(target_dir), Path(head_dir))
    config = _with_rope_attributes(AutoConfig.from_pretrained(target_stage))
    llama.LlamaForCausalLM._tied_weights_keys = (  # bridge 2
        {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {})

    class BridgedConfig(configs.EConfig):
        @classmethod
        def from_pretrained(cls, *args, **kwargs):
            return _with_rope_attributes(configs.EConfig.from_pretrained(*args, **kwargs))

    ea_model.EConfig = BridgedConfig
    top_k, depth, total = tree
    model = ea_model.EaModel.from_pretrained(
        use_eagle3=True, base_model_path=str(target_stage), ea_model_path=str(head_stage),
        total_token=total, depth=depth, top_k=top_k, torch_dtype=dtype, config=config,
        device_map=device)
    for layer in model.base_model.model.layers:  # bridge 4
        attention = layer.self_attn
        attention.rotary_emb = llama.LlamaRotaryEmbedding(
            attention.head_dim, max_position_embeddings=attention.max_position_embeddings,
            base=config.rope_theta, device=device)
    return model.eval()


def set_tree(model, tree: tuple[int, int, int]) -> None:
    """Draft trees of ``tree`` = (top_k, depth, total_tokens) from now on (what the official
    ``EaModel`` sets from its ``total_token`` / ``depth`` / ``top_k`` arguments)."""
    top_k, depth, total = tree
    head = model.ea_layer
    head.top_k, head.depth, head.total_tokens = top_k, depth, total - 1
    head.init_tree()
