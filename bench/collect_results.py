"""Turn what GPU stages brought back into a committed run: bench/results/<date>_<gpu>/ with
each stage's unpacked tarball, verdict.json (read by the backend registry) and RESULTS.md.

    python3 bench/collect_results.py FOLDER [FOLDER ...]   # each a stage's files_at ($OUT copy)

Nothing here is typed by hand: the verdict comes from bench/verdict.py over every stage's
evidence, RESULTS.md from bench/make_results.py.
"""

from __future__ import annotations

import datetime
import json
import re
import shutil
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


def collect(folders: list[Path], results: Path = make_results.RESULTS) -> Path:
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
    report = verdict.build([run / s.name for s in stages], gpu)
    (run / "verdict.json").write_text(json.dumps(report, indent=1) + "\n")
    (run / "verdict.txt").write_text(verdict.table(report) + "\n")
    shutil.rmtree(staging, ignore_errors=True)
    return run


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    run = collect([Path(a) for a in argv])
    print(f"wrote {run}")
    return make_results.main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
