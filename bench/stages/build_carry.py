"""The build a stage hands to later stages: eagle_kernels' compiled extensions plus the Triton
cache, in one tarball stamped with the hash of the sources they came from.

    python3 bench/stages/build_carry.py pack OUT_DIR   # -> OUT_DIR/build.tar.gz (<= 16 MiB)
    python3 bench/stages/build_carry.py restore        # .carry/build/build.tar.gz, if it matches

Later stages carry it as ``.carry/build`` (bench/README.md); ``restore`` refuses a tarball
built from other sources (exit 1, and the stage builds afresh), so a stale build never runs.
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from device_limits import MAX_FILE_BYTES  # noqa: E402

CARRIED = ROOT / ".carry" / "build" / "build.tar.gz"
TRITON_CACHE = ROOT / "build" / "triton-cache"
STAMP = "build-stamp.txt"
SOURCES = ("csrc", "setup.py", "CMakeLists.txt", "pyproject.toml")


def source_stamp() -> str:
    """SHA-256 over the files the extensions are built from."""
    digest = hashlib.sha256()
    for entry in SOURCES:
        path = ROOT / entry
        for file in sorted(path.rglob("*") if path.is_dir() else [path]):
            if file.is_file():
                digest.update(str(file.relative_to(ROOT)).encode())
                digest.update(file.read_bytes())
    return digest.hexdigest()


def _tarball(with_triton_cache: bool) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        stamp = source_stamp().encode()
        info = tarfile.TarInfo(STAMP)
        info.size = len(stamp)
        tar.addfile(info, io.BytesIO(stamp))
        for library in sorted((ROOT / "eagle_kernels").glob("_*.so")):
            tar.add(library, arcname=str(library.relative_to(ROOT)))
        if with_triton_cache and TRITON_CACHE.is_dir():
            tar.add(TRITON_CACHE, arcname=str(TRITON_CACHE.relative_to(ROOT)))
    return buffer.getvalue()


def pack(out_dir: str) -> int:
    data = _tarball(with_triton_cache=True)
    if len(data) > MAX_FILE_BYTES:
        print(f"with the Triton cache {len(data) >> 20} MiB > {MAX_FILE_BYTES >> 20} MiB: "
              "extensions only (later stages compile their Triton kernels again)")
        data = _tarball(with_triton_cache=False)
    if len(data) > MAX_FILE_BYTES:
        print(f"extensions alone are {len(data) >> 20} MiB: not packed (later stages build)")
        return 1
    target = Path(out_dir) / "build.tar.gz"
    target.write_bytes(data)
    print(f"{target}: {len(data) / (1 << 20):.1f} MiB, stamp {source_stamp()[:12]}")
    return 0


def restore() -> int:
    if not CARRIED.is_file():
        print(f"{CARRIED} not carried")
        return 1
    with tarfile.open(CARRIED) as tar:
        stamp = tar.extractfile(STAMP).read().decode()
        if stamp != source_stamp():
            print(f"carried build is from other sources ({stamp[:12]} != "
                  f"{source_stamp()[:12]}): building afresh")
            return 1
        tar.extractall(ROOT, members=[m for m in tar.getmembers() if m.name != STAMP],
                       filter="data")
    print(f"restored the build {stamp[:12]} from {CARRIED}")
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "pack" and len(sys.argv) == 3:
        sys.exit(pack(sys.argv[2]))
    if command == "restore":
        sys.exit(restore())
    print(__doc__, file=sys.stderr)
    sys.exit(2)
