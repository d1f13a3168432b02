"""Train an EAGLE-3 (or EAGLE-1) draft head for a target: ``python -m eagle_kernels train``.

    python -m eagle_kernels train --out runs/smollm2-eagle3 --conversations 4000

Pipeline: ShareGPT train-split conversations rendered with the target's chat template (loss on
assistant tokens only; the held-out split is never read), the draft vocabulary from the
assistant-token frequencies of those conversations, target features computed online by the
runtime's model (one no-grad prefill per batch), the training-time-test loss of
:mod:`eagle_kernels.runtime.training`, AdamW with warm-up and cosine decay, tqdm progress.

Resumable: ``OUT/trainer_state.pt`` (head, optimiser, step, settings, the values of the settings
resolved from the device, data key) is written every ``--save-every`` steps and at the end;
running the same command again continues from it (the batch order and each step's random draws
are functions of the seed and the step, so the resumed run ends where an uninterrupted one does).
A resume with other run-defining settings (``--ttt-steps 0`` compared by the steps it resolves
to on each device), data or target is refused by name (:func:`check_resume`); the log is cut
back to the saved step.
The head is exported in the official format (``OUT/config.json`` + ``OUT/model.safetensors``)
at every save, in ``--export-dtype``.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .ops import op_backends
from .ops._validate import check_eps, check_int, check_positive, no_value_checks
from .runtime.draft_heads import EAGLE1, EAGLE3, new_draft_head, save_draft_head
from .runtime.model import TargetModel
from .runtime import training

STATE_FILE = "trainer_state.pt"
DATA_FILE = "dataset.pt"
CACHE_DIR = "target_cache"
LOG_FILE = "train_log.jsonl"
INIT_NORM_SCALE = 0.25  # see init_head
CPU_TTT_STEPS = 4  # see default_ttt_steps
EXPORT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
EAGLE3_ONLY = ("draft_vocab", "ttt_steps", "target_temperature", "cache_target", "loss_backend")
# settings a resumed run may change: where and how it runs, not what it computes (the target
# is compared by its weights, not its path; loss_backend "auto" resolves per device to kernels
# with one contract, threads 0 to torch's default: neither changes what is computed)
RESUME_MAY_CHANGE = ("out", "target", "max_minutes", "save_every", "threads", "data_dir",
                     "prepare_only", "cache_target", "loss_backend", "export_dtype",
                     "regenerate_batch", "extra")


@dataclass
class TrainConfig:
    out: str
    target: str | None = None          # None: the default model (SmolLM2-135M-Instruct)
    kind: str = EAGLE3
    draft_vocab: int = 8192
    conversations: int = 2000          # ShareGPT train-split conversations used (0: none)
    skip_conversations: int = 0        # usable train-split conversations skipped first (fresh
                                       # data for a warm start: the bundled head saw the first 1700)
    max_length: int = 512              # tokens per conversation (truncated)
    batch_tokens: int = 4096           # padded tokens per optimiser step
    epochs: int = 1
    lr: float = 1e-3
    target_temperature: float = 1.0    # soft labels softmax(target logits / T); < 1 sharpens
                                       # them towards the greedy token (eagle3_ttt_loss)
    warmup_steps: int = 20
    ttt_steps: int = 0                 # 0: the drafting depth of the device (default_ttt_steps)
    seed: int = 0
    save_every: int = 50
    max_minutes: float = 0.0           # stop (and save) after this long; 0 = no limit
    export_dtype: str = "bfloat16"
    threads: int = 0                   # torch CPU threads; 0 = torch's default
    regenerate: bool = False           # replace assistant turns by the target's greedy replies
    regenerate_batch: int = 16
    regenerate_max_new: int = 256      # tokens per regenerated reply (at most)
    code_prompts: int = 0              # also N stdlib code prompts (data.code_prompts), answered
                                       # by the target (needs regenerate): code beside the chat
    skip_code_prompts: int = 0         # code prompts skipped first (fresh ones for a warm start)
    turns: int = 0                     # keep the first N exchanges of each conversation (0: all);
                                       # first turns cost least to regenerate, and a prompt is one
    loss_backend: str = "auto"         # soft_cross_entropy backend ("triton" on a GPU)
    init_from: str | None = None       # warm start: an EAGLE-3 head dir (its draft vocabulary kept)
    data_dir: str | None = None        # dataset + target cache (default: out); runs may share it
    cache_target: bool | None = None   # reuse target outputs across epochs (None: when epochs > 1)
    prepare_only: bool = False         # build the dataset (and cache), train nothing
    extra: dict = field(default_factory=dict)

    # smallest value of each int setting (the others: any int)
    _INT_MINIMA = {"draft_vocab": 1, "conversations": 0, "skip_conversations": 0, "max_length": 2,
                   "batch_tokens": 1, "epochs": 1, "warmup_steps": 0, "ttt_steps": 0,
                   "save_every": 1, "threads": 0, "regenerate_batch": 1,
                   "regenerate_max_new": 1, "code_prompts": 0, "skip_code_prompts": 0,
                   "turns": 0}

    def __post_init__(self):
        for name, low in self._INT_MINIMA.items():
            check_int(name, getattr(self, name), low)
        check_positive("lr", self.lr)
        check_positive("target_temperature", self.target_temperature)
        check_eps("max_minutes", self.max_minutes)  # a finite number >= 0 (0: no limit)
        # combinations refused before any data or model loads (nothing silently ignored)
        if self.kind not in (EAGLE1, EAGLE3):
            raise ValueError(f"kind: expected {EAGLE1!r} or {EAGLE3!r}, got {self.kind!r}")
        if self.export_dtype not in EXPORT_DTYPES:
            raise ValueError(f"export_dtype: expected one of {sorted(EXPORT_DTYPES)}, got "
                             f"{self.export_dtype!r}")
        backends = ("auto", *op_backends()["soft_cross_entropy"])
        if self.loss_backend not in backends:
            raise ValueError(f"loss_backend: expected one of {backends}, got {self.loss_backend!r}")
        if self.init_from is not None and self.kind != EAGLE3:
            raise ValueError(f"init_from: warm starts take an EAGLE-3 head; kind is {self.kind}")
        for name in EAGLE3_ONLY if self.kind == EAGLE1 else ():
            default, value = self.__dataclass_fields__[name].default, getattr(self, name)
            if value != default:
                raise ValueError(f"{name}: an EAGLE-3 setting, expected {default!r} (its default) "
                                 f"with kind {EAGLE1!r}, got {value!r}")
        if self.code_prompts and not self.regenerate:
            raise ValueError("code_prompts: the code prompts have no replies; they need "
                             "regenerate (the target answers them)")
        if self.conversations == 0 and self.code_prompts == 0:
            raise ValueError("conversations: expected training data; conversations and "
                             "code_prompts are both 0")


# ------------------------------------------------------------------------------- data


def build_dataset(tokenizer, config: TrainConfig, progress: bool = True, target=None):
    """(examples, assistant-token counts): ``examples`` are (ids, mask) int64/bool tensors.

    With ``config.regenerate`` the assistant turns are first replaced by ``target``'s own
    greedy replies (self-distillation, as EAGLE-3 trains): the head then learns the text it
    will be asked to draft, not another model's.
    """
    from tqdm import tqdm

    from .data import iter_sharegpt, render_conversation, sharegpt_messages

    conversations, skipped = [], 0
    for record in iter_sharegpt(split="train") if config.conversations else ():
        messages = sharegpt_messages(record)
        rendered = messages and render_conversation(tokenizer, messages, config.max_length)
        if rendered and any(rendered[1][2:]):
            if skipped < config.skip_conversations:
                skipped += 1
                continue
            conversations.append(messages)
            if len(conversations) == config.conversations:
                break
    if not conversations and config.conversations:
        raise ValueError("training data: no usable ShareGPT conversation was found")
    if config.turns:
        conversations = [first_exchanges(c, config.turns) for c in conversations]
    conversations += [[{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}]
                      for prompt in selected_code_prompts(config)]
    if not conversations:
        raise ValueError("training data: conversations and code_prompts are both 0")
    if config.regenerate:
        if target is None:
            raise ValueError("regenerate: needs the target model to generate with")
        conversations = regenerate(target, tokenizer, conversations, config, progress)
    examples = []  # counts: one per row of the target's embedding (it may pad the tokenizer's)
    counts = torch.zeros(len(tokenizer) if target is None else target.vocab_size, dtype=torch.int64)
    for messages in tqdm(conversations, desc="render conversations", disable=not progress):
        rendered = messages and render_conversation(tokenizer, messages, config.max_length)
        if not rendered or not any(rendered[1][2:]):
            continue
        ids, mask = torch.tensor(rendered[0]), torch.tensor(rendered[1])
        if int(ids.max()) >= counts.numel():
            raise ValueError(f"tokenizer: expected token ids below the target's vocabulary size "
                             f"{counts.numel()}, got {int(ids.max())} (another model's tokenizer?)")
        counts += torch.bincount(ids[mask], minlength=counts.numel())
        examples.append((ids, mask))
    return examples, counts


def regenerate(target: TargetModel, tokenizer, conversations: list[list[dict]],
               config: TrainConfig, progress: bool = True) -> list[list[dict]]:
    """Replace every assistant turn by the target's greedy reply to the turns before it.

    Batched with the runtime's autoregressive generation; turn t of every conversation is
    generated before turn t + 1 (which reads it). A reply is cut at the end-of-turn token, after
    ``config.regenerate_max_new`` tokens, or at ``config.max_length`` tokens in all; conversations whose context is already that long keep
    only the turns before it.
    """
    from tqdm import tqdm

    from .runtime.generation import Engine

    engine = Engine(target)
    eos = sorted({tokenizer.eos_token_id, *_end_of_turn_ids(tokenizer)} - {None})
    result = [[] for _ in conversations]
    most_turns = max(len(c) for c in conversations)
    bar = tqdm(total=sum(m["role"] == "assistant" for c in conversations for m in c),
               desc="regenerate replies", disable=not progress)
    for turn in range(most_turns):
        pending = []
        for index, messages in enumerate(conversations):
            if turn < len(messages) and len(result[index]) == turn:
                if messages[turn]["role"] != "assistant":
                    result[index].append(messages[turn])
                    continue
                prompt = tokenizer.apply_chat_template(result[index], add_generation_prompt=True)
                prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
                if len(prompt) < config.max_length:
                    pending.append((index, prompt))
        for start in range(0, len(pending), config.regenerate_batch):
            chunk = pending[start:start + config.regenerate_batch]
            budget = min(config.regenerate_max_new,
                         max(config.max_length - len(p) for _, p in chunk))
            out = engine.generate([p for _, p in chunk], budget, eos_token_ids=eos,
                                  speculative=False)
            for (index, _), tokens in zip(chunk, out.tokens):
                text = tokenizer.decode([t for t in tokens if t not in eos])
                result[index].append({"role": "assistant", "content": text})
            bar.update(len(chunk))
    bar.close()
    return [messages if any(m["role"] == "assistant" for m in messages) else []
            for messages in (_drop_trailing_user(r) for r in result)]


def selected_code_prompts(config: TrainConfig) -> list[str]:
    """Code prompts ``skip_code_prompts`` .. ``skip_code_prompts + code_prompts`` of
    :func:`~eagle_kernels.data.code_prompts` (none when ``code_prompts`` is 0)."""
    from .data import code_prompts

    if not config.code_prompts:
        return []
    return code_prompts(config.skip_code_prompts + config.code_prompts)[config.skip_code_prompts:]


def first_exchanges(messages: list[dict], count: int) -> list[dict]:
    """``messages`` cut after its ``count``-th assistant turn."""
    seen = 0
    for index, message in enumerate(messages):
        seen += message["role"] == "assistant"
        if seen == count:
            return messages[:index + 1]
    return messages


def _drop_trailing_user(messages: list[dict]) -> list[dict]:
    while messages and messages[-1]["role"] != "assistant":
        messages = messages[:-1]
    return messages


def batch_plan(lengths: list[int], batch_tokens: int, seed: int, epoch: int) -> list[list[int]]:
    """Example indices per batch: shuffled, then length-sorted within windows of 64 (little
    padding), each batch at most ``batch_tokens`` padded tokens, batches shuffled again."""
    order = list(range(len(lengths)))
    rng = random.Random(seed * 1000 + epoch)
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), 64):
        window = sorted(order[start:start + 64], key=lambda i: lengths[i])
        current = []
        for index in window:
            longest = max([lengths[i] for i in current] + [lengths[index]])
            if current and longest * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(examples, indices, pad_id: int, device):
    """Right-padded [B, L] ids and loss mask (padding is never trained on)."""
    length = max(examples[i][0].numel() for i in indices)
    ids = torch.full((len(indices), length), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(indices), length), dtype=torch.bool)
    for row, index in enumerate(indices):
        seq, seq_mask = examples[index]
        ids[row, :seq.numel()] = seq
        mask[row, :seq.numel()] = seq_mask
    return ids.to(device), mask.to(device)


# ------------------------------------------------------------------------------- model


def init_head(kind: str, target: TargetModel, counts: torch.Tensor, draft_vocab: int,
              always: list[int], seed: int, init_from: str | None = None):
    """A new head; EAGLE-3 gets d2t/t2d from ``counts`` (or everything from ``init_from``).

    EAGLE-3 starts from the target's own late state rather than from noise: ``fc`` passes the
    input of layer N-3 through, the midlayer's residual branches (o_proj, down_proj) start at
    zero, and lm_head / final norm are the target's (rows of the draft tokens), the norm scaled
    by ``INIT_NORM_SCALE``: layer N-3's input is not calibrated for the final norm, and at full
    scale its logits are confidently wrong. On SmolLM2 this starts step 0 at 6 % top-1 and
    7.2 nats instead of 0.1 % and ~16 nats from random init, which matters on a short budget.
    """
    from .data import draft_vocabulary

    if kind == EAGLE1:
        return new_draft_head(EAGLE1, target, seed=seed).float().train()
    if init_from is not None:
        return warm_start_head(init_from, target)
    if counts.numel() != target.vocab_size:
        raise ValueError(f"counts: expected one per target token ({target.vocab_size}), got "
                         f"{counts.numel()}")
    size = min(draft_vocab, target.vocab_size)
    head = new_draft_head(EAGLE3, target, draft_vocab=size, seed=seed).float()
    d2t, t2d = draft_vocabulary(counts, size, always)
    with torch.no_grad():
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
        ids = training.draft_vocab_ids(head)
        head.lm_head.weight.copy_(target.lm_head.weight[ids].float())
        head.norm.weight.copy_(target.model.norm.weight.float() * INIT_NORM_SCALE)
        width = target.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, 2 * width:].copy_(torch.eye(width))
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
    return head.train()


def warm_start_head(path: str, target: TargetModel):
    """An EAGLE-3 head loaded from ``path`` to train on (fp32), its draft vocabulary kept."""
    from .runtime.draft_heads import load_draft_head

    head = load_draft_head(path, target)
    if head.kind != EAGLE3:
        raise ValueError(f"init_from: expected an EAGLE-3 head directory, got a {head.kind} "
                         f"head in {path}")
    return head.float().train()


def resolved_ttt_steps(config: TrainConfig, device) -> int:
    """The TTT steps an EAGLE-3 run trains on ``device``: ``config.ttt_steps``, or with 0
    :func:`default_ttt_steps` of the device."""
    return config.ttt_steps or default_ttt_steps(device)


def resolved_settings(config: TrainConfig, device) -> dict:
    """The run-defining settings whose value the run resolves where it runs, by name: what the
    trainer state records beside the configured settings and a resume compares
    (:func:`check_resume`). EAGLE-3's ``ttt_steps`` (0: the drafting depth of ``device``); the
    other settings resolved at run time are compared otherwise (the default target by its
    weights, the data files by the dataset key) or only change how a run computes
    (RESUME_MAY_CHANGE). EAGLE-1 trains no TTT steps: nothing."""
    if config.kind != EAGLE3:
        return {}
    return {"ttt_steps": resolved_ttt_steps(config, device)}


def default_ttt_steps(device) -> int:
    """TTT steps matched to the depth the runtime drafts on ``device``.

    A CPU's tree budget picks trees of depth <= 3 (compute-bound verify, see
    runtime/tree_budget.py), so steps past 4 train positions it never drafts; a GPU drafts
    EAGLE-2's depth-6 trees: 7 steps (the official EAGLE-3 setting)."""
    return training.TTT_STEPS if torch.device(device).type == "cuda" else CPU_TTT_STEPS


def batch_loss(head, target: TargetModel, ids, mask, config: TrainConfig, cached=None):
    """(loss, metrics dict) of one batch; ``cached``: its target outputs from a TargetCache."""
    if head.kind == EAGLE1:
        hidden, _ = training.target_pass(target, ids)
        loss, regression, cross_entropy = training.eagle1_loss(head, target, hidden, ids, mask)
        return loss, {"regression": logged(float(regression.detach()), None),
                      "ce": logged(float(cross_entropy.detach()), None)}
    if cached is not None:
        features, logits, argmax = cached
    else:
        hidden, features = training.target_pass(target, ids, head.feature_layers)
        logits, argmax = training.target_draft_logits(target, hidden,
                                                      training.draft_vocab_ids(head))
    with no_value_checks():  # the loss is checked instead (below, in train)
        result = training.eagle3_ttt_loss(head, features.float(), ids, logits, head.t2d[argmax],
                                          mask, steps=resolved_ttt_steps(config, ids.device),
                                          loss_backend=config.loss_backend,
                                          target_temperature=config.target_temperature)
    return result.loss, {"step_loss": [logged(x) for x in result.step_losses],
                         "step_acc": [logged(x) for x in result.step_accuracy]}


def logged(value: float, digits: int | None = 4) -> float | None:
    """A metric as the training log keeps it: rounded to ``digits`` (None: as is); None (JSON
    null) where it is undefined, e.g. a TTT step with no trainable position in its batch (NaN,
    which strict JSON readers refuse)."""
    if not math.isfinite(value):
        return None
    return value if digits is None else round(value, digits)


def learning_rate(config: TrainConfig, step: int, total: int) -> float:
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, total - config.warmup_steps)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


# ------------------------------------------------------------------------------- loop


def dataset_key(config: TrainConfig, tokenizer, target: TargetModel) -> list:
    """What the examples depend on (a changed key rebuilds the dataset and the target cache):
    the data settings, the tokenizer (its vocabulary and chat template), the size of the
    target's vocabulary (the counts' length), the ShareGPT file, and with ``regenerate`` the
    target's weights (the replies are its own)."""
    from .target_cache import target_digest

    key = [config.conversations, config.max_length, config.regenerate,
           {"tokenizer": tokenizer_digest(tokenizer), "vocab": target.vocab_size}]
    if config.conversations:
        from .data import sharegpt_path

        path = sharegpt_path()
        key.append({"sharegpt": [path.name, path.stat().st_size]})
    if config.skip_conversations:
        key.append({"skip": config.skip_conversations})
    if config.regenerate:
        key.append({"regenerate_max_new": config.regenerate_max_new,
                    "target": target_digest(target)})
    if config.turns:
        key.append({"turns": config.turns})
    if config.code_prompts:  # the list follows the Python build: its digest is part of the key
        from .data import prompts_digest

        entry = {"code_prompts": config.code_prompts}
        if config.skip_code_prompts:
            entry["skip"] = config.skip_code_prompts
        key.append({**entry, "digest": prompts_digest(selected_code_prompts(config))})
    return key


def tokenizer_digest(tokenizer) -> str:
    """CRC-32 of the tokenizer's vocabulary (token, id pairs) and chat template."""
    text = json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.chat_template])
    return f"{zlib.crc32(text.encode()):08x}"


def _load_data(data_dir: Path, tokenizer, config: TrainConfig, target: TargetModel, key: list):
    """(examples, counts) from ``data_dir/dataset.pt`` when its key is ``key``, else built and
    stored there (atomically: runs may share the directory). Only tensors, lists, tuples,
    dicts and plain values are stored, so it loads with ``weights_only``."""
    cached = data_dir / DATA_FILE
    if cached.is_file():
        data = torch.load(cached, weights_only=True)
        if isinstance(data, dict) and data.get("key") == key:
            return data["examples"], data["counts"]
    examples, counts = build_dataset(tokenizer, config, target=target)
    temporary = data_dir / f"{DATA_FILE}.{os.getpid()}.tmp"
    torch.save({"key": key, "examples": examples, "counts": counts}, temporary)
    temporary.replace(cached)
    return examples, counts


def _target_cache(data_dir: Path, config: TrainConfig, head, target: TargetModel, examples,
                  pad_id: int, progress: bool, key: list):
    """A filled TargetCache when target outputs are reused (EAGLE-3), else None."""
    from .target_cache import TargetCache

    wanted = config.epochs > 1 if config.cache_target is None else config.cache_target
    if not wanted or head.kind != EAGLE3:
        return None
    cache = TargetCache(data_dir / CACHE_DIR, target, head.feature_layers, key,
                        training.draft_vocab_ids(head))
    cache.fill(examples, config.batch_tokens, pad_id, progress)
    return cache


def check_resume(state: dict, config: TrainConfig, key: list, target_id: str, path,
                 resolved: dict) -> None:
    """Refuse to continue the run saved in ``state`` with other run-defining settings (all but
    RESUME_MAY_CHANGE), data (``key``) or target weights (``target_id``), by name.

    ``resolved``: :func:`resolved_settings` here. A setting resolved from the device is compared
    by the value the saved run resolved it to (``state["resolved"]``), not as configured: a run
    started on a CPU with ``--ttt-steps 0`` trained 4 steps, and resumed on a GPU would train 7
    (refused, naming the ``--ttt-steps 4`` that continues it), while ``--ttt-steps 4`` there
    continues it (it is the same run)."""
    fields, saved = TrainConfig.__dataclass_fields__, state.get("config") or {}
    # A state saved before the resolved values were stored (no "resolved") has its settings
    # compared as configured, as they were then: old checkpoints still resume, but a ttt_steps
    # of 0 resumed on another kind of device is not caught there (the steps it trained are
    # not known). The same holds for a setting a state's "resolved" does not name.
    recorded = {name: value for name, value in (state.get("resolved") or {}).items()
                if name in resolved}
    for name in fields:
        if name in RESUME_MAY_CHANGE or name in recorded:  # the resolved ones: below
            continue
        was, now = saved.get(name, fields[name].default), getattr(config, name)
        if was != now:
            raise ValueError(f"{name}: {path} continues a run started with {was!r}, got {now!r} "
                             f"(resume with the same settings, or train into another out)")
    for name, was in recorded.items():
        if was != resolved[name]:
            flag = "--" + name.replace("_", "-")  # as the train command spells it
            raise ValueError(
                f"{name}: {path} continues a run started with {was!r}, got {resolved[name]!r} "
                f"({name} {getattr(config, name)!r} resolves to {resolved[name]!r} on this "
                f"device; the saved run's {saved.get(name, fields[name].default)!r} resolved to "
                f"{was!r} on its own): pass {flag} {was!r} to continue it, or train into another "
                f"out")
    for name, now in (("dataset_key", key), ("target_digest", target_id)):
        if name in state and state[name] != now:  # states saved before these were stored: none
            raise ValueError(f"{name}: {path} continues a run on other "
                             f"{'data' if name == 'dataset_key' else 'target weights'} "
                             f"({state[name]!r}), got {now!r}")


def step_seed(seed: int, step: int) -> int:
    """The torch seed of training step ``step`` (EAGLE-1's input noise): a function of the run's
    seed and the step only, so a resumed run draws what an uninterrupted one would."""
    return zlib.crc32(f"{seed}/{step}".encode())


def _trim_log(path: Path, step: int) -> None:
    """Cut the training log back to ``step``: lines after the last save (or a torn last line)
    belong to steps the resumed run does again."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            if json.loads(line)["step"] > step or not line.endswith("\n"):
                break
        except (ValueError, KeyError, TypeError):
            break
        kept.append(line)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text("".join(kept))
    temporary.replace(path)


def _save(out: Path, head, optimizer, step: int, config: TrainConfig, key: list, target_id: str,
          resolved: dict):
    torch.save({"step": step, "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                "config": asdict(config), "resolved": resolved, "dataset_key": key,
                "target_digest": target_id},
               out / (STATE_FILE + ".tmp"))
    (out / (STATE_FILE + ".tmp")).replace(out / STATE_FILE)
    save_draft_head(head, out, dtype=EXPORT_DTYPES[config.export_dtype])


def train(config: TrainConfig, target: TargetModel, tokenizer, progress: bool = True) -> dict:
    """Train (or resume) a head; returns a summary. Writes everything under ``config.out``."""
    from tqdm import tqdm

    from .target_cache import target_digest

    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out: expected a directory (or a new path), got the file {out}")
    out.mkdir(parents=True, exist_ok=True)
    target.requires_grad_(False)
    data_dir = Path(config.data_dir) if config.data_dir else out
    data_dir.mkdir(parents=True, exist_ok=True)
    key, target_id = dataset_key(config, tokenizer, target), target_digest(target)
    resolved = resolved_settings(config, target.device)  # the batches live on target.device
    state = None
    if (out / STATE_FILE).is_file():  # checked before any data is built for it
        state = torch.load(out / STATE_FILE, weights_only=True)
        check_resume(state, config, key, target_id, out / STATE_FILE, resolved)
    examples, counts = _load_data(data_dir, tokenizer, config, target, key)
    always = sorted({tokenizer.eos_token_id, *_end_of_turn_ids(tokenizer)} - {None})
    head = init_head(config.kind, target, counts, config.draft_vocab, always, config.seed,
                     config.init_from)
    if state is not None:  # before the cache, which reads the head's draft vocabulary
        head.load_state_dict(state["head"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    cache = _target_cache(data_dir, config, head, target, examples, pad_id, progress, key)
    if config.prepare_only:
        return {"examples": len(examples), "tokens": sum(e[0].numel() for e in examples),
                "assistant_tokens": int(sum(e[1].sum() for e in examples)),
                "cached": cache is not None}
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    plans = [batch_plan([e[0].numel() for e in examples], config.batch_tokens, config.seed, epoch)
             for epoch in range(config.epochs)]
    schedule = [batch for plan in plans for batch in plan]
    step = 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    _trim_log(out / LOG_FILE, step)
    started, log = time.time(), open(out / LOG_FILE, "a")
    bar = tqdm(total=len(schedule), initial=step, desc="train", disable=not progress)
    while step < len(schedule):
        torch.manual_seed(step_seed(config.seed, step))
        ids, mask = collate(examples, schedule[step], pad_id, target.device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(config, step, len(schedule))
        tick = time.time()
        cached = cache.batch(schedule[step], ids.shape[1]) if cache is not None else None
        loss, metrics = batch_loss(head, target, ids, mask, config, cached)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training diverged at step {step}: loss {float(loss)}; "
                                     f"lower --lr or resume from the last save")
        if loss.requires_grad:  # False when no position of the batch is trainable
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 0.5)
            optimizer.step()
        step += 1
        record = {"step": step, "loss": round(float(loss.detach()), 4), "tokens": int(ids.numel()),
                  "seconds": round(time.time() - tick, 3), **metrics}
        log.write(json.dumps(record, allow_nan=False) + "\n")  # strict JSON: see logged()
        log.flush()
        bar.set_postfix(loss=record["loss"], acc0=(metrics.get("step_acc") or [None])[0])
        bar.update()
        out_of_time = config.max_minutes and time.time() - started > 60 * config.max_minutes
        if step % config.save_every == 0 or step == len(schedule) or out_of_time:
            _save(out, head, optimizer, step, config, key, target_id, resolved)
        if out_of_time:
            break
    bar.close()
    log.close()
    if step == len(schedule) and not (out / "model.safetensors").is_file():
        _save(out, head, optimizer, step, config, key, target_id, resolved)
    return {"steps_done": step, "steps_total": len(schedule), "examples": len(examples),
            "finished": step == len(schedule)}


def _end_of_turn_ids(tokenizer) -> list[int]:
    ids = []
    for text in ("<|im_end|>", "<|eot_id|>", "</s>"):
        token = tokenizer.convert_tokens_to_ids(text)
        if isinstance(token, int) and token != tokenizer.unk_token_id:
            ids.append(token)
    return ids
