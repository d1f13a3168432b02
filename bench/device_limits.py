"""The lent GPU machine's limits, in one place, and the checks every GPU stage must pass.

The device tool (a lent H100 / H200, see bench/README.md) sends the working tree (tracked and
untracked-not-ignored files) plus the carried ignored paths, runs one command of at most
``RUN_LIMIT_S`` and brings back at most ``MAX_FILES_BACK`` files from ``$OUT``. A stage that
breaks one of these limits brings no evidence back, so the CPU rehearsal
(``bash bench/gpu_suite.sh rehearse``) checks them for every stage.

    python3 bench/device_limits.py get STAGE_BUDGET_S        # a constant, for shell scripts
    python3 bench/device_limits.py check-out DIR             # what $OUT would bring back
    python3 bench/device_limits.py send-size [CARRIED ...]   # bytes a run would send
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
RUN_LIMIT_S = 600            # one command's run on the device machine
SESSION_DEVICE_S = 1800      # device time of a session, machine starts included
STAGE_BUDGET_S = 480         # a stage's own budget: a cold start (1-2 min) still fits the run
PACK_RESERVE_S = 30          # kept back from the last step so the results are always packed
MAX_SEND_BYTES = 64 * MIB    # working tree + carried paths, per run
MAX_CARRY_PATHS = 8
MAX_FILES_BACK = 8
MAX_FILE_BYTES = 16 * MIB
RETURN_PART_MIB = 15         # parts of a file brought back (a trained head, stage 5)
MAX_BACK_BYTES = 64 * MIB
MAX_DEPTH = 2                # $OUT/a/b/file comes back, $OUT/a/b/c/file does not
NAME_PATTERN = re.compile(r"^[A-Za-z0-9._-]+$")
WARM_AFTER_RUN_S = 30        # a machine stays warm this long after a run, then goes back

ROOT = Path(__file__).resolve().parents[1]


def check_out(out_dir: str | os.PathLike) -> list[str]:
    """Every way the files under ``out_dir`` break the limits on what comes back ([] if none)."""
    out = Path(out_dir)
    problems, files, total = [], 0, 0
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out)
        bad_names = [part for part in relative.parts if not NAME_PATTERN.match(part)]
        if bad_names:
            problems.append(f"{relative}: name outside [A-Za-z0-9._-]")
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            problems.append(f"{relative}: not a plain file or folder")
            continue
        if path.is_dir():
            continue
        files += 1
        size = path.stat().st_size
        total += size
        if len(relative.parts) - 1 > MAX_DEPTH:
            problems.append(f"{relative}: more than {MAX_DEPTH} folders down")
        if size > MAX_FILE_BYTES:
            problems.append(f"{relative}: {size / MIB:.1f} MiB > {MAX_FILE_BYTES // MIB} MiB")
    if files > MAX_FILES_BACK:
        problems.append(f"{files} files > {MAX_FILES_BACK}")
    if total > MAX_BACK_BYTES:
        problems.append(f"{total / MIB:.1f} MiB back in all > {MAX_BACK_BYTES // MIB} MiB")
    return problems


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def working_tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the tracked and untracked-not-ignored files: what every run sends."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=root, capture_output=True, check=True)
    names = {name for name in listed.stdout.decode().split("\0") if name}
    return sum((root / name).stat().st_size for name in names if (root / name).is_file())


def send_bytes(carried: list[str], root: Path = ROOT) -> int:
    """Bytes one run sends: the working tree plus the carried paths that exist here."""
    return working_tree_bytes(root) + sum(_size(root / path) for path in carried
                                          if (root / path).exists())


def check_send(carried: list[str], extra_bytes: int = 0, root: Path = ROOT) -> list[str]:
    """Problems with sending the tree plus ``carried`` (plus ``extra_bytes`` of carried files
    that a rehearsal only knows the size of)."""
    problems = []
    if len(carried) > MAX_CARRY_PATHS:
        problems.append(f"{len(carried)} carried paths > {MAX_CARRY_PATHS}")
    total = send_bytes(carried, root) + extra_bytes
    if total > MAX_SEND_BYTES:
        problems.append(f"sends {total / MIB:.1f} MiB > {MAX_SEND_BYTES // MIB} MiB "
                        f"(working tree {working_tree_bytes(root) / MIB:.1f} MiB)")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "get":
        print(globals()[argv[1]])
        return 0
    if len(argv) == 2 and argv[0] == "check-out":
        problems = check_out(argv[1])
        print("\n".join(problems) or f"{argv[1]}: within the limits on files back")
        return 1 if problems else 0
    if argv and argv[0] == "send-size":
        problems = check_send(argv[1:])
        print(f"sends {send_bytes(argv[1:]) / MIB:.1f} MiB" + "".join(f"\n{p}" for p in problems))
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
