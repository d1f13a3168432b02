"""User-facing API: load a target and a draft head, generate text, stream it.

    import eagle_kernels
    gen = eagle_kernels.from_pretrained()                 # SmolLM2-135M-Instruct + its head
    out = gen.generate("Why is the sky blue?", max_new_tokens=64)
    print(out.texts[0], out.stats.tau)

``target`` is a HF checkpoint directory, a ``.gguf`` file, or None for the default model;
``draft`` is an official EAGLE-1/2/3 head directory, ``"random-eagle3"`` / ``"random-eagle1"``
(a randomly initialised head: lossless, but it accepts almost nothing), ``None`` (the project's
bundled head for the default model when present) or ``"none"`` (autoregressive only).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch

from ..ops._validate import check_device, check_model_path
from .draft_heads import (EAGLE1, EAGLE3, DraftHead, load_draft_head, new_draft_head,
                          round_head_to_q8_0)
from .drafting import TreeConfig
from .generation import Engine, GenerationStats, GenerationStream, SamplingConfig
from .model import TargetModel, load_target
from .reply_store import ReplyStore
from .tree_budget import choose_tree

DRAFT_WEIGHTS = ("auto", "exact", "q8_0")  # how the head's weights are kept (from_pretrained)
TARGET_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what the target runs in
BUNDLED_HEADS = Path(__file__).resolve().parent.parent / "heads"
DEFAULT_HEAD = BUNDLED_HEADS / "smollm2-135m-instruct-eagle3"
BUNDLED_STORES = Path(__file__).resolve().parent.parent / "stores"
# the default target's own greedy replies to training-split prompts (see .reply_store)
DEFAULT_REPLY_STORE = BUNDLED_STORES / "smollm2-135m-instruct-replies.safetensors"


@dataclass
class TextOutput:
    texts: list[str]
    tokens: list[list[int]]
    stop_reasons: list[str]
    stats: GenerationStats


def _prompt_list(prompts) -> list[str]:
    """``prompts`` as a list of str, or a TypeError naming what came."""
    if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts: expected a str or a sequence of str, got "
                        f"{type(prompts).__name__}")
    for index, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise TypeError(f"prompts[{index}]: expected a str, got {type(prompt).__name__}")
    return list(prompts)


def _check_load_args(target, dtype, device) -> torch.device:
    """from_pretrained's target / dtype / device, before anything loads."""
    check_model_path("target", target)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype: expected a torch.dtype, got {type(dtype).__name__}")
    if dtype not in TARGET_DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(map(str, TARGET_DTYPES))}, got "
                         f"{dtype}")
    return check_device("device", device)


def load_target_and_tokenizer(target, dtype, device):
    """(model, tokenizer, whether it is the default model: the one the bundled head is for)."""
    from transformers import AutoTokenizer

    _check_load_args(target, dtype, device)
    is_default = target is None
    if is_default:
        from .default_model import default_model_dir

        target = default_model_dir()
    path = Path(target)
    tokenizer_dir = path.parent if path.suffix == ".gguf" else path
    kwargs = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True, **kwargs)
    return load_target(path, dtype=dtype, device=device), tokenizer, is_default


SPECIAL_DRAFTS = ("none", "random-eagle3", "random-eagle1")
TREE_NAMES = ("auto", "default")


def check_draft_and_tree(draft, tree) -> None:
    """``draft`` and ``tree`` as from_pretrained / from_hf take them, checked before any model
    loads (a bad one would otherwise fail only after the target's seconds of loading)."""
    if draft is not None and not isinstance(draft, (str, os.PathLike)):
        raise TypeError(f"draft: expected an EAGLE head directory, one of "
                        f"{', '.join(SPECIAL_DRAFTS)} or None, got {type(draft).__name__}")
    if draft is not None and draft not in SPECIAL_DRAFTS and \
            (not os.fspath(draft) or not (Path(draft) / "config.json").is_file()):
        raise ValueError(f"draft: expected an EAGLE head directory with config.json or one of "
                         f"{', '.join(SPECIAL_DRAFTS)}, got {str(draft)!r}")
    if not (tree is None or isinstance(tree, (TreeConfig, str))):
        raise TypeError(f"tree: expected a TreeConfig, 'auto', 'default' or None, got "
                        f"{type(tree).__name__}")
    if isinstance(tree, str) and tree not in TREE_NAMES:
        raise ValueError(f"tree: expected a TreeConfig, 'auto', 'default' or None, got {tree!r}")


def _load_head(draft, model: TargetModel, default_target: bool) -> DraftHead | None:
    if draft == "none":
        return None
    if draft in ("random-eagle3", "random-eagle1"):
        return new_draft_head(EAGLE3 if draft.endswith("3") else EAGLE1, model)
    if draft is None:
        if default_target and (DEFAULT_HEAD / "config.json").is_file():
            return load_draft_head(DEFAULT_HEAD, model)
        warnings.warn("no trained draft head for this target: using a randomly initialised "
                      "EAGLE-3 head (output stays exact, but it accepts almost nothing)")
        return new_draft_head(EAGLE3, model)
    return load_draft_head(draft, model)


def _default_reply_store(model: TargetModel) -> ReplyStore | None:
    """The default target's bundled reply store (0.4-1 s to load on a 2-core VM, its table
    built); None, with a warning, where the install lacks it."""
    if not DEFAULT_REPLY_STORE.is_file():
        warnings.warn(f"no reply store at {DEFAULT_REPLY_STORE} (an incomplete install?): plain "
                      f"steps draft from the context only")
        return None
    return ReplyStore.load(DEFAULT_REPLY_STORE, model.vocab_size)


def _store_head_weights(head: DraftHead | None, draft_weights: str) -> str:
    """``"q8_0"`` rounds the head's projections to Q8_0 values (:func:`round_head_to_q8_0`:
    the cpu kernels stream them in 8 bits; an fp32 head only); ``"auto"`` does so for an fp32
    head on the cpu, where drafting streams the head's weights from DRAM; ``"exact"`` keeps
    them. Returns what was applied: ``"q8_0"`` or ``"exact"``."""
    if head is None or draft_weights == "exact":
        return "exact"
    weight = head.fc.weight
    if draft_weights == "q8_0" and weight.dtype != torch.float32:
        raise ValueError(f"draft_weights: 'q8_0' rounds an fp32 head, this one is {weight.dtype} "
                         f"(load it with dtype=torch.float32, or keep 'exact')")
    if draft_weights == "auto" and (weight.device.type != "cpu" or weight.dtype != torch.float32):
        return "exact"
    round_head_to_q8_0(head)
    return "q8_0"


class EagleGenerator:
    """Tokenizer + :class:`~.generation.Engine`, with text in and text out."""

    def __init__(self, engine: Engine, tokenizer):
        self.engine = engine
        self.tokenizer = tokenizer
        self.draft_weights = "exact"  # how the head's weights are kept: "exact" or "q8_0"
        self.budget = None  # the tree budget (AdaptiveTree) of set_tree("auto")

    @classmethod
    def from_pretrained(cls, target: str | os.PathLike | None = None, draft: str | None = None,
                        dtype: torch.dtype = torch.float32, device: str = "cpu",
                        tree: TreeConfig | str | None = "default",
                        draft_weights: str = "auto") -> "EagleGenerator":
        """Load target (+ head). ``tree``: see :meth:`set_tree` (the default: the measured
        tree on a CPU, EAGLE-2's 10/6/60 in CUDA graphs on a GPU).
        ``draft_weights``: ``"auto"`` (Q8_0 for an fp32 head on the cpu), ``"q8_0"`` or
        ``"exact"`` (the checkpoint's values); the output is the target's either way. The
        default target with a head also gets its bundled reply store (``engine.reply_store``,
        drafts for plain steps: see :mod:`.reply_store`; set it to None to go without)."""
        if not isinstance(draft_weights, str):
            raise TypeError(f"draft_weights: expected one of {', '.join(DRAFT_WEIGHTS)}, got "
                            f"{type(draft_weights).__name__}")
        if draft_weights not in DRAFT_WEIGHTS:
            raise ValueError(f"draft_weights: expected one of {', '.join(DRAFT_WEIGHTS)}, "
                             f"got {draft_weights!r}")
        check_draft_and_tree(draft, tree)
        # Ordinary tensors even when called under torch.inference_mode: inference tensors have
        # no version counter, so the cpu kernels could not keep their packed weights.
        with torch.inference_mode(False):
            model, tokenizer, default_target = load_target_and_tokenizer(target, dtype, device)
            head = _load_head(draft, model, default_target)
            applied = _store_head_weights(head, draft_weights)
        store = _default_reply_store(model) if default_target and head is not None else None
        engine = Engine(model, head, reply_store=store)
        generator = cls(engine, tokenizer)
        generator.draft_weights = applied
        generator.set_tree(tree)
        return generator

    def set_tree(self, tree: TreeConfig | str | None) -> None:
        """``"auto"``: measure every candidate tree's cycle on this device and adapt the choice
        to the acceptance observed while generating (:class:`~.tree_budget.AdaptiveTree`,
        kept in ``self.budget``; a few seconds); a :class:`TreeConfig`: that tree; None:
        :class:`TreeConfig`'s, EAGLE-2's 10/6/60; ``"default"``: ``"auto"`` where the target
        runs on a CPU (10/6/60 runs ~6x slower than plain decoding on a 2-core CPU, which wants
        1-2 drafted tokens), None elsewhere (on a GPU 10/6/60 pays with most heads, and a fixed
        tree's cycles run in a CUDA graph, which the adaptive tree's eager loop gives up)."""
        engine = self.engine
        if tree == "default":
            tree = "auto" if engine.target.device.type == "cpu" else None
        check_draft_and_tree(None, tree)  # before anything changes: a bad tree keeps the old
        engine.tree_policy = None
        self.budget = None
        if tree == "auto" and engine.head is not None:
            self.budget = choose_tree(engine.target, engine.head)
            engine.tree_policy = self.budget
            engine.tree = self.budget.current
        elif isinstance(tree, TreeConfig):
            engine.tree = tree
        elif tree is None:
            engine.tree = TreeConfig()

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        """Token ids of ``prompt``, as a user turn of the chat template when ``chat``."""
        if not isinstance(chat, bool):  # "no" would read as True
            raise TypeError(f"chat: expected a bool, got {type(chat).__name__}")
        if chat and getattr(self.tokenizer, "chat_template", None):
            encoded = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True,
                return_dict=True)
            return list(encoded["input_ids"])
        if chat:  # said once per call site (warnings' default filter), not per prompt
            warnings.warn("chat: the tokenizer has no chat template, so the prompt is encoded as "
                          "raw text (chat=False says so and silences this)", stacklevel=3)
        return self.tokenizer(prompt)["input_ids"]

    def eos_token_ids(self) -> list[int]:
        """The tokenizer's and the target config's EOS ids, those the target can produce (a
        tokenizer paired with another model may name one past its vocabulary: never sampled,
        so leaving it out changes no output, where passing it would fail every call)."""
        ids = {self.tokenizer.eos_token_id}
        config_eos = self.engine.target.config.eos_token_id
        ids |= set(config_eos) if isinstance(config_eos, (list, tuple)) else {config_eos}
        vocab = self.engine.target.vocab_size
        return sorted(i for i in ids if isinstance(i, int) and 0 <= i < vocab)

    def generate(self, prompts: str | Sequence[str], max_new_tokens: int = 128,
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, chat: bool = True,
                 speculative: bool = True) -> TextOutput:
        """Generate replies for one prompt or a batch (prompts of any lengths)."""
        prompts = [prompts] if isinstance(prompts, str) else _prompt_list(prompts)
        ids = [self.encode(p, chat) for p in prompts]
        sampling = SamplingConfig(temperature, top_k, top_p, seed)
        out = self.engine.generate(ids, max_new_tokens, sampling, self.eos_token_ids(), speculative)
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
        return TextOutput(texts, out.tokens, out.stop_reasons, out.stats)

    def stream(self, prompt: str, max_new_tokens: int = 128, temperature: float = 0.0,
               top_k: int = 0, top_p: float = 1.0, seed: int | None = None, chat: bool = True,
               speculative: bool = True) -> "TextStream":
        """Iterate over the reply's text as it grows (one piece per cycle); the returned
        :class:`TextStream`'s ``output`` holds the whole :class:`TextOutput` once exhausted."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt: expected one str (stream takes one prompt; generate takes a "
                            f"batch), got {type(prompt).__name__}")
        sampling = SamplingConfig(temperature, top_k, top_p, seed)
        tokens = self.engine.stream([self.encode(prompt, chat)], max_new_tokens, sampling,
                                    self.eos_token_ids(), speculative)
        return TextStream(self.tokenizer, tokens)


class TextStream:
    """Text pieces of one streamed reply; ``output`` (a :class:`TextOutput`) once exhausted.

    The call's results live here, not on the engine, so streams and other calls on the same
    generator may interleave.
    """

    def __init__(self, tokenizer, tokens: GenerationStream):
        self._tokenizer, self._tokens = tokenizer, tokens
        self._pieces = self._texts()

    def _texts(self) -> Iterator[str]:
        tokens: list[int] = []
        shown = text = ""
        for new in self._tokens:
            tokens += new[0]
            text = self._tokenizer.decode(tokens, skip_special_tokens=True)
            # A multi-byte character split across cycles decodes to U+FFFD: hold back the
            # trailing ones (the rest may come next cycle), show everything before them.
            ready = text.rstrip("\ufffd")
            if len(ready) > len(shown):
                yield ready[len(shown):]
                shown = ready
        if len(text) > len(shown):  # the reply ended mid-character: what output.texts holds
            yield text[len(shown):]

    def __iter__(self) -> "TextStream":
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    @property
    def output(self) -> TextOutput:
        out = self._tokens.output
        texts = [self._tokenizer.decode(t, skip_special_tokens=True) for t in out.tokens]
        return TextOutput(texts, out.tokens, out.stop_reasons, out.stats)


def from_pretrained(target=None, draft=None, dtype=torch.float32, device="cpu",
                    tree="default", draft_weights="auto") -> EagleGenerator:
    """Shortcut for :meth:`EagleGenerator.from_pretrained`."""
    return EagleGenerator.from_pretrained(target, draft, dtype, device, tree, draft_weights)
