"""Turn what GPU stages brought back into a committed run: bench/results/<date>_<gpu>/ with
each stage's unpacked tarball, verdict.json (read by the backend registry) and RESULTS.md.

    python3 bench/collect_results.py FOLDER [FOLDER ...]   # each a stage's files_at ($OUT copy)
    python3 bench/collect_results.py --proof-from RUN_DIR FOLDER ...   # a run without stage 1

``--proof-from`` (a lease that skipped stage 1 on a GPU proven before): the verdict also reads
RUN_DIR's stage-1 evidence (GPU tests, memcheck), allowed only when no file under
eagle_kernels/ or csrc/ changed between the commit that evidence ran and this one (else the
proof would not be of these kernels). Without stage-1 evidence no verdict is written, so a
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


KERNEL_SOURCES = ("eagle_kernels", "csrc")


def _commits(stage: Path) -> list[str]:
    """The commit a stage ran (its environment.txt: 'commit <hash> ...')."""
    lines = (stage / "environment.txt").read_text().splitlines() \
        if (stage / "environment.txt").is_file() else []
    return [line.split()[1] for line in lines if line.startswith("commit ")]


def proof_stages(run: Path, head: str = "HEAD") -> list[Path]:
    """RUN_DIR's stage-1 folders, if the kernels they proved are the kernels at ``head``."""
    stages = sorted(p for p in run.glob("stage1*") if (p / "gpu-tests.xml").is_file())
    if not stages:
        raise ValueError(f"--proof-from: {run} holds no stage-1 evidence (gpu-tests.xml)")
    for stage in stages:
        for commit in _commits(stage):
            changed = subprocess.run(["git", "diff", "--name-only", commit, head, "--",
                                      *KERNEL_SOURCES], cwd=ROOT.parent, capture_output=True,
                                     text=True)
            if changed.returncode != 0 or changed.stdout.strip():
                raise ValueError(f"--proof-from: kernel sources changed since {commit} "
                                 f"({stage.name}): {changed.stdout.split() or changed.stderr}")
    return stages


def collect(folders: list[Path], results: Path = make_results.RESULTS,
            proof: list[Path] = ()) -> Path:
    staging = results / "local" / "collect"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for folder in folders:
        for tarball in folder.glob("stage*.tar.gz"):
            with tarfile.open(tarball) as tar:
                tar.extractall(staging, filter="data")
    stages = sorted(p for p in staging.iterdir() if p.is_dir())
    gpu = verdict._gpu_name(stages)
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
    proof = []
    if argv[:1] == ["--proof-from"]:
        proof, argv = proof_stages(Path(argv[1])), argv[2:]
    run = collect([Path(a) for a in argv], proof=proof)
    print(f"wrote {run}")
    return make_results.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
