"""Argument checks shared by the public ops: clear ValueError / TypeError, never silence.

Metadata (type, dtype, shape, device, contiguity) is always checked. Value checks (index
ranges, tree order, finiteness) read tensor contents, which on a GPU costs a host sync, so they
run only while :func:`value_checks_enabled` says so: by default, except while a CUDA graph is
being captured or when ``EAGLE_KERNELS_CHECK_VALUES=0``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import operator
import os
import threading
import weakref
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
CHECK_VALUES_ENV = "EAGLE_KERNELS_CHECK_VALUES"


class _ChecksOff(threading.local):
    """The depth of this thread's open :func:`no_value_checks` blocks: a block in one thread
    (a generation loop, a training step) leaves another thread's calls checked."""

    depth = 0


_VALUE_CHECKS_OFF = _ChecksOff()


@contextlib.contextmanager
def no_value_checks():
    """Skip content scans inside the block, in this thread (a training loop checks its loss
    instead)."""
    _VALUE_CHECKS_OFF.depth += 1
    try:
        yield
    finally:
        _VALUE_CHECKS_OFF.depth -= 1


def value_checks_enabled() -> bool:
    """Whether ops should check tensor contents (see the module docstring)."""
    if _VALUE_CHECKS_OFF.depth or os.environ.get(CHECK_VALUES_ENV, "1") == "0":
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class _UnchangedBlock(threading.local):
    """The epoch of this thread's open :func:`weights_unchanged` block (-1: none) and what
    was bound in it (:func:`block_memo`)."""

    epoch = -1
    memo: dict = {}  # replaced by a fresh dict in each outermost block, never written outside


_UNCHANGED = _UnchangedBlock()
_EPOCHS = itertools.count()


@contextlib.contextmanager
def weights_unchanged() -> Iterator[None]:
    """A block in which the caller guarantees that no layer's weights change (from any
    thread: the block itself is per thread).

    Inside it, a :class:`~eagle_kernels.ops.LayerWeights` compares its tensors' stamps
    (storage pointers and version counters) on first use only, not on every call. The
    generation loop runs a whole ``generate`` call in one block (nothing else runs between its
    steps): stamping the 30 layers' tensors cost ~0.1-0.2 ms of a 4.5 ms decode step on 2
    cores, their metadata being out of cache after each step's weight stream. Ops also keep
    what they bound to tensors seen before in the block (:func:`block_memo`: a layer stack's
    pointers with its K/V caches, a linear layer's checks and pack), so the promise covers
    every weight given to an op in the block (not changed at all, in place or otherwise:
    ``ops.linear`` runs the pack it made first) and every K/V cache tensor (its values change
    as the model writes them, but it is not resized nor given new storage). Every outermost
    block starts a new epoch, so weights changed between blocks are re-checked and re-packed
    as usual; a nested block is part of the outer one (so do not yield from inside a block: a
    generator suspended in one keeps it open for whatever its consumer runs meanwhile). The
    memo holds no tensor past its last other user (see :func:`remember`).
    """
    if _UNCHANGED.epoch >= 0:  # inside an outer block: its promise covers this one
        yield
        return
    _UNCHANGED.epoch, _UNCHANGED.memo = next(_EPOCHS), {}
    try:
        yield
    finally:
        _UNCHANGED.memo.clear()  # the entries and what they hold go now (their callbacks
        _UNCHANGED.epoch, _UNCHANGED.memo = -1, {}  # refer to the dict: a cycle until cleared)


def block_memo() -> dict | None:
    """This thread's open :func:`weights_unchanged` block's memo (emptied when the block
    ends), or None outside any block. Entries go in with :func:`remember` and come out with
    :func:`recall`."""
    return _UNCHANGED.memo if _UNCHANGED.epoch >= 0 else None


def remember(memo: dict, key, objects: Sequence, value) -> None:
    """Keep ``value`` under ``key`` while every one of ``objects`` lives: each is held by a
    weak reference whose callback drops the entry, so a memo holds no tensor past its last
    user (a K/V cache freed after its call, a temporary weight) and an id reused by a new
    object never matches (:func:`recall` compares the objects themselves). The callback knows
    its entry by a token, not by the entry itself: an entry that referred to itself through
    its callbacks would outlive its removal until Python's cycle collector ran."""
    token = object()

    def drop(_ref):
        entry = memo.get(key)
        if entry is not None and entry[2] is token:  # not an entry that replaced this one
            memo.pop(key, None)  # (a callback may run in another thread: never raise)

    memo[key] = (tuple(weakref.ref(o, drop) for o in objects), value, token)


def recall(memo: dict, key, objects: Sequence):
    """The value :func:`remember` kept under ``key`` for exactly these objects (by identity,
    in order), else None."""
    entry = memo.get(key)
    if entry is None or len(entry[0]) != len(objects):
        return None
    return entry[1] if all(map(operator.is_, (ref() for ref in entry[0]), objects)) else None


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(
    name: str,
    value,
    dtypes: Sequence[torch.dtype] | None = None,
    shape: Sequence[int | None] | None = None,
    device: torch.device | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Check one tensor argument; ``None`` in ``shape`` accepts any size in that dimension."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")
    if dtypes is not None and value.dtype not in dtypes:
        raise ValueError(f"{name}: expected dtype {_dtype_names(dtypes)}, got "
                         f"{str(value.dtype).replace('torch.', '')}")
    if shape is not None and (value.dim() != len(shape) or any(
            s is not None and s != actual for s, actual in zip(shape, value.shape))):
        expected = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name}: expected shape {expected}, got {list(value.shape)}")
    if device is not None and value.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {value.device}")
    # meta / mps / xpu: no backend of ours. The device types are written here, not read from
    # a module constant: the launchers call this helper, and every module constant a launcher's
    # code reads enters its kernels' source digest (_digests.py), so a new one here would take
    # every GPU-proven kernel out of auto until re-proven.
    if value.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected a tensor on cpu or cuda, got one on {value.device}")
    if contiguous and not value.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got "
                         f"strides {list(value.stride())} for shape {list(value.shape)}")
    return value


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """Check an integer argument lies in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name}: expected an int {bound}, got {value}")
    return value


def check_eps(name: str, value) -> float:
    """Check an epsilon argument (a finite real number >= 0, not a bool); returns a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float >= 0, got {type(value).__name__}")
    if not 0 <= value < math.inf:  # NaN fails too
        raise ValueError(f"{name}: expected a finite float >= 0, got {value!r}")
    return float(value)


def check_positive(name: str, value) -> float:
    """Check a finite real number > 0 (a scale, a temperature), not a bool; returns a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float > 0, got {type(value).__name__}")
    if not 0 < value < math.inf:  # NaN fails too
        raise ValueError(f"{name}: expected a finite float > 0, got {value!r}")
    return float(value)


def check_device(name: str, device) -> torch.device:
    """A device the package runs on (cpu, cuda or cuda:N, the latter only with a GPU)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"{name}: expected a str or torch.device, got {type(device).__name__}")
    try:
        parsed = torch.device(device)
    except RuntimeError:
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}: expected cpu, cuda or cuda:N, got {device!r}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}: {device} requested, but this PyTorch sees no CUDA device")
    if parsed.type == "cuda" and parsed.index is not None and \
            parsed.index >= torch.cuda.device_count():
        raise ValueError(f"{name}: expected cuda:0 .. cuda:{torch.cuda.device_count() - 1} (the "
                         f"GPUs this PyTorch sees), got {device!r}")
    return parsed


def check_model_path(name: str, path) -> None:
    """A model to load: a checkpoint directory with config.json or a .gguf file (None: the
    default model), checked before anything loads."""
    if path is None:
        return
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a path (str or os.PathLike) or None, got "
                        f"{type(path).__name__}")
    if not os.fspath(path):  # Path("") is the current directory: never what was meant
        raise ValueError(f"{name}: expected a checkpoint directory with config.json or a .gguf "
                         f"file, got ''")
    found = Path(path)
    if found.suffix == ".gguf":
        if not found.is_file():
            raise ValueError(f"{name}: no such GGUF file: {path}")
    elif not (found / "config.json").is_file():
        raise ValueError(f"{name}: expected a checkpoint directory with config.json or a .gguf "
                         f"file, got {path}"
                         + ("" if found.exists() else " (no such file or directory)"))


def first_found(value: torch.Tensor, bad: torch.Tensor) -> str:
    """"got V at index [i, ...]": the first entry of ``value`` where ``bad`` (its shape, bool)
    holds, for a message that says what came."""
    index = torch.nonzero(bad)[0].tolist()
    return f"got {value[tuple(index)].item()!r}" + (f" at index {index}" if index else "")


def check_range(name: str, value: torch.Tensor, low: int, high: int, what: str = "") -> None:
    """Value check: every entry in [low, high) (skipped when value checks are off)."""
    if not value_checks_enabled() or value.numel() == 0:
        return
    bad = (value < low) | (value >= high)
    if bool(bad.any()):
        raise ValueError(f"{name}: expected values in [{low}, {high}){what}, "
                         f"{first_found(value, bad)}")


def check_parents(name: str, parents: torch.Tensor) -> None:
    """Value check of the tree contract: ``parents[:, 0] == -1``, ``0 <= parents[b, i] < i``."""
    if not value_checks_enabled():
        return
    if bool((parents[:, 0] != -1).any()):
        raise ValueError(f"{name}: expected parents[:, 0] == -1 (node 0 is the root), got "
                         f"{parents[:, 0].tolist()}")
    node = torch.arange(parents.shape[1], device=parents.device)
    bad = ((parents < 0) | (parents >= node)) & (node > 0)
    if bool(bad.any()):
        b, i = torch.nonzero(bad)[0].tolist()
        raise ValueError(f"{name}: trees must be topologically ordered with 0 <= parents[b, i] < i;"
                         f" got parents[{b}, {i}] = {int(parents[b, i])}")


def nan_or_posinf(x: torch.Tensor) -> torch.Tensor:
    """Where ``x`` holds what no logit or log-probability may: NaN or +inf."""
    return torch.isnan(x) | torch.isposinf(x)


def check_logits(name: str, logits: torch.Tensor) -> torch.Tensor | None:
    """Rows of at least one entry; value check: no NaN or +inf, and every row has at least one
    finite entry. Returns the rows' maxima where the value check ran (else None)."""
    if logits.shape[-1] == 0 and logits.shape[:-1].numel():
        raise ValueError(f"{name}: expected a vocabulary of at least one entry (last dimension), "
                         f"got shape {tuple(logits.shape)}")
    if not value_checks_enabled() or logits.numel() == 0:
        return None
    # One pass with row-sized temporaries only (no [T, V] masks: the training loss checks 2048 x
    # 128k logits): a row's max is NaN or +inf if the row holds one, -inf only for all -inf.
    row_max = logits.amax(-1)
    if bool(torch.isfinite(row_max).all()):
        return row_max
    if bool(nan_or_posinf(row_max).any()):
        raise ValueError(f"{name}: expected finite values (or -inf for impossible tokens), "
                         "got NaN or +inf")
    raise ValueError(f"{name}: every row needs at least one finite value, got a row of -inf")


def check_uniforms(name: str, uniforms: torch.Tensor) -> None:
    """Value check: uniform random numbers in [0, 1)."""
    if not value_checks_enabled() or uniforms.numel() == 0:
        return
    bad = (uniforms < 0) | (uniforms >= 1) | torch.isnan(uniforms)
    if bool(bad.any()):
        raise ValueError(f"{name}: expected values in [0, 1), {first_found(uniforms, bad)}")


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """All tensor arguments on one device; returns it."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, tensor in items[1:]:
        if tensor.device != first.device:
            raise ValueError(f"{name}: expected a tensor on {first.device} (like {first_name}), "
                             f"got one on {tensor.device}")
    return first.device
