"""Turn what GPU stages brought back into a committed run: bench/results/<date>_<gpu>/ with
each stage's unpacked tarball, verdict.json (read by the backend registry) and RESULTS.md.

    python3 bench/collect_results.py FOLDER [FOLDER ...]   # each a stage's files_at ($OUT copy)
    python3 bench/collect_results.py --proof-from RUN_DIR FOLDER ...   # a run without stage 1
    python3 bench/collect_results.py --run NAME FOLDER ...  # into results/NAME, not <date>_<gpu>

A stage folder already in the run folder is never replaced (a second lease the same day names
its stages apart with EAGLE_STAGE_TAG, or is collected with ``--run``); stages added to a run
folder join its verdict, which is rebuilt from every stage there, so ``verdict.json`` always
stands on the data beside it. A run folder whose verdict leaned on ``--proof-from`` takes no
more stages without it (the rebuilt verdict would have no stage 1 to read).

``--proof-from`` (a lease that skipped stage 1 on a GPU proven before): the verdict also reads
RUN_DIR's stage-1 evidence (GPU tests, memcheck), allowed only on the same GPU and versions and
when none of KERNEL_SOURCES (eagle_kernels/, csrc/, the build files) changed between the commit
that evidence ran and this run's, or when this run's kernel check (stage 2 runs one when it
is a lease's first stage) recorded every GPU kernel's source digest and revision as the
proof's did: the rule by which the registry lets an entry count at another commit (else the
proof would not be of these kernels). Without stage-1 evidence no verdict is written, so a
benchmark-only run never demotes a proven kernel.

Nothing here is typed by hand: the verdict comes from bench/verdict.py over every stage's
evidence, RESULTS.md from bench/make_results.py.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
import make_results  # noqa: E402
import verdict  # noqa: E402


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()


# What a stage-1 proof is of: the kernels' sources and how they are built.
KERNEL_SOURCES = ("eagle_kernels", "csrc", "setup.py", "CMakeLists.txt", "pyproject.toml")
TARBALLS = ("stage*.tar.gz", "profile*.tar.gz")  # never build.tar.gz (stage 1's build)
STAGE_PREFIXES = ("stage", "profile")  # the folders those tarballs unpack to


def _environment(stage: Path) -> list[str]:
    path = stage / "environment.txt"
    return path.read_text().splitlines() if path.is_file() else []


def _commit(stage: Path) -> str | None:
    """The commit a stage ran: the one the caller sent (the device's .git can be stale)."""
    lines = [line for line in _environment(stage) if line.startswith("commit ")]
    sent = [line for line in lines if "(sent by the caller)" in line]
    return (sent or lines)[0].split()[1] if lines else None


def _versions(stage: Path) -> str:
    """The stage's 'python .. torch .. cuda .. triton ..' line (a new triton recompiles all)."""
    return next((line for line in _environment(stage) if line.startswith("python ")), "")


def _kernel_changes(since: str, until: str) -> list[str]:
    try:
        done = subprocess.run(["git", "diff", "--name-only", since, until, "--",
                               *KERNEL_SOURCES], cwd=ROOT.parent, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise ValueError("--proof-from: git is needed to compare the kernel sources") from error
    if done.returncode != 0:
        raise ValueError(f"--proof-from: git diff {since} {until}: {done.stderr.strip()}")
    return done.stdout.split()


def _gpu_kernel_digests(stage: Path) -> dict | None:
    """(op, backend, dtype) -> (source digest, revision) of the GPU rows of ``stage``'s kernel
    check (what the device computed from the sources it ran and the ``_C`` it built), or None
    without a check or where a GPU row's digest is unknown."""
    path = stage / "kernel-check.json"
    if not path.is_file():
        return None
    rows = [row for row in json.loads(path.read_text()).get("rows", [])
            if row.get("backend") in verdict.GPU_BACKENDS]
    digests = {(row["op"], row["backend"], row.get("dtype")):
               (row.get("source_digest"), row.get("revision", 1)) for row in rows}
    if not digests or any(digest in (None, "unknown") for digest, _ in digests.values()):
        return None
    return digests


def _same_kernels(proof: Path, new_stages: list[Path]) -> bool:
    """Whether a kernel check of the new run ran exactly the kernels ``proof`` proved: every
    GPU row's source digest and revision equal, as recorded on the device (the rule by which
    the backend registry lets a verdict entry count at another commit:
    ``_backend.verdict_allows``). A change elsewhere in eagle_kernels/ (the dispatch, the
    runtime) then leaves the proof standing."""
    proved = _gpu_kernel_digests(proof)
    checks = [digests for digests in map(_gpu_kernel_digests, new_stages) if digests is not None]
    return proved is not None and bool(checks) and all(d == proved for d in checks)


def proof_stages(run: Path, new_stages: list[Path]) -> list[Path]:
    """RUN_DIR's stage-1 folders, if they proved these kernels: the same GPU, the same python /
    torch / cuda / triton, and no kernel source changed between their commit and the new run's
    (its recorded commit, else HEAD), or, where files of KERNEL_SOURCES did change, a kernel
    check of the new run recorded the digests and revisions the proof did (_same_kernels)."""
    proof = sorted(p.resolve() for p in Path(run).glob("stage1*")
                   if (p / "gpu-tests.xml").is_file())
    if not proof:
        raise ValueError(f"--proof-from: {run} holds no stage-1 evidence (gpu-tests.xml)")
    if verdict._gpu_name(proof) != verdict._gpu_name(new_stages):
        raise ValueError(f"--proof-from: {run} ran on {verdict._gpu_name(proof)}, this run on "
                         f"{verdict._gpu_name(new_stages)}")
    until = next((c for c in map(_commit, new_stages) if c), "HEAD")
    for stage in proof:
        commit = _commit(stage)
        if commit is None:
            raise ValueError(f"--proof-from: {stage} records no commit")
        changed = _kernel_changes(commit, until)
        if changed and not _same_kernels(stage, new_stages):
            raise ValueError(f"--proof-from: kernel sources changed since {commit} "
                             f"({stage.name}): {changed}, and no kernel check of this run "
                             "recorded the source digests that stage proved")
        for new in new_stages:
            if _versions(new) and _versions(new) != _versions(stage):
                raise ValueError(f"--proof-from: {stage.name} ran {_versions(stage)!r}, "
                                 f"{new.name} {_versions(new)!r}")
    return proof


def _run_stages(run: Path) -> list[Path]:
    """The stage folders a run folder holds (stage order: stage1 before stage1b), what its
    verdict reads; never the hand-made notes beside them."""
    return sorted(p for p in run.iterdir() if p.is_dir() and p.name.startswith(STAGE_PREFIXES)) \
        if run.is_dir() else []


def _next_name(name: str) -> str:
    """The run folder after ``name`` as results/ names them: 2026-11-26_gpu -> 2026-11-26b_gpu,
    2026-11-26b_gpu -> 2026-11-26c_gpu."""
    dated = re.match(r"^(\d{4}-\d\d-\d\d)([a-y]?)_(.+)$", name)
    if not dated:
        return f"{name}-b"
    date, letter, rest = dated.groups()
    return f"{date}{chr(ord(letter) + 1) if letter else 'b'}_{rest}"


def _check_new(run: Path, stages: list[Path], proof: list[Path]) -> None:
    """Refuse what would leave data and verdict apart: a stage folder replaced (the verdict
    and RESULTS.md of the first collect would describe data no longer there), or stages added
    to a run whose verdict came from another run's stage 1 without that proof."""
    taken = [stage.name for stage in stages if (run / stage.name).exists()]
    if taken:
        raise ValueError(
            f"{run} already holds {', '.join(taken)}: collect into another run folder with "
            f"--run {_next_name(run.name)} (any NAME under {run.parent}), or name the stages "
            "apart on the GPU (EAGLE_STAGE_TAG=b -> stage1b, ...)")
    before = _run_stages(run)
    if before and verdict._gpu_name(before) != verdict._gpu_name(stages):
        raise ValueError(f"{run} holds stages of {verdict._gpu_name(before)}, these ran on "
                         f"{verdict._gpu_name(stages)}: collect them with --run NAME")
    evidence = [*proof, *before, *stages]
    if (run / "verdict.json").is_file() and not any(
            (stage / "gpu-tests.xml").is_file() for stage in evidence):
        raise ValueError(f"{run}'s verdict read stage-1 evidence from another run: give that "
                         "run again with --proof-from, or collect with --run NAME")


def collect(folders: list[Path], results: Path = make_results.RESULTS,
            proof_from: Path | None = None, name: str | None = None) -> Path:
    staging = results / "local" / "collect"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    seen: dict[str, Path] = {}
    for folder in folders:
        for tarball in (t for pattern in TARBALLS for t in folder.glob(pattern)):
            with tarfile.open(tarball) as tar:
                names = {member.name.split("/")[0] for member in tar.getmembers()}
                twice = sorted(name for name in names if name in seen)
                if twice:  # refused: one would overwrite the other's files unseen
                    shutil.rmtree(staging, ignore_errors=True)
                    raise ValueError(f"{tarball} holds {', '.join(twice)}, as "
                                     f"{seen[twice[0]]} does: a second run of a stage is named "
                                     "apart on the GPU (EAGLE_STAGE_TAG=b -> stage3b, ...)")
                seen.update((name, tarball) for name in names)
                tar.extractall(staging, filter="data")
    stages = sorted(p for p in staging.iterdir() if p.is_dir())
    if not stages:  # refused: nothing written (else a bogus "<date>_no-gpu-dry-run" run)
        shutil.rmtree(staging, ignore_errors=True)
        raise ValueError(f"no stage in {', '.join(map(str, folders))}: each FOLDER is a stage's "
                         f"files_at holding {' or '.join(TARBALLS)}")
    gpu = verdict._gpu_name(stages)
    run = results / (name or f"{datetime.date.today().isoformat()}_{_slug(gpu)}")
    try:  # refused: nothing written
        proof = proof_stages(proof_from, stages) if proof_from else []
        _check_new(run, stages, proof)
    except ValueError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    run.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        shutil.copytree(stage, run / stage.name)
    evidence = [*proof, *_run_stages(run)]  # the stages collected before these too
    if any((stage / "gpu-tests.xml").is_file() for stage in evidence):
        report = verdict.build(evidence, gpu)
        (run / "verdict.json").write_text(json.dumps(report, indent=1) + "\n")
        (run / "verdict.txt").write_text(verdict.table(report) + "\n")
    else:
        print("no stage-1 evidence: no verdict written (the last verdict of this GPU stands)")
    shutil.rmtree(staging, ignore_errors=True)
    return run


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The stage folders and options; a mistyped option, a folder or RUN_DIR that is not a
    directory, or folders without a stage tarball are refused (usage + one line, exit 2)
    before anything is written."""
    parser = argparse.ArgumentParser(prog="collect_results.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    parser.add_argument("--proof-from", type=Path, metavar="RUN_DIR")
    parser.add_argument("--run", metavar="NAME")
    args = parser.parse_args(argv)
    if args.run is not None and (args.run in ("", ".", "..", "local") or "/" in args.run
                                 or "\\" in args.run):  # local: the ignored scratch folder
        parser.error(f"--run {args.run!r}: NAME is one folder name under {make_results.RESULTS}"
                     " other than local")
    checked = [("--proof-from", args.proof_from)] if args.proof_from else []
    for label, path in checked + [("FOLDER", folder) for folder in args.folders]:
        if not path.is_dir():
            parser.error(f"{label} {str(path)!r} "
                         f"{'is not a directory' if path.exists() else 'does not exist'}")
    for folder in args.folders:  # a mistyped folder beside good ones must not pass unseen
        if not any(next(folder.glob(pattern), None) for pattern in TARBALLS):
            parser.error(f"no stage tarball ({', '.join(TARBALLS)}) in {str(folder)!r}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)  # exits 2 on a bad command line, 0 after --help
    try:
        run = collect(args.folders, make_results.RESULTS, proof_from=args.proof_from,
                      name=args.run)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"wrote {run}")
    return make_results.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
