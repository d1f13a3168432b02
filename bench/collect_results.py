"""Turn what GPU stages brought back into a committed run: bench/results/<date>_<gpu>/ with
each stage's unpacked tarball, verdict.json (read by the backend registry) and RESULTS.md.

    python3 bench/collect_results.py FOLDER [FOLDER ...]   # each a stage's files_at ($OUT copy)
    python3 bench/collect_results.py --proof-from RUN_DIR FOLDER ...   # a run without stage 1

``--proof-from`` (a lease that skipped stage 1 on a GPU proven before): the verdict also reads
RUN_DIR's stage-1 evidence (GPU tests, memcheck), allowed only on the same GPU and versions and
when none of KERNEL_SOURCES (eagle_kernels/, csrc/, the build files) changed between the commit
that evidence ran and this run's (else the proof would not be of these kernels). Without stage-1 evidence no verdict is written, so a
benchmark-only run never demotes a proven kernel.

Nothing here is typed by hand: the verdict comes from bench/verdict.py over every stage's
evidence, RESULTS.md from bench/make_results.py.
"""

from __future__ import annotations

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


def proof_stages(run: Path, new_stages: list[Path]) -> list[Path]:
    """RUN_DIR's stage-1 folders, if they proved these kernels: the same GPU, the same python /
    torch / cuda / triton, and no kernel source changed between their commit and the new run's
    (its recorded commit, else HEAD)."""
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
        if changed:
            raise ValueError(f"--proof-from: kernel sources changed since {commit} "
                             f"({stage.name}): {changed}")
        for new in new_stages:
            if _versions(new) and _versions(new) != _versions(stage):
                raise ValueError(f"--proof-from: {stage.name} ran {_versions(stage)!r}, "
                                 f"{new.name} {_versions(new)!r}")
    return proof


def collect(folders: list[Path], results: Path = make_results.RESULTS,
            proof_from: Path | None = None) -> Path:
    staging = results / "local" / "collect"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for folder in folders:
        for tarball in (t for pattern in TARBALLS for t in folder.glob(pattern)):
            with tarfile.open(tarball) as tar:
                tar.extractall(staging, filter="data")
    stages = sorted(p for p in staging.iterdir() if p.is_dir())
    gpu = verdict._gpu_name(stages)
    proof = proof_stages(proof_from, stages) if proof_from else []  # refused: nothing written
    run = results / f"{datetime.date.today().isoformat()}_{_slug(gpu)}"
    run.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        shutil.rmtree(run / stage.name, ignore_errors=True)
        shutil.copytree(stage, run / stage.name)
    evidence = [*proof, *(run / s.name for s in stages)]
    if any((stage / "gpu-tests.xml").is_file() for stage in evidence):
        report = verdict.build(evidence, gpu)
        (run / "verdict.json").write_text(json.dumps(report, indent=1) + "\n")
        (run / "verdict.txt").write_text(verdict.table(report) + "\n")
    else:
        print("no stage-1 evidence: no verdict written (the last verdict of this GPU stands)")
    shutil.rmtree(staging, ignore_errors=True)
    return run


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    proof_from = None
    if argv[:1] == ["--proof-from"] and len(argv) > 2:
        proof_from, argv = Path(argv[1]), argv[2:]
    try:
        run = collect([Path(a) for a in argv], proof_from=proof_from)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"wrote {run}")
    return make_results.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
