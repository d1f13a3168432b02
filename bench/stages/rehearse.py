"""CPU rehearsal of every GPU stage (``bash bench/gpu_suite.sh rehearse``; CI runs it in
tests/test_gpu_suite.py): each stage script runs as a dry run (EAGLE_STAGE_DRY_RUN=1: tiny
sizes, Triton interpreter, no build, sanitizer or nvidia-smi), and what it leaves in its $OUT
and what its run would send are checked against bench/device_limits.py.

    python3 bench/stages/rehearse.py [--keep DIR] [STAGE ...]

This file is the one home of the stages' carried paths (bench/README.md quotes them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import device_limits as limits  # noqa: E402

BUILD_CARRY = ".carry/build"  # stage 1's $OUT/build.tar.gz, copied here


class Stage(NamedTuple):
    name: str
    carry: tuple[str, ...]
    optional: bool = False


STAGES = (
    Stage("stage1", ()),
    Stage("stage2", (BUILD_CARRY,)),
    Stage("stage3", (BUILD_CARRY,)),
    Stage("profile", (BUILD_CARRY,)),
    Stage("stage4", (".carry/model/part-NN", ".carry/model/SHA256SUMS", ".carry/wheels",
                     ".carry/prompts", BUILD_CARRY), optional=True),
    Stage("stage5", (".carry/model/part-NN", ".carry/model/SHA256SUMS", ".carry/wheels",
                     ".carry/train", BUILD_CARRY), optional=True),
)


def run_stage(stage: Stage, out: Path, after_stage1: bool) -> tuple[float, str]:
    """Run one stage as a dry run into ``out``: (seconds, its output). ``after_stage1``: stage 1
    ran earlier in this rehearsal, so the stage runs as a lease runs it after stage 1 (stage 2
    reuses stage 1's kernel check: the same script, rehearsed once)."""
    env = dict(os.environ, OUT=str(out), EAGLE_STAGE_DRY_RUN="1", TRITON_INTERPRET="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if after_stage1:
        env["EAGLE_LEASE_BUILT"] = "1"
    start = time.monotonic()
    result = subprocess.run(["bash", str(ROOT / "bench" / "gpu_suite.sh"), stage.name],
                            cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=limits.STAGE_BUDGET_S + 60)
    return time.monotonic() - start, result.stdout + result.stderr


def failed_steps(out: Path, stage: Stage) -> list[str]:
    """Steps of the stage's tarball whose status is not ok (all must pass in a dry run)."""
    tarball = out / f"{stage.name}.tar.gz"
    if not tarball.is_file():
        return [f"no {tarball.name} in $OUT"]
    with tarfile.open(tarball) as tar:
        steps = tar.extractfile(f"{stage.name}/steps.tsv").read().decode().splitlines()[1:]
    return [line for line in steps if line.split("\t")[1] != "ok"]


def send_problems(stage: Stage, build_bytes: int) -> list[str]:
    """The run's send size: the working tree, carried paths that exist here, and the build
    tarball the rehearsal of stage 1 returned (not copied to .carry here)."""
    present = [p for p in stage.carry if (ROOT / p).exists()]
    extra = build_bytes if BUILD_CARRY in stage.carry and BUILD_CARRY not in present else 0
    problems = limits.check_send(list(stage.carry), extra)  # counts only paths that exist
    if any("part-NN" in path for path in stage.carry):
        from carry_model import largest_part_bytes
        try:
            largest_part_bytes(None)
        except ValueError as error:
            problems.append(f"model parts: {error}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("stages", nargs="*", help="default: all")
    parser.add_argument("--keep", type=Path, help="leave each stage's $OUT under this folder")
    args = parser.parse_args(argv)
    chosen = [s for s in STAGES if not args.stages or s.name in args.stages]
    base = args.keep or Path(tempfile.mkdtemp(prefix="rehearse-"))
    build_bytes, failures = 0, 0
    print(f"working tree sends {limits.working_tree_bytes() / limits.MIB:.1f} MiB")
    for stage in chosen:
        out = base / stage.name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        seconds, output = run_stage(stage, out, after_stage1=stage is not chosen[0]
                                    and chosen[0].name == "stage1")
        if (out / "build.tar.gz").is_file():
            build_bytes = (out / "build.tar.gz").stat().st_size
        problems = (failed_steps(out, stage) + limits.check_out(out)
                    + send_problems(stage, build_bytes))
        if seconds > limits.STAGE_BUDGET_S:
            problems.append(f"took {seconds:.0f} s > {limits.STAGE_BUDGET_S} s")
        back = sorted(p.name for p in out.rglob("*") if p.is_file())
        print(f"{stage.name}: {seconds:.0f} s, back: {', '.join(back)}; "
              + ("ok" if not problems else "PROBLEMS: " + "; ".join(problems)), flush=True)
        if problems:
            failures += 1
            print(output[-3000:])
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
