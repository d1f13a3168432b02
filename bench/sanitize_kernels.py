"""One pass of every kernel against the torch reference: what compute-sanitizer watches.

    compute-sanitizer --tool memcheck --error-exitcode 1 python bench/sanitize_kernels.py
    python bench/sanitize_kernels.py [--device cpu|cuda] [--op NAME ...]
    python bench/sanitize_kernels.py --memcheck-each TSV   # one memcheck process per op

For every op of :func:`eagle_kernels.ops.op_backends` and every non-torch backend registered for
it, the op runs once on small, valid inputs with awkward sizes (vocabularies, node counts and
row sizes that are not multiples of 32 or of a block; a packed tree mask of two words; enough
prefix keys for split-KV attention), and its outputs are compared with ``backend="torch"``:
integer outputs exactly, float outputs within a tolerance per op (exact where the op promises
bit-exactness). One line per (op, backend): ``ok``, ``MISMATCH``, ``ERROR`` or ``skipped``
with the reason (a backend not available here, or one that cannot take ``--device`` tensors).
Exit status 1 on any mismatch, error or op without example inputs here, else 0.

Why: the unit tests check values; memcheck (out-of-bounds and misaligned accesses, which can
leave values right by luck) is too slow for the whole test suite, so it gets this one pass.
A bad access leaves the CUDA context unusable, hiding every op after it: ``--memcheck-each``
runs memcheck once per op, in its own process (a few at once), and writes
``op<TAB>clean|failed<TAB>seconds`` rows (the verdict reads them per op).
Without a GPU the Triton kernels run in the interpreter (``TRITON_INTERPRET=1``, set below
before eagle_kernels is imported), so CI proves the script itself works.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any Triton kernel is defined

from eagle_kernels import ops  # noqa: E402
from eagle_kernels.ops import _backend  # noqa: E402


class Case(NamedTuple):
    """How to run one op: ``call(backend)`` returns its outputs as a list of tensors (fresh
    copies of the inputs every call, so in-place ops compare like the others); ``tolerance``
    is (rtol, atol) for float outputs, None when they must be bit-exact."""

    call: Callable[[str], list]
    tolerance: tuple[float, float] | None


def _flatten(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for item in result for t in _flatten(item)]


def _simple(op: str, args: tuple, kwargs: dict | None = None,
            tolerance: tuple[float, float] | None = None) -> Case:
    """A Case for an op that returns tensors and leaves its inputs alone."""
    return Case(lambda backend: _flatten(getattr(ops, op)(*args, **(kwargs or {}),
                                                          backend=backend)), tolerance)


def _random_parents(batch: int, nodes: int, gen: torch.Generator) -> torch.Tensor:
    """[B, N] int32 topologically ordered trees, mostly deep (parent among the last 3 nodes)."""
    parents = torch.full((batch, nodes), -1, dtype=torch.int32)
    for node in range(1, nodes):
        parents[:, node] = node - 1 - torch.randint(0, min(node, 3), (batch,), generator=gen)
    return parents


def _planted_tokens(parents: torch.Tensor, logits: torch.Tensor, gen) -> torch.Tensor:
    """Draft tokens, half of them the argmax of their parent's logits, so paths get accepted."""
    batch, nodes, vocab = logits.shape
    tokens = torch.randint(0, vocab, (batch, nodes), generator=gen)
    best = logits.float().argmax(-1)
    for node in range(1, nodes):
        plant = torch.rand(batch, generator=gen) < 0.5
        parent_best = best.gather(1, parents[:, node:node + 1].long()).squeeze(1)
        tokens[:, node] = torch.where(plant, parent_best, tokens[:, node])
    return tokens


def tree_cases(device, gen, dtype=torch.float32) -> dict[str, Case]:
    """build_tree on 45-node trees: two mask words, the second one partly used."""
    parents = _random_parents(3, 45, gen).to(device)
    return {"build_tree": _simple("build_tree", (parents,))}


def acceptance_cases(device, gen, dtype=torch.bfloat16) -> dict[str, Case]:
    """Greedy and stochastic verification of 13-node trees / chains over a 1000-token vocab."""
    batch, nodes, vocab = 3, 13, 1000
    parents = _random_parents(batch, nodes, gen)
    chain = torch.arange(-1, nodes - 1, dtype=torch.int32).expand(batch, -1).contiguous()
    logits = (3 * torch.randn(batch, nodes, vocab, generator=gen)).to(dtype)
    tree_tokens = _planted_tokens(parents, logits, gen).to(device)
    chain_tokens = _planted_tokens(chain, logits, gen).to(device)
    paths = ops.build_tree(parents)[2].to(device)
    draft = torch.softmax(torch.randn(batch, nodes - 1, vocab, generator=gen), -1).to(device)
    uniforms = torch.rand(batch, nodes, generator=gen).to(device)
    bonus = torch.rand(batch, generator=gen).to(device)
    rows = torch.randn(7, vocab, generator=gen).to(dtype).to(device)
    logits, parents = logits.to(device), parents.to(device)
    sampling = dict(temperature=0.8)
    return {
        "greedy_accept_tree": _simple("greedy_accept_tree", (tree_tokens, paths, logits)),
        "greedy_accept_chain": _simple("greedy_accept_chain", (chain_tokens, logits)),
        "stochastic_accept_tree": _simple(
            "stochastic_accept_tree", (tree_tokens, parents, logits, uniforms, bonus), sampling),
        "stochastic_accept_chain": _simple(
            "stochastic_accept_chain", (chain_tokens, draft, logits, uniforms, bonus), sampling),
        "target_probs": _simple("target_probs", (rows,),
                                dict(temperature=0.7, top_k=11, top_p=0.9), (1e-4, 1e-5)),
    }


def topk_cases(device, gen, dtype=torch.float32) -> dict[str, Case]:
    """Top-k of 1000-token rows (with an EAGLE-3 d2t map), one expansion step, one rerank."""
    logits = torch.randn(5, 1000, generator=gen).to(dtype).to(device)
    d2t = torch.arange(1000, dtype=torch.int64).to(device)  # draft id i -> target id 2 i
    frontier = -torch.rand(3, 5, generator=gen).to(device)
    children = torch.log_softmax(torch.randn(3, 5, 9, generator=gen), -1).to(device)
    batch, candidates = 3, 23
    parents = torch.full((batch, candidates), -1, dtype=torch.int32)
    scores = torch.zeros(batch, candidates)
    for index in range(candidates):
        parent = torch.randint(-1, index, (batch,), generator=gen) if index else parents[:, 0]
        parents[:, index] = parent
        above = scores.gather(1, parent.clamp(min=0).long().unsqueeze(1)).squeeze(1)
        scores[:, index] = torch.where(parent >= 0, above, 0.0) - torch.rand(batch, generator=gen)
    roots = torch.randint(0, 1000, (batch,), generator=gen).to(device)
    tokens = torch.randint(0, 1000, (batch, candidates), generator=gen).to(device)
    return {
        "topk_log_softmax": _simple("topk_log_softmax", (logits, 7), dict(d2t=d2t),
                                    (1e-5, 1e-5)),
        "eagle2_expand": _simple("eagle2_expand", (frontier, children, 7)),
        "eagle2_rerank": _simple("eagle2_rerank", (roots, tokens, scores.to(device),
                                                   parents.to(device), 10)),
    }


def attention_cases(device, gen, dtype=torch.bfloat16) -> dict[str, Case]:
    """Tree attention, bf16, GQA 6:2 heads of 64, 13 tree keys after prefixes of up to 530
    keys (max_len 560: two key splits and the merge kernel)."""
    batch, nodes, max_len = 2, 13, 560
    mask = ops.build_tree(_random_parents(batch, nodes, gen))[1]
    lens = torch.tensor([530, 17], dtype=torch.int32)
    q = torch.randn(batch, nodes, 6, 64, generator=gen)
    k, v = (torch.randn(batch, max_len, 2, 64, generator=gen) for _ in range(2))
    args = [t.to(dtype).to(device) for t in (q, k, v)] + [lens.to(device),
                                                                  mask.to(device)]
    return {"tree_attention": _simple("tree_attention", tuple(args), tolerance=(2e-2, 2e-2))}


def decoder_cases(device, gen, dtype=torch.float32) -> dict[str, Case]:
    """The decoder's linear (q / k / v of 130 rows: three of its 64-row tiles; K = 576 in K
    splits, a bias), rms_norm (with a residual), apply_rope (9 heads of 80: a padded head
    block; bit for bit, its contract), silu_mul and rope_write_kv, scaled so outputs are
    O(1)."""
    x = torch.randn(130, 576, generator=gen)
    weights = [torch.randn(n, 576, generator=gen) / 24 for n in (576, 192, 200)]
    bias = torch.randn(200, generator=gen)
    h, residual, norm = (torch.randn(5, 3, 576, generator=gen) for _ in range(3))
    heads, cos, sin = (torch.randn(shape, generator=gen) for shape in ((2, 7, 9, 80), (50, 80),
                                                                       (50, 80)))
    positions = torch.randint(0, 50, (2, 7), generator=gen).to(device)
    move = [t.to(dtype).to(device) for t in (x, *weights, bias, h, residual, norm[0, 0], heads,
                                             cos, sin)]
    x, w_q, w_k, w_v, bias, h, residual, norm, heads, cos, sin = move
    tolerance = (1e-4, 1e-4) if dtype == torch.float32 else (2e-2, 2e-2)
    return {"linear": _simple("linear_group", (x, [w_q, w_k, w_v], [None, None, bias]),
                              tolerance=tolerance),
            "rms_norm": _simple("rms_norm", (h, norm, 1e-5, residual), tolerance=tolerance),
            "apply_rope": _simple("apply_rope", (heads, positions, cos, sin)),  # bit for bit
            "silu_mul": _simple("silu_mul", (h * 4, residual), tolerance=tolerance),
            "rope_write_kv": _rope_write_case(heads, positions, cos, sin, gen)}


def _rope_write_case(q, positions, cos, sin, gen) -> Case:
    """rope_write_kv of q's 7 tokens (9 heads of 80) with 3 k / v heads into caches of 12 rows,
    the last sequence's rows ending at the cache's end; bit for bit, as apply_rope (a dtype
    sweep: RoPE rounds per dtype)."""
    k, v = (torch.randn(2, 7, 3, 80, generator=gen).to(q.dtype).to(q.device) for _ in range(2))
    lens = torch.tensor([0, 3], dtype=torch.int32, device=q.device)

    def call(backend):
        caches = [torch.zeros(2, 12, 3, 80, dtype=q.dtype, device=q.device) for _ in range(2)]
        rotated = ops.rope_write_kv(q, k, v, positions, cos, sin, *caches, lens, 2,
                                    backend=backend)
        return [rotated, *caches]

    return Case(call, None)


def kv_cases(device, gen, dtype=torch.float32) -> dict[str, Case]:
    """compact_kv in place over three caches of different dtypes and odd row sizes; write_kv
    of 5 rows past an offset of 2 (one sequence's last row at the cache's end)."""
    batch, max_len, width = 3, 40, 6
    caches = [torch.randn(batch, max_len, 2, 24, generator=gen).to(torch.bfloat16),
              torch.randn(batch, max_len, 3, 5, generator=gen),
              torch.randn(batch, max_len, 1, 7, generator=gen).to(torch.float16)]
    lens = torch.randint(0, 20, (batch,), generator=gen, dtype=torch.int32)
    accepted = torch.randint(0, width, (batch,), generator=gen, dtype=torch.int32)
    nodes = torch.full((batch, width), -1, dtype=torch.int32)
    for b in range(batch):
        count = int(accepted[b])
        path = torch.randperm(15, generator=gen)[:count].sort().values + 1
        nodes[b, :count + 1] = torch.cat([torch.zeros(1, dtype=torch.long), path]).int()
    caches = [c.to(device) for c in caches]
    lens, nodes, accepted = lens.to(device), nodes.to(device), accepted.to(device)

    def call(backend):
        copies = [c.clone() for c in caches]
        ops.compact_kv(copies, lens, nodes, accepted, backend=backend)
        return copies

    new_k, new_v = (torch.randn(batch, 5, 3, 5, generator=gen).to(device) for _ in range(2))
    write_lens = torch.tensor([0, 11, max_len - 7], dtype=torch.int32, device=device)

    def write(backend):
        copies = [caches[1].clone(), caches[1].clone()]
        ops.write_kv(new_k, new_v, *copies, write_lens, 2, backend=backend)
        return copies

    return {"compact_kv": Case(call, None), "write_kv": Case(write, None)}


def loss_cases(device, gen, dtype=torch.float32) -> dict[str, Case]:
    """soft_cross_entropy forward and backward, 7 rows of 1000 fp32 logits."""
    draft = (4 * torch.randn(7, 1000, generator=gen)).to(dtype).to(device)
    target = (4 * torch.randn(7, 1000, generator=gen)).to(dtype).to(device)
    weights = torch.rand(7, generator=gen).to(device)

    def call(backend):
        x = draft.clone().requires_grad_(True)
        loss = ops.soft_cross_entropy(x, target, backend=backend)
        (loss * weights).sum().backward()
        return [loss.detach(), x.grad]

    return {"soft_cross_entropy": Case(call, (1e-4, 1e-5))}


FLOAT_DTYPES = ("float32", "float16", "bfloat16")
FAMILIES = (tree_cases, acceptance_cases, topk_cases, attention_cases, decoder_cases, kv_cases,
            loss_cases)


def _compare(got: list, want: list, tolerance) -> str | None:
    """None when the outputs agree, else what differs first."""
    if len(got) != len(want):
        return f"{len(got)} outputs, reference has {len(want)}"
    for index, (a, b) in enumerate(zip(got, want)):
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {index}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
        if tolerance is None or not a.is_floating_point():
            if not torch.equal(a, b):
                return f"output {index}: {int((a != b).sum())} of {a.numel()} entries differ"
        elif not torch.allclose(a.float(), b.float(), *tolerance, equal_nan=True):
            return (f"output {index}: max abs difference "
                    f"{float((a.float() - b.float()).abs().max()):.3g}, (rtol, atol) {tolerance}")
    return None


def _skip_reason(backend: str, device: torch.device) -> str | None:
    status = _backend.backend_status(backend)
    if not status.available:
        return status.reason
    if not _backend._supports_device(backend, device):
        return f"{backend} cannot take {device.type} tensors here"
    return None


def check_all(device: torch.device, seed: int = 0,
              only: list[str] | None = None) -> list[tuple[str, str, str, str]]:
    """(op, backend, status, detail) for every op (or those in ``only``) and GPU backend (cuda,
    triton; the cpu backend is proven by the test suite on CPU); status is one of
    ok / MISMATCH / ERROR / skipped / MISSING (no example inputs here)."""
    gen = torch.Generator().manual_seed(seed)
    cases: dict[str, Case] = {}
    for family in FAMILIES:
        cases.update(family(device, gen))
    results = []
    for op, backends in ops.op_backends().items():
        if only and op not in only:
            continue
        if op not in cases:
            if not {"cuda", "triton"} & set(backends):
                continue  # no GPU kernel (e.g. the cpu backend's decoder ops): nothing to check
            results.append((op, "-", "MISSING", "no example inputs: add them to this script"))
            continue
        for backend in (name for name in backends if name in ("cuda", "triton")):
            reason = _skip_reason(backend, device)
            if reason is not None:
                results.append((op, backend, "skipped", reason))
                continue
            try:
                got = cases[op].call(backend)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # a bad access is reported at this op
                difference = _compare(got, cases[op].call("torch"), cases[op].tolerance)
            except Exception as error:  # report every op, then fail
                results.append((op, backend, "ERROR", f"{type(error).__name__}: {error}"))
                continue
            results.append((op, backend, "ok", "") if difference is None
                           else (op, backend, "MISMATCH", difference))
    return results


# The float dtypes each family's inputs are swept over in the verdict pass; ops whose inputs
# have no float dtype to choose carry a fixed label instead (compact_kv moves mixed caches).
FAMILY_DTYPES = {tree_cases: ("int32",), acceptance_cases: FLOAT_DTYPES,
                 topk_cases: FLOAT_DTYPES, attention_cases: FLOAT_DTYPES,
                 decoder_cases: FLOAT_DTYPES,
                 kv_cases: ("mixed",), loss_cases: FLOAT_DTYPES}
FIXED_DTYPE = {"eagle2_expand": "float32", "eagle2_rerank": "float32"}
HALF_TOLERANCE = (1e-2, 1e-2)  # fp16 / bf16 inputs: the floor for every float comparison


def _max_error(got: list, want: list) -> float:
    """Largest absolute difference over the float outputs (integers: 0 or inf)."""
    error = 0.0
    for a, b in zip(got, want):
        a, b = a.detach().cpu(), b.detach().cpu()
        if a.shape != b.shape:
            return float("inf")
        if a.is_floating_point():
            difference = (a.float() - b.float()).abs()
            finite = torch.isfinite(a.float()) == torch.isfinite(b.float())
            error = max(error, float(difference[torch.isfinite(difference)].max())
                        if difference.numel() else 0.0)
            if not bool(finite.all()):
                return float("inf")
        elif not torch.equal(a, b):
            return float("inf")
    return error


def _dtype_cases(device, seed: int) -> list[tuple[str, str, Case]]:
    """(op, dtype label, case) for every family at every dtype it is swept over."""
    cases, seen = [], set()
    for family, dtypes in FAMILY_DTYPES.items():
        for label in dtypes:
            gen = torch.Generator().manual_seed(seed)
            dtype = getattr(torch, label) if label in FLOAT_DTYPES else torch.float32
            for op, case in family(device, gen, dtype).items():
                op_label = FIXED_DTYPE.get(op, label)
                if (op, op_label) in seen:
                    continue
                seen.add((op, op_label))
                if label in ("float16", "bfloat16") and case.tolerance is not None:
                    case = case._replace(tolerance=tuple(map(max, case.tolerance,
                                                             HALF_TOLERANCE)))
                cases.append((op, op_label, case))
    return cases


def _run_digest(op: str, backend: str) -> str:
    """The source digest of the kernel code that runs here (``_backend.source_digest``), or
    "unknown" where nothing here vouches for it (no source, an _C without digests): a digest
    that never matches, so its entry cannot join auto on the revision alone."""
    return _backend.source_digest(op, backend) or "unknown"


def verdict_rows(device: torch.device, seed: int = 0) -> list[dict]:
    """One row per (op, non-torch backend, dtype): status correct / wrong / error / not run,
    the largest absolute difference from the torch reference, why (not), and the revision and
    source digest of the kernel code that ran (``_backend.KERNEL_REVISIONS``,
    ``_backend.source_digest``: what a verdict proves)."""
    registered = ops.op_backends()
    rows = []
    for op, label, case in _dtype_cases(device, seed):
        for backend in (name for name in registered.get(op, {}) if name != "torch"):
            row = dict(op=op, backend=backend, dtype=label, status="not run", max_error=None,
                       detail=_skip_reason(backend, device) or "",
                       revision=_backend.kernel_revision(op, backend),
                       source_digest=_run_digest(op, backend))
            if not row["detail"]:
                row.update(_run_case(case, backend, device))
            rows.append(row)
    return rows


def _run_case(case: Case, backend: str, device: torch.device) -> dict:
    try:
        got = case.call(backend)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        want = case.call("torch")
    except ValueError as error:  # the backend declares it cannot take these inputs
        return dict(status="not run", detail=f"unsupported: {error}")
    except Exception as error:
        return dict(status="error", detail=f"{type(error).__name__}: {error}")
    difference = _compare(got, want, case.tolerance)
    return dict(status="correct" if difference is None else "wrong",
                max_error=_max_error(got, want), detail=difference or "")


def write_verdict_rows(path: str, device: torch.device, seed: int) -> int:
    """Write the verdict pass as JSON (bench/verdict.py reads it); 1 if any row is wrong."""
    import json

    rows = verdict_rows(device, seed)
    for row in rows:
        error = "" if row["max_error"] is None else f" max error {row['max_error']:.3g}"
        print(f"{row['op']:<24} {row['backend']:<7} {row['dtype']:<9} {row['status']}{error}"
              + (f": {row['detail']}" if row["detail"] else ""), flush=True)
    with open(path, "w") as handle:
        json.dump({"device": str(device), "seed": seed, "rows": rows}, handle, indent=1,
                  default=lambda value: None)
    return 1 if any(row["status"] in ("wrong", "error") for row in rows) else 0


def gpu_ops() -> list[str]:
    """Ops with a cuda or triton kernel: what memcheck covers."""
    return [op for op, backends in ops.op_backends().items() if {"cuda", "triton"} & set(backends)]


MEMCHECK_WORKERS = 4  # memcheck processes at once (the GPU machine has 16 cores, one GPU)
MEMCHECK_TIMEOUT_S = 60.0  # one op's process


def _memcheck_command(op: str, seed: int) -> list[str]:
    return ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1",
            sys.executable, __file__, "--seed", str(seed), "--op", op]


def _exit_on_signal(number, frame) -> None:
    raise SystemExit(128 + number)


def _kill_group(process) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # ended meanwhile
        pass


def memcheck_each(path: str, seed: int, only: list[str] | None = None,
                  timeout_s: float = MEMCHECK_TIMEOUT_S, workers: int = MEMCHECK_WORKERS) -> int:
    """One compute-sanitizer memcheck process per GPU op (those in ``only`` when given), up to
    ``workers`` at once; ``op<TAB>clean|failed<TAB>seconds`` rows to ``path`` (rewritten as each
    op ends, so a pass cut short keeps what ended), each process's output to stdout; 1 if any
    failed. Each op still has its own process and CUDA context (a bad access in one cannot hide
    another's); at 2026-11-27's ~8 s an op one at a time, most of it is the process's start
    (Python, torch, the sanitizer's attach), which runs side by side on the machine's cores.
    An interrupt (the stage's timeout) or a SIGTERM kills the processes still running."""
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")  # no pool hides an overrun
    waiting, running, rows = list(only or gpu_ops()), {}, {}
    # A SIGTERM (a plain `timeout`, a supervisor) must reach the finally below as SIGINT does:
    # the sanitizers run in sessions of their own, out of reach of a signal to our group.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)

    def end(op: str, status: str, note: str = "") -> None:
        process, log, started = running.pop(op)
        log.seek(0)
        rows[op] = (status, time.monotonic() - started)
        print(f"== {op}: memcheck {status} ({rows[op][1]:.0f} s){note}\n{log.read()}", flush=True)
        log.close()
        with open(path, "w") as handle:
            handle.writelines(f"{name}\t{st}\t{sec:.1f}\n" for name, (st, sec) in rows.items())

    try:
        while waiting or running:
            while waiting and len(running) < workers:
                op = waiting.pop(0)
                log = tempfile.TemporaryFile("w+")
                # its own session: a kill reaches the Python process the sanitizer started
                running[op] = (subprocess.Popen(_memcheck_command(op, seed), env=env, stdout=log,
                                                stderr=subprocess.STDOUT, text=True,
                                                start_new_session=True),
                               log, time.monotonic())
            time.sleep(0.1)
            for op, (process, _, started) in list(running.items()):
                if process.poll() is not None:
                    end(op, "clean" if process.returncode == 0 else "failed")
                elif time.monotonic() - started > timeout_s:
                    _kill_group(process)
                    process.wait()
                    end(op, "failed", f": timed out after {timeout_s:.0f} s")
    finally:
        for process, log, _ in running.values():  # interrupted: nothing left running
            _kill_group(process)
            log.close()
        signal.signal(signal.SIGTERM, previous)
    print("\n".join(f"{op:<24} {status}" for op, (status, _) in rows.items()))
    return 1 if any(status != "clean" for status, _ in rows.values()) else 0


def main(argv: list[str] | None = None) -> int:
    """Print one line per (op, backend); 1 on any mismatch, error or missing op, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="device of the example inputs (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the example inputs")
    parser.add_argument("--verdict", metavar="JSON",
                        help="instead: every op at every dtype it takes, rows to JSON")
    parser.add_argument("--op", action="append", choices=gpu_ops(),
                        help="check only this op (repeatable)")
    parser.add_argument("--memcheck-each", metavar="TSV",
                        help="instead: one compute-sanitizer memcheck process per op")
    args = parser.parse_args(argv)
    if args.memcheck_each:
        return memcheck_each(args.memcheck_each, args.seed, args.op)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")
    if args.verdict:
        return write_verdict_rows(args.verdict, device, args.seed)
    print(f"device {device}; {_backend.backend_status('triton').reason}; "
          f"{_backend.backend_status('cuda').reason}")
    results = check_all(device, args.seed, args.op)
    for op, backend, status, detail in results:
        print(f"{op:<24} {backend:<7} {status}" + (f": {detail}" if detail else ""), flush=True)
    failed = [r for r in results if r[2] in ("MISMATCH", "ERROR", "MISSING")]
    print(f"{len(results) - len(failed)} of {len(results)} (op, backend) pairs ok or skipped; "
          f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
