"""The verdict of a GPU run: per op x backend x dtype, proven equal to the reference or not,
its largest error, and its speedup over torch. The backend registry reads it
(``eagle_kernels.ops._backend.verdict_allows``: proven and faster joins ``auto`` on that GPU).

    python3 bench/verdict.py stage WORK [--table FILE]   # a stage's own verdict (in its tarball)
    python3 bench/verdict.py run RUN_DIR                  # bench/collect_results.py: the run's

Evidence read from the folders given (each stage's unpacked tarball):

* ``kernel-check.json``: bench/sanitize_kernels.py --verdict (every op at every dtype it takes);
* ``gpu-tests.xml``: pytest -m gpu; a case counts for the family of its test file (every op
  for files of no one family) and for the GPU backend its parameters name, else the one its
  file name names (``test_acceptance_cuda.py``: cuda). An entry needs a passing case of its
  backend; a case naming neither backend proves neither, and its failure counts against both;
* ``memcheck.tsv``: ``op<TAB>clean|failed[<TAB>seconds]`` per op (bench/sanitize_kernels.py
  --memcheck-each);
  without it, ``steps.tsv``'s memcheck step for every op (a step that did not pass proves
  nothing);
* a rerun stage (``stage1b``, after a fix; bench/README.md): its results for a test file (all
  of that file's cases; only the cases it ran when its step timed out) or an op's memcheck
  replace the earlier stage's; what it did not rerun stands. Folders are read in the order
  given (an earlier run's proof, then stage1 before stage1b); the rerun's commit is in its
  ``environment.txt``;
* ``*.csv`` with ``op``, ``backend``, ``dtype``, ``speedup_vs_torch`` columns: the kernel
  benchmarks; an entry's speedup is the median over its rows of its own dtype (an entry
  ``mixed``, the KV family's one check over every cache dtype: over all its op's rows). An
  entry of a dtype never timed has no speedup, so it joins ``auto`` only as a row-invariant
  kernel; its ``speedup_note`` and the text table say why (bench_acceptance and bench_topk time
  every logits dtype since 2026-11-28; before, only bf16 acceptance and no fp16 top-k).

Schema of ``verdict.json`` (``schema`` 1)::

    {"schema": 1, "gpu": "<torch.cuda.get_device_name()>", "date": "YYYY-MM-DD",
     "environment": {...}, "rule": "...",
     "kernels": [{"op", "backend", "dtype", "proven": bool, "check": "correct|wrong|error|not
                  run", "max_error": float|null, "gpu_tests": "P passed, F failed",
                  "memcheck": "clean|failed|not run", "speedup_vs_torch": float|null,
                  "speedup_note": str, "auto": bool, "detail": str, "revision": int,
                  "source_digest": str (absent: before digests)}]}

``revision``: the kernel's code revision (``eagle_kernels.ops._backend.KERNEL_REVISIONS``) that
ran on the GPU, as its kernel check recorded it (a check that recorded none: 1); an entry of an
older revision keeps a rewritten kernel out of ``auto``. ``source_digest``: the digest of the
kernel's source that ran (``eagle_kernels.ops._backend.source_digest``), also as the kernel
check recorded it on the GPU ("unknown" where nothing vouched for it there: never counts);
absent from entries of checks older than digests, which prove the digests of b5ae095
(``_backend.LEGACY_SOURCE_DIGESTS``); null only where written by hand (the revision alone
then ties the entry to the code). An entry counts only while the kernel's source has the
digest it proved.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import re
import statistics
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = 1
RULE = ("proven: the kernel check matched the torch reference at this dtype on this GPU, the "
        "GPU tests of the op's family for this backend passed (at least one that names this "
        "backend, in its parameters or its file name, ran) and the memcheck pass was clean; "
        "auto: proven and median speedup_vs_torch over the benchmark rows of this dtype > 1 "
        "(none of this dtype: no speedup, not auto), or, for linear, rms_norm and "
        "tree_attention, proven and the row-invariant (triton) backend; at run time an "
        "entry counts only while the kernel's revision and source digest are those it proved")
# Which ops a test file's failures count against, by a word in its name.
FAMILY_WORDS = {
    "attention": ("tree_attention",),
    "decoder": ("linear", "rms_norm", "apply_rope", "silu_mul"),
    "topk": ("topk_log_softmax", "eagle2_expand", "eagle2_rerank"),
    "tree": ("build_tree",),
    "acceptance": ("greedy_accept_tree", "greedy_accept_chain", "stochastic_accept_tree",
                   "stochastic_accept_chain", "target_probs"),
    "sampling": ("target_probs", "stochastic_accept_tree", "stochastic_accept_chain"),
    "kv": ("compact_kv", "write_kv", "rope_write_kv"),
    "loss": ("soft_cross_entropy",),
}
GPU_BACKENDS = ("cuda", "triton")


def _find(folders: list[Path], pattern: str) -> list[Path]:
    """Matches in the folders' order (callers give stage order: an earlier run's proof, then
    stage1 before stage1b, so a rerun comes after what it reruns), sorted within each."""
    return [path for folder in folders for path in sorted(folder.rglob(pattern))]


def kernel_checks(folders: list[Path]) -> tuple[list[dict], str]:
    """The verdict-pass rows and the device they ran on ('' when none ran): the last stage's."""
    for path in reversed(_find(folders, "kernel-check.json")):
        report = json.loads(path.read_text())
        return report["rows"], report["device"]
    return [], ""


def _families(test_file: str) -> tuple[str, ...] | None:
    """Ops a test file covers, or None for a file of no one family (counts against all)."""
    ops = [op for word, family in FAMILY_WORDS.items() if word in test_file for op in family]
    return tuple(ops) or None


def _named_backends(text: str, separators: str) -> tuple[str, ...]:
    """The GPU backends ``text`` names as words between ``separators``."""
    words = set(re.split(separators, text))
    return tuple(b for b in GPU_BACKENDS if b in words)


def _backends_of(source: str, name: str) -> tuple[str, ...]:
    """The backends a test case is of: those its parameters name ("[bf16-cuda]", not
    "[in_cuda_graph]"), else those its file's name names ("tests/test_tree_cuda.py"); () for a
    case naming none."""
    params = name.split("[", 1)[1] if "[" in name else ""
    return (_named_backends(params, r"[^A-Za-z0-9_]+")
            or _named_backends(source, r"[^A-Za-z0-9]+"))


def _cases(path: Path) -> dict[str, list[tuple[str, tuple]]]:
    """Test file -> [(case name, (ops or None, backends named, passed / failed / skipped))] in
    one XML."""
    by_file: dict[str, list] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        outcome = "passed"
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        source = case.get("file") or case.get("classname", "").replace(".", "/")
        by_file.setdefault(source, []).append(
            (name, (_families(source), _backends_of(source, name), outcome)))
    return by_file


def _step_status(stage: Path, step: str) -> str:
    """A step's status in the stage's steps.tsv ('' when it is not there)."""
    path = stage / "steps.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]] \
        if path.is_file() else []
    return next((row[1] for row in rows if row[0] == step and len(row) > 1), "")


def test_tally(folders: list[Path]) -> list[tuple[tuple | None, tuple, str]]:
    """(ops or None, backends, passed / failed / skipped) per GPU test case; a test file's cases
    from the last stage that ran it whole (a rerun runs whole files: its case ids may have
    changed). A run cut short (its step timed out) replaces only the cases it ran, by id."""
    by_file: dict[str, dict[str, tuple]] = {}
    for path in _find(folders, "gpu-tests.xml"):
        complete = not _step_status(path.parent, "gpu-tests").startswith("timed out")
        for source, cases in _cases(path).items():
            if complete:
                by_file[source] = dict(cases)
            else:
                by_file.setdefault(source, {}).update(cases)
    return [case for cases in by_file.values() for case in cases.values()]


def memcheck_statuses(folders: list[Path]) -> dict[str, str] | str:
    """Per op, clean / failed from a per-op pass (``memcheck.tsv``; ops it lacks: not run); or,
    without one, the memcheck step's status for every op (a str)."""
    per_op = {}
    for path in _find(folders, "memcheck.tsv"):
        per_op.update(line.split("\t")[:2] for line in path.read_text().splitlines())
    if per_op:
        return per_op
    for path in _find(folders, "steps.tsv"):
        for line in path.read_text().splitlines()[1:]:
            name, status = line.split("\t")[:2]
            if name == "memcheck":
                return "clean" if status == "ok" else "failed"
    return "not run"


def _memcheck_for(statuses: dict[str, str] | str, op: str) -> str:
    return statuses if isinstance(statuses, str) else statuses.get(op, "not run")


def speedups(folders: list[Path]) -> dict[tuple[str, str], list[tuple[str, float]]]:
    """(op, backend) -> [(dtype, speedup_vs_torch)] over every kernel benchmark row."""
    found: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for path in _find(folders, "*.csv"):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                value = row.get("speedup_vs_torch") or ""
                if not value or "op" not in row or "backend" not in row:
                    continue
                found.setdefault((row["op"], row["backend"]), []).append(
                    (row.get("dtype", ""), float(value)))
    return found


MIXED = "mixed"  # the dtype label of a check over several dtypes (the KV family's)


def _speedup(rows: list[tuple[str, float]], dtype: str) -> tuple[float | None, str]:
    """The median speedup over the rows of ``dtype`` and, when there are none, why there is no
    speedup: another dtype's rows say nothing of this one's (an fp32 row reads twice the bytes
    of a bf16 one)."""
    # "mixed": one kernel check covering every cache dtype at once (the KV family moves bytes
    # of any dtype): its rows are all the op's rows, of whatever dtype they were timed at
    same = [value for kind, value in rows if kind == dtype or dtype == MIXED]
    if same:
        return round(statistics.median(same), 3), ""
    timed = sorted({kind or "?" for kind, _ in rows})
    return None, (f"no benchmark rows at {dtype}" + (f" (timed: {', '.join(timed)})"
                                                     if timed else ""))


def _tests_for(tally, op: str, backend: str) -> tuple[int, int]:
    """(passed, failed) of the op's family's cases: passes of cases of this backend; failures
    of cases of this backend or of none (a failure naming no backend may be either's)."""
    passed = failed = 0
    for ops, backends, outcome in tally:
        if ops is not None and op not in ops:
            continue
        passed += outcome == "passed" and backend in backends
        failed += outcome == "failed" and (backend in backends or not backends)
    return passed, failed


def _joins_auto(entry: dict) -> bool:
    """The registry's rule for this checkout; where this checkout has no digest of the kernel
    (no triton here, an _C built without digests) the recorded one cannot be compared, so the
    rest of the rule decides (a digest known here and different: evidence of other code)."""
    from eagle_kernels.ops._backend import source_digest, verdict_allows

    if source_digest(entry["op"], entry["backend"]) is None and (
            entry.get("source_digest") != "unknown"):  # unknown on the GPU: never vouched for
        entry = {**entry, "source_digest": None}
    return verdict_allows(entry)


def build(folders: list[Path], gpu: str, environment: dict | None = None) -> dict:
    """The verdict from the evidence in ``folders`` (see the module docstring)."""
    checks, device = kernel_checks(folders)
    tally, memchecks, timed = test_tally(folders), memcheck_statuses(folders), speedups(folders)
    kernels = []
    for row in checks:
        if row["backend"] not in GPU_BACKENDS:
            continue
        passed, failed = _tests_for(tally, row["op"], row["backend"])
        memcheck = _memcheck_for(memchecks, row["op"])
        proven = (device.startswith("cuda") and row["status"] == "correct" and passed > 0
                  and failed == 0 and memcheck == "clean")
        speedup, speedup_note = _speedup(timed.get((row["op"], row["backend"]), []),
                                         row["dtype"])
        entry = dict(op=row["op"], backend=row["backend"], dtype=row["dtype"], proven=proven,
                     check=row["status"], max_error=row["max_error"],
                     gpu_tests=f"{passed} passed, {failed} failed", memcheck=memcheck,
                     speedup_vs_torch=speedup, speedup_note=speedup_note,
                     detail=row.get("detail", ""), revision=row.get("revision", 1))
        if "source_digest" in row:  # a check of before digests: its entry proves their day's
            entry["source_digest"] = row["source_digest"]  # (_backend.LEGACY_SOURCE_DIGESTS)
        entry["auto"] = _joins_auto(entry)
        kernels.append(entry)
    return {"schema": SCHEMA, "gpu": gpu, "device": device,
            "date": datetime.date.today().isoformat(), "environment": environment or {},
            "rule": RULE, "kernels": kernels}


def _auto_order(kernels: list[dict]) -> dict[tuple[str, str, str], str]:
    """(op, backend, dtype) -> "first" / "second" for the entries auto may run where a proven
    pair of GPU kernels share an op (and dtype, for an op resolved by dtype): the one auto
    tries first by the registry's rule (_backend._gpu_preference: an op resolved without a
    dtype counts a backend only where every dtype of it may run, at its lowest speedup)."""
    from eagle_kernels.ops._backend import DTYPE_FREE_OPS, GPU_BACKENDS, faster_first

    groups: dict[tuple[str, str | None], dict[str, list[dict]]] = {}
    for entry in kernels:
        dtype = None if entry["op"] in DTYPE_FREE_OPS else entry["dtype"]
        groups.setdefault((entry["op"], dtype), {}).setdefault(entry["backend"], []).append(entry)
    order = {}
    for by_backend in groups.values():
        eligible = [name for name in GPU_BACKENDS if name in by_backend
                    and all(entry["auto"] for entry in by_backend[name])]
        if len(eligible) < 2:
            continue
        speed = {name: min(entry["speedup_vs_torch"] or 0.0 for entry in by_backend[name])
                 for name in eligible}
        for rank, name in enumerate(faster_first(eligible, speed)):
            for entry in by_backend[name]:
                order[entry["op"], name, entry["dtype"]] = "first" if rank == 0 else "second"
    return order


def table(verdict: dict) -> str:
    """The verdict as an aligned text table (stage summaries, RESULTS.md). The auto column
    says which entries auto may run, and of a proven cuda / triton pair which it tries first."""
    order = _auto_order(verdict["kernels"])
    lines = [f"verdict for {verdict['gpu']} (kernel check on {verdict['device'] or 'nothing'})",
             f"{'op':<24} {'backend':<7} {'dtype':<9} {'check':<8} {'max error':<10} "
             f"{'gpu tests':<20} {'memcheck':<8} {'speedup':<8} auto"]
    for e in verdict["kernels"]:
        error = "" if e["max_error"] is None else f"{e['max_error']:.3g}"
        speedup = "" if e["speedup_vs_torch"] is None else f"{e['speedup_vs_torch']:.2f}"
        lines.append(f"{e['op']:<24} {e['backend']:<7} {e['dtype']:<9} {e['check']:<8} "
                     f"{error:<10} {e['gpu_tests']:<20} {e['memcheck']:<8} {speedup:<8} "
                     f"{_auto_cell(e, order)}")
    notes = [f"{e['op']} {e['backend']} {e['dtype']}: {e['speedup_note']}, so no speedup"
             + ("" if e["auto"] else " and not auto")
             for e in verdict["kernels"] if e.get("speedup_note")]
    return "\n".join(lines + (["", "speedups:"] + notes if notes else []))


def _auto_cell(entry: dict, order: dict) -> str:
    if not entry["auto"]:
        return "no"
    rank = order.get((entry["op"], entry["backend"], entry["dtype"]))
    return f"yes, {rank}" if rank else "yes"


def _gpu_name(folders: list[Path]) -> str:
    """torch.cuda.get_device_name() as the stage recorded it: what the registry matches."""
    for path in _find(folders, "environment.txt"):
        for line in path.read_text().splitlines():
            if line.startswith("gpu: ") and line != "gpu: none":
                return line[len("gpu: "):].strip()
    return "no GPU (dry run)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=("stage", "run"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--table", type=Path, help="also write the text table here")
    args = parser.parse_args(argv)
    folders = [args.folder]
    verdict = build(folders, _gpu_name(folders))
    (args.folder / "verdict.json").write_text(json.dumps(verdict, indent=1) + "\n")
    text = table(verdict)
    if args.table:
        args.table.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
