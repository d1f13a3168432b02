"""Wrap a transformers model that is already loaded: ``eagle_kernels.from_hf(model, tokenizer)``.

    from transformers import AutoModelForCausalLM, AutoTokenizer
    import eagle_kernels
    model = AutoModelForCausalLM.from_pretrained(path)        # Llama / Qwen2 / Mistral
    tokenizer = AutoTokenizer.from_pretrained(path)
    gen = eagle_kernels.from_hf(model, tokenizer, draft="path/to/eagle3-head")
    print(gen.generate("Why is the sky blue?").texts[0])

The runtime's :class:`~.model.TargetModel` is built around the HF model's own weight tensors
(no copy, no second load: every parameter shares storage with the HF model's, so both see
in-place updates and memory is paid once). Parameter names are transformers', which is how
:func:`~.model.load_target` reads checkpoints too. The target runs in the HF model's dtype and
on its device; move the HF model first (``model.to("cuda", torch.bfloat16)``) to change them.
"""

from __future__ import annotations

import torch

from ..ops._validate import check_device
from .api import TARGET_DTYPES, EagleGenerator, _load_head, check_draft_and_tree
from .drafting import TreeConfig
from .generation import Engine
from .layers import RotaryEmbedding
from .model import TargetModel, check_model_type


def target_from_hf(hf_model) -> TargetModel:
    """A :class:`TargetModel` whose parameters share storage with ``hf_model``'s.

    ``hf_model`` is a transformers ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` /
    ``MistralForCausalLM`` (what ``AutoModelForCausalLM`` returns for those checkpoints), with
    its weights materialised on one device (no ``device_map`` offload, no quantisation).
    """
    config = getattr(hf_model, "config", None)
    if config is None or not isinstance(hf_model, torch.nn.Module):
        raise TypeError(f"model: expected a transformers *ForCausalLM module, got "
                        f"{type(hf_model).__name__}")
    check_model_type(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {name: tensor for name, tensor in hf_model.state_dict().items()
             if "rotary_emb" not in name}
    if tied and "lm_head.weight" not in state and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):
        model = TargetModel(config)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"model: parameters do not match a {config.model_type} target (is it a "
                         f"*ForCausalLM?): missing {missing[:8]}, unexpected {unexpected[:8]}")
    devices, dtypes = set(), set()
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"model: {name} has shape {tuple(tensor.shape)}, expected "
                             f"{tuple(expected[name].shape)} from its config")
        devices.add(tensor.device)
        dtypes.add(tensor.dtype)
    if len(devices) != 1 or torch.device("meta") in devices:
        raise ValueError(f"model: expected every weight materialised on one device, got "
                         f"{sorted(map(str, devices))} (load it without device_map offload)")
    if len(dtypes) != 1 or next(iter(dtypes)) not in TARGET_DTYPES:
        raise ValueError(f"model: expected one dtype of {', '.join(map(str, TARGET_DTYPES))} "
                         f"for every weight, got {sorted(map(str, dtypes))} (quantised models "
                         f"are not supported)")
    # assign=True: the module's parameters become Parameters over the HF tensors' storage.
    model.load_state_dict(state, strict=True, assign=True)
    model.model.rotary_emb = RotaryEmbedding(config).to(next(iter(devices)))
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.requires_grad_(False).eval()


def from_hf(model, tokenizer, draft: str | None = None,
            tree: TreeConfig | str | None = "default",
            dtype: torch.dtype | None = None, device: str | torch.device | None = None
            ) -> EagleGenerator:
    """An :class:`~.api.EagleGenerator` (``generate`` / ``stream``) over a loaded HF model.

    Parameters
    ----------
    model : transformers ``*ForCausalLM`` (Llama, Qwen2, Mistral); its weights are shared.
    tokenizer : its tokenizer (chat template used by ``generate(..., chat=True)``).
    draft, tree : as :func:`~.api.from_pretrained`: an EAGLE head directory,
        ``"random-eagle3"`` / ``"random-eagle1"``, ``"none"`` (autoregressive only) or None
        (a random EAGLE-3 head, with a warning); ``"default"``, ``"auto"``, a
        :class:`TreeConfig` or None.
    dtype, device : optional checks only: sharing the weights means running in the model's
        own dtype and device, so a different value raises (move the HF model first).
    """
    check_draft_and_tree(draft, tree)
    if not callable(tokenizer):
        raise TypeError(f"tokenizer: expected the model's tokenizer (callable), got "
                        f"{type(tokenizer).__name__}")
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype or None, got {type(dtype).__name__}")
    if device is not None:
        check_device("device", device)
    target = target_from_hf(model)
    if dtype is not None and dtype != target.dtype:
        raise ValueError(f"dtype: the model's weights are {target.dtype}; from_hf shares them "
                         f"and does not convert (call model.to({dtype}) first)")
    if device is not None and torch.device(device) != target.device and not (
            torch.device(device).index is None and torch.device(device).type == target.device.type):
        raise ValueError(f"device: the model's weights are on {target.device}; from_hf shares "
                         f"them and does not move them (call model.to({str(device)!r}) first)")
    head = _load_head(draft, target, default_target=False)
    engine = Engine(target, head)
    generator = EagleGenerator(engine, tokenizer)
    generator.set_tree(tree)
    return generator
