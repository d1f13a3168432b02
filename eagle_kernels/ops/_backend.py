"""Backend registry: which implementation of an op runs, and why the others cannot.

Every op has up to four backends with one signature and one contract:

* ``"cuda"``   kernels from ``csrc/`` compiled into ``eagle_kernels._C`` (CUDA tensors only);
* ``"triton"`` Triton kernels (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``);
* ``"cpu"``    C++ kernels from ``csrc/cpu/`` compiled into ``eagle_kernels._cpu`` (CPU tensors);
* ``"torch"``  the reference ops of :mod:`eagle_kernels.ops.reference` (any device).

``backend="auto"`` (the default of every public op) takes the environment variable
``EAGLE_KERNELS_BACKEND`` when it is set, which forces one backend for every op that has it
(useful in tests and benchmarks; an op the forced backend lacks, such as the whole-layer
``decoder_layer`` or ``soft_cross_entropy`` under ``cuda``, runs its torch reference, whose inner
ops are forced in turn); otherwise the first of cuda, triton, cpu, torch that is available here,
supports the inputs' device, supports the inputs themselves and is enabled for ``auto`` for
this op.

What a backend can take is declared where it is registered: ``register(..., supports=fn)``
where ``fn(**facts)`` returns why inputs with those facts cannot run (dtype, head_dim, k, N,
M, ...), or None. Every public op passes its facts to :func:`resolve`; ``auto`` falls through
to the next backend, and an explicit (or forced) request for an unsupported case raises a
ValueError naming the limit. CUDA limits come from the ``_C`` module (:func:`cuda_limit`),
Triton limits from one named constant in the module that owns the kernel.

A GPU kernel (``cuda``, ``triton``) joins ``auto`` on a CUDA device only where a committed
verdict for that GPU says it was proven equal to the reference and faster than it, or, for
the ops the lossless runtime needs row-invariant, proven and the row-invariant backend
(:func:`verdict_allows`); the ``auto=`` given at registration does not apply to them. Verdicts
are the ``verdict.json`` files under ``bench/results/<date>_<gpu>/`` (written from a GPU run by
``bench/collect_results.py``, never by hand), found by ``torch.cuda.get_device_name``; the
newest one for this GPU counts. With none for this GPU, ``auto`` stays on torch there, and every
GPU kernel is reachable by naming its backend explicitly. ``EAGLE_KERNELS_VERDICTS`` names
another folder to search (``off``: none). The Triton interpreter (CPU tensors under
``TRITON_INTERPRET=1``) is never chosen by ``auto``.

A verdict entry proves the code that ran: it counts only while :func:`source_digest` of the
kernel here is the digest it recorded (entries of the verdicts written before digests: the
digest of the code they proved, :data:`LEGACY_SOURCE_DIGESTS`; :mod:`eagle_kernels.ops._digests`
says what a digest covers), so an edited kernel leaves ``auto`` until a GPU run proves the
edit; :data:`KERNEL_REVISIONS` also guards launcher changes a digest cannot see.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from . import _digests
from ._triton import HAS_TRITON
from ._triton import MISSING_REASON as TRITON_MISSING

BACKENDS = ("cuda", "triton", "cpu", "torch")
BACKEND_ENV = "EAGLE_KERNELS_BACKEND"
GPU_BACKENDS = ("cuda", "triton")  # join auto on CUDA devices by verdict only
HOST_BACKENDS = tuple(name for name in BACKENDS if name not in GPU_BACKENDS)  # cpu, torch
VERDICT_ENV = "EAGLE_KERNELS_VERDICTS"
VERDICT_SCHEMA = 1
DEFAULT_VERDICTS = Path(__file__).resolve().parents[2] / "bench" / "results"


class BackendStatus(NamedTuple):
    available: bool
    reason: str


class _Implementation(NamedTuple):
    fn: Callable
    auto: bool
    supports: Callable[..., str | None] | None = None  # facts -> why not, or None


_REGISTRY: dict[str, dict[str, _Implementation]] = {}


def register(op: str, backend: str, fn: Callable, auto: bool = True,
             supports: Callable[..., str | None] | None = None) -> None:
    """Register ``fn`` as ``backend``'s implementation of ``op``; ``supports(**facts)`` returns
    why it cannot take inputs with those facts (dtype, sizes), or None."""
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    _REGISTRY.setdefault(op, {})[backend] = _Implementation(fn, auto, supports)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=None)
def _import_status(module: str) -> BackendStatus:
    try:
        importlib.import_module(module)
    except Exception as error:  # an extension can fail with OSError as well as ImportError
        return BackendStatus(False, f"cannot import {module}: {error}")
    return BackendStatus(True, f"{module} imported")


def cuda_extension():
    """The compiled ``eagle_kernels._C`` module; raises ImportError if it was not built."""
    return importlib.import_module("eagle_kernels._C")


def cuda_limit(name: str):
    """A limit the ``_C`` module exports (``TOPK_MAX_K``, ``ATTENTION_HEAD_DIMS``, ...), or None
    when ``_C`` is not built (the cuda backend is unavailable then, so no limit applies).

    The limits are the constants of the csrc/*.cuh headers, exported by the bindings, so the
    Python ``supports`` checks never drift from what the kernels take.
    """
    if not _import_status("eagle_kernels._C").available:
        return None
    return getattr(cuda_extension(), name)


CPU_MODULE = "eagle_kernels._cpu"


def cpu_extension():
    """The compiled ``eagle_kernels._cpu`` module; raises ImportError if it was not built.
    (sys.modules first: a decode cycle asks ~25 times, and import_module's machinery costs
    microseconds each time once the weights stream has evicted it from the caches.)"""
    return sys.modules.get(CPU_MODULE) or importlib.import_module(CPU_MODULE)


def cpu_bookkeeping(device: torch.device):
    """The ``_cpu`` module where the runtime's per-step bookkeeping (token recording, the greedy
    step's choice) should run in C++: CPU tensors, the cpu backend built, and not forced off by
    ``EAGLE_KERNELS_BACKEND``; else None (the torch version runs, e.g. on a GPU, where it is
    captured in the CUDA graph)."""
    if device.type != "cpu" or _requested_backend("auto") not in ("auto", "cpu"):
        return None
    return cpu_extension() if backend_status("cpu").available else None


def cpu_float32_only(dtype: torch.dtype | None = None, **_) -> str | None:
    """The cpu kernels' support rule: float32 tensors only (no dtype stated: not chosen)."""
    if dtype is None:
        return "takes float32 tensors only; the caller stated no dtype"
    return None if dtype == torch.float32 else f"takes float32 tensors, got {dtype}"


def cuda_stream(device: torch.device) -> int:
    """Raw handle of torch's current stream on ``device``: what the ``_C`` launchers take."""
    return torch.cuda.current_stream(device).cuda_stream


def backend_status(backend: str) -> BackendStatus:
    """Whether ``backend`` can run on this machine, and why (not)."""
    if backend == "torch":
        return BackendStatus(True, f"torch {torch.__version__}")
    if backend == "triton":
        if not HAS_TRITON:
            return BackendStatus(False, TRITON_MISSING)
        if torch.cuda.is_available():
            return BackendStatus(True, "triton on CUDA device")
        if _interpreting():
            return BackendStatus(True, "triton interpreter on CPU (TRITON_INTERPRET=1)")
        return BackendStatus(False, "no CUDA device (TRITON_INTERPRET=1 runs kernels on CPU)")
    if backend == "cpu":
        imported = _import_status(CPU_MODULE)
        if not imported.available:
            return BackendStatus(False, "eagle_kernels._cpu not built (no C++ compiler at "
                                 "install time?): " + imported.reason)
        return BackendStatus(True, f"eagle_kernels._cpu ({cpu_extension().isa()})")
    if backend == "cuda":
        imported = _import_status("eagle_kernels._C")
        if not imported.available:
            return BackendStatus(False, "eagle_kernels._C not built (no nvcc at install time?): "
                                 + imported.reason)
        if not torch.cuda.is_available():
            return BackendStatus(False, "eagle_kernels._C built, but torch sees no CUDA device")
        return BackendStatus(True, "eagle_kernels._C on CUDA device")
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def _available(backend: str) -> bool:
    """``backend_status(backend).available`` without building the reason (resolve's hot path)."""
    if backend == "cpu":
        return _import_status(CPU_MODULE).available
    return backend_status(backend).available


def available_backends() -> dict[str, BackendStatus]:
    """Map each backend name to whether it runs here and why (not)."""
    return {name: backend_status(name) for name in BACKENDS}


def _supports_device(backend: str, device: torch.device) -> bool:
    if backend == "torch":
        return True
    if backend == "triton":
        return device.type == "cuda" or (device.type == "cpu" and _interpreting())
    if backend == "cpu":
        return device.type == "cpu"
    return device.type == "cuda"


def _requested_backend(backend: str) -> str:
    if backend not in ("auto",) + BACKENDS:
        raise ValueError(f"backend: expected 'auto' or one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced and forced != "auto" and forced not in BACKENDS:
        raise ValueError(f"{BACKEND_ENV}: expected 'auto' or one of {BACKENDS}, got {forced!r}")
    return forced or "auto"


def _unsupported(impl: _Implementation, facts: dict) -> str | None:
    return impl.supports(**facts) if impl.supports is not None else None


# Ops whose every output row the lossless runtime needs independent of the row count (a verify
# pass over N nodes must give each node a decode step's bits), and the GPU backend that
# computes them so (ops/decoder_triton.py, ops/attention_triton.py).
ROW_INVARIANT_BACKENDS = {"linear": "triton", "rms_norm": "triton", "tree_attention": "triton"}
# Revision of a GPU kernel's code, raised whenever it is rewritten: a verdict entry proves the
# revision it records (entries that record none: 1), so a rewritten kernel leaves ``auto`` on
# every GPU until a run proves it there. Every entry is also tied to the kernels' source
# (source_digest; older entries through LEGACY_SOURCE_DIGESTS): raise a revision for what a
# digest cannot see, a launcher's own code (its grid, the arguments it passes; ops/_digests.py
# says what a digest covers). Revision 2: the two-pass ordered tree attention and the linear's
# 64-row tile (2026-11-27); the top-k in two passes, chunks then rows, and the stochastic
# acceptance's statistics and bonus draw over vocabulary chunks (2026-11-28).
# Revision 3 of the linear: a group's weights in one launch (2026-11-28, seventeenth session).
KERNEL_REVISIONS = {("tree_attention", "triton"): 2, ("linear", "triton"): 3,
                    ("topk_log_softmax", "triton"): 2, ("stochastic_accept_tree", "triton"): 2,
                    ("stochastic_accept_chain", "triton"): 2}


# The digests (ops/_digests.py) of the code the verdicts written before digests existed proved:
# the kernels at b5ae095, whose kernel check is the 2026-11-27 H200 verdict's (the newest that
# records none; of the older H100 one only the row-invariant trio joined auto, all rewritten
# since). An entry that records no digest counts only while the kernel here still has this
# one, so an edit without a KERNEL_REVISIONS bump cannot keep it in auto. Recomputed with
# `git archive b5ae095 | tar -x -C OLD`, this module's _digests.py and _triton.py copied there,
# triton_digest / cuda_digest of each registered launcher (csrc digests from OLD/csrc); a change
# to how digests are computed sets these aside with every recorded digest.
LEGACY_SOURCE_DIGESTS = {
    ("build_tree", "cuda"): "8a6392bbe5ef16f8",
    ("build_tree", "triton"): "097411d655d22de4",
    ("compact_kv", "cuda"): "173ee47ffb8f9e45",
    ("compact_kv", "triton"): "72c67e0efd82e287",
    ("eagle2_expand", "cuda"): "58ebe5a1e002a6f4",
    ("eagle2_expand", "triton"): "fea6c174c309ff5a",
    ("eagle2_rerank", "cuda"): "4a99689511e9bef9",
    ("eagle2_rerank", "triton"): "48c8e7bf21416d50",
    ("greedy_accept_chain", "cuda"): "cc9edbe5354235da",
    ("greedy_accept_chain", "triton"): "5bf100eb966d610a",
    ("greedy_accept_tree", "cuda"): "cc9edbe5354235da",
    ("greedy_accept_tree", "triton"): "5bf100eb966d610a",
    ("linear", "triton"): "2ff7f937a027a2fa",
    ("rms_norm", "triton"): "3c77a73d0b1a9710",
    ("soft_cross_entropy", "triton"): "937f34c03cf992b5",
    ("stochastic_accept_chain", "cuda"): "845ce20bb9ba323e",
    ("stochastic_accept_chain", "triton"): "11c0985d83d145ab",
    ("stochastic_accept_tree", "cuda"): "a8aedd3176e4cd9f",
    ("stochastic_accept_tree", "triton"): "c1e2f41c95b7de5b",
    ("target_probs", "cuda"): "17ee14cff5c82de7",
    ("target_probs", "triton"): "e4865632ecf883f6",
    ("topk_log_softmax", "cuda"): "3bb743165edae2db",
    ("topk_log_softmax", "triton"): "00a29689242f89ae",
    ("tree_attention", "cuda"): "8802d1e6c79817c1",
    ("tree_attention", "triton"): "db57dc8d04ec88eb",
}


def kernel_revision(op: str, backend: str) -> int:
    return KERNEL_REVISIONS.get((op, backend), 1)


def _compiled_digests() -> dict[str, str] | None:
    """What ``_C.source_digests()`` reports: None without ``_C``, or for an ``_C`` built
    before digests existed."""
    if not _import_status("eagle_kernels._C").available:
        return None
    report = getattr(cuda_extension(), "source_digests", None)
    return report() if report is not None else None


@functools.lru_cache(maxsize=None)
def source_digest(op: str, backend: str) -> str | None:
    """Digest of the source of ``backend``'s kernels for ``op`` as they run here (triton: the
    jit functions its launcher reaches; cuda: the csrc families compiled into ``_C``), or None
    where nothing vouches for it (cpu / torch, no such implementation, an ``_C`` without
    digests). Computed on first use and cached: importing eagle_kernels stays cheap."""
    impl = _REGISTRY.get(op, {}).get(backend)
    if impl is None:
        return None
    if backend == "triton":
        return _digests.triton_digest(impl.fn)
    if backend == "cuda":
        return _digests.cuda_digest(impl.fn, _compiled_digests())
    return None


def proved_digest(entry: dict) -> str | None:
    """The source digest a verdict entry proved: the one it records, or for an entry written
    before digests existed (no ``source_digest`` key) :data:`LEGACY_SOURCE_DIGESTS`'."""
    if "source_digest" in entry:
        return entry["source_digest"]
    return LEGACY_SOURCE_DIGESTS.get((entry.get("op"), entry.get("backend")))


def source_changed(entry: dict) -> bool:
    """Whether a verdict entry proved other sources than the kernel's here: it proved a known
    digest (:func:`proved_digest`), and the kernel here has another one, or none (an ``_C``
    built without digests: nothing says it is the code the entry proved)."""
    recorded = proved_digest(entry)
    return recorded is not None and recorded != source_digest(entry.get("op"),
                                                              entry.get("backend"))


def verdict_allows(entry: dict) -> bool:
    """The rule by which a verdict entry puts a GPU kernel into ``auto``: proven equal to the
    reference at that dtype on that GPU, and its median speedup over torch above 1; for the ops
    of ROW_INVARIANT_BACKENDS, proven and the row-invariant backend, whatever its speed (greedy
    speculative decoding is then lossless by construction; cuBLAS and the cuda attention are
    not row-invariant). Only an entry of the kernel's current revision counts
    (:data:`KERNEL_REVISIONS`), and only while the kernel's source here has the digest the
    entry proved (:func:`source_changed`)."""
    if not entry.get("proven"):
        return False
    if entry.get("revision", 1) != kernel_revision(entry.get("op"), entry.get("backend")):
        return False
    if source_changed(entry):
        return False
    invariant = ROW_INVARIANT_BACKENDS.get(entry.get("op"))
    if invariant is not None:
        return entry.get("backend") == invariant
    speedup = entry.get("speedup_vs_torch")
    return speedup is not None and speedup > 1.0


def _verdict_folder() -> Path | None:
    setting = os.environ.get(VERDICT_ENV, "").strip()
    if setting.lower() == "off":
        return None
    return Path(setting) if setting else DEFAULT_VERDICTS


@functools.lru_cache(maxsize=None)
def gpu_verdict(gpu_name: str, folder: str | None = None) -> dict:
    """The newest verdict for the GPU called ``gpu_name`` ({} if none): its ``kernels`` entries
    keyed by (op, backend, dtype), plus the file it came from under key ``"path"``. The record
    is cached; :func:`_gpu_preference` keeps its answers in it (key ``"auto_order"``), so
    clearing this cache clears them too."""
    root = Path(folder) if folder is not None else _verdict_folder()
    if root is None or not root.is_dir():
        return {}
    found = []
    for path in sorted(root.glob("*/verdict.json")):
        try:
            verdict = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a broken file must not break every op: it proves nothing
        if verdict.get("schema") == VERDICT_SCHEMA and verdict.get("gpu") == gpu_name:
            found.append((str(verdict.get("date", "")), str(path), verdict))
    if not found:
        return {}
    _, path, verdict = max(found)
    entries = {(e["op"], e["backend"], e["dtype"]): e for e in verdict.get("kernels", [])}
    return {"path": path, "entries": entries}


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _entries(verdict: dict, op: str, backend: str, facts: dict) -> list[dict]:
    """A verdict's entries for ``backend``'s ``op`` at the inputs' dtype, or at every dtype
    when the op passes none."""
    return [entry for (name, impl, dtype), entry in verdict.get("entries", {}).items()
            if name == op and impl == backend
            and ("dtype" not in facts or dtype == _dtype_name(facts["dtype"]))]


def _proven_here(op: str, backend: str, device: torch.device, facts: dict) -> bool:
    """Whether this GPU's verdict lets ``backend``'s ``op`` into auto for these facts: the
    entry of the inputs' dtype, or every entry of the op when the op passes no dtype. The ops
    of ROW_INVARIANT_BACKENDS join together or not at all (one of them on cuBLAS or the cuda
    attention would make a verify pass round differently from a decode step)."""
    folder = _verdict_folder()
    if device.type != "cuda" or folder is None:
        return False
    verdict = gpu_verdict(torch.cuda.get_device_name(device), str(folder))
    together = ROW_INVARIANT_BACKENDS if ROW_INVARIANT_BACKENDS.get(op) == backend else {op: op}
    for member in together:
        entries = _entries(verdict, member, backend, facts)
        if not entries or not all(verdict_allows(entry) for entry in entries):
            return False
    return True


# Of two proven GPU kernels auto leaves BACKENDS' order (cuda first) only for one the verdict
# measured this much faster: medians within a few % (the H200's compact_kv, 741x against 735x
# torch, 2026-11-28) are noise, and flipping on them would make auto's pick a coin toss.
AUTO_FASTER_BY = 1.10


def _verdict_speedup(verdict: dict, op: str, backend: str, facts: dict) -> float:
    """The speedup over torch ``verdict`` measured for ``backend``'s ``op`` at the inputs'
    dtype (the lowest over its dtypes when the op passes none); 0 where it has none (a
    row-invariant kernel joins auto whatever its speed)."""
    speedups = [entry.get("speedup_vs_torch") for entry in _entries(verdict, op, backend, facts)]
    return min((s if s is not None else 0.0 for s in speedups), default=0.0)


# The ops whose resolve passes no dtype (their kernels take any): auto proves and ranks their
# kernels over every dtype the verdict has for them (_entries); the rest per the inputs' dtype.
# tests/test_backend.py checks this set against the resolve calls of eagle_kernels/ops.
DTYPE_FREE_OPS = frozenset({
    "build_tree", "compact_kv", "eagle2_expand", "eagle2_rerank", "greedy_accept_chain",
    "greedy_accept_tree", "stochastic_accept_chain", "stochastic_accept_tree", "target_probs",
    "topk_log_softmax", "write_kv"})


def faster_first(proven: list[str], speed: dict[str, float]) -> list[str]:
    """``proven`` GPU backends (in BACKENDS' order), the fastest of the others first where its
    ``speed`` (speedup over torch) is AUTO_FASTER_BY above the first's."""
    if len(proven) > 1:
        best = max(proven[1:], key=speed.get)
        if speed[best] > AUTO_FASTER_BY * speed[proven[0]]:
            return [best] + [name for name in proven if name != best]
    return list(proven)


def _gpu_preference(op: str, device: torch.device, facts: dict) -> tuple[str, ...]:
    """The GPU backends auto may run ``op`` on for these inputs, preferred first: those this
    GPU's verdict proves, in BACKENDS' order unless the other was measured AUTO_FASTER_BY
    faster at the inputs' dtype (a proven cuda kernel can be slower than the triton one: the
    H200's top-k and stochastic acceptance, 2026-11-28). Empty, cheaply, off a GPU. On a GPU
    the answer is kept in the verdict's cached record, so resolve (every op call) looks it up."""
    names = [name for name in GPU_BACKENDS
             if name in _REGISTRY[op] and _supports_device(name, device)]
    if not names:
        return ()
    folder = _verdict_folder()
    verdict = (gpu_verdict(torch.cuda.get_device_name(device), str(folder))
               if device.type == "cuda" and folder is not None else {})
    key = (op, _dtype_name(facts["dtype"]) if "dtype" in facts else None)
    memo = verdict.setdefault("auto_order", {})  # off a GPU: a fresh dict, nothing kept
    if key not in memo:
        proven = [name for name in names if _proven_here(op, name, device, facts)]
        speed = {name: _verdict_speedup(verdict, op, name, facts) for name in proven}
        memo[key] = tuple(faster_first(proven, speed))
    return memo[key]


def _auto_choice(op: str, device: torch.device, facts: dict) -> tuple[str, Callable] | None:
    """The implementation auto runs for these inputs: the GPU kernels of
    :func:`_gpu_preference`, then cpu, then torch, the first that runs here and takes these
    inputs (None: none does, only the torch reference is left)."""
    implementations = _REGISTRY[op]
    for name in _gpu_preference(op, device, facts) + HOST_BACKENDS:
        impl = implementations.get(name)
        # Device first: it is the cheap test, and resolve runs on every op call.
        if (impl is not None and _supports_device(name, device) and _available(name)
                and (name in GPU_BACKENDS or impl.auto) and _unsupported(impl, facts) is None):
            return name, impl.fn
    return None


def resolve(op: str, backend: str, device: torch.device, **facts) -> tuple[str, Callable]:
    """Pick the implementation of ``op`` for tensors on ``device`` with these ``facts``.

    Raises ValueError naming the backend when an explicitly requested (or forced) backend has
    no implementation of ``op``, cannot run on this machine, cannot take ``device`` tensors or
    says it does not support inputs with these facts.
    """
    implementations = _REGISTRY[op]
    requested = _requested_backend(backend)
    if requested == "auto":
        return _auto_choice(op, device, facts) or ("torch", implementations["torch"].fn)
    impl = implementations.get(requested)
    if impl is None and backend == "auto":  # forced by the environment, not asked by name
        return "torch", implementations["torch"].fn
    if impl is None:
        raise ValueError(f"backend: {op} has no {requested!r} implementation "
                         f"(it has: {sorted(implementations)})")
    status = backend_status(requested)
    if not status.available:
        raise ValueError(f"backend: {requested!r} is not available here: {status.reason}")
    if not _supports_device(requested, device):
        raise ValueError(f"backend: {requested!r} cannot run {op} on {device.type} tensors")
    reason = _unsupported(impl, facts)
    if reason is not None:
        raise ValueError(f"backend: {requested!r} cannot run {op} here: {reason}")
    return requested, impl.fn


def _auto_label(op: str, name: str, impl: _Implementation) -> str:
    if name not in GPU_BACKENDS:
        return "auto" if impl.auto else "explicit only"
    if torch.cuda.is_available() and _gpu_preference(op, torch.device("cuda"), {})[:1] == (name,):
        return "auto"  # proven at every dtype of this GPU's verdict, and preferred there
    return "explicit only"


def op_backends() -> dict[str, dict[str, str]]:
    """For each op: backend -> 'auto' (chosen by auto when available) or 'explicit only'.
    A GPU kernel is 'auto' where this GPU's verdict proves it at every dtype and prefers it
    (:func:`_gpu_preference`: of two proven, the one measured faster at the slowest dtype).
    For an op that passes its dtype auto decides per dtype, so it can also run an 'explicit
    only' kernel at a dtype where that one is proven (and preferred)."""
    return {op: {name: _auto_label(op, name, impl) for name, impl in sorted(impls.items())}
            for op, impls in sorted(_REGISTRY.items())}


def _set_aside(verdict: dict) -> list[str]:
    """A report line per (op, backend) whose verdict entries :func:`source_changed` sets
    aside: the dtypes, the digest the GPU run proved and the one here."""
    changed: dict[tuple[str, str, str], list[str]] = {}
    for (op, backend, dtype), entry in sorted(verdict.get("entries", {}).items()):
        if source_changed(entry):
            changed.setdefault((op, backend, proved_digest(entry)), []).append(dtype)
    unknown = {"cuda": "none (no _C built with source digests here)"}
    return [f"    {op} {backend} ({', '.join(dtypes)}): proved {recorded}, here "
            f"{source_digest(op, backend) or unknown.get(backend, 'none')}"
            for (op, backend, recorded), dtypes in changed.items()]


def backend_report() -> str:
    """Human-readable table of backend availability and each op's implementations."""
    lines = ["backends on this machine:"]
    for name, status in available_backends().items():
        lines.append(f"  {name:<7} {'yes' if status.available else 'no ':<4} {status.reason}")
    lines.append("ops (backend: used by auto / explicit only):")
    for op, impls in op_backends().items():
        lines.append(f"  {op:<24} " + ", ".join(f"{b}: {how}" for b, how in impls.items()))
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        folder = _verdict_folder()
        verdict = gpu_verdict(name, str(folder)) if folder is not None else {}
        lines.append(f"GPU verdict for {name}: {verdict.get('path', 'none (auto stays torch)')}")
        stale = _set_aside(verdict)
        if stale:
            lines.append("  set aside, source changed since that GPU run (explicit only until "
                         "a run proves it):")
            lines += stale
    forced = os.environ.get(BACKEND_ENV)
    if forced:
        lines.append(f"{BACKEND_ENV}={forced} forces that backend for backend='auto'")
    return "\n".join(lines)
