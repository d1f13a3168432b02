"""Run a benchmark script's ``--smoke`` mode (tiny shapes, CPU: torch and the Triton
interpreter) and read back what it wrote: one helper for the benchmarks' smoke tests; and
import a benchmark script as a module (:func:`load_script`)."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"


def load_script(path: str, name: str):
    """The script at ``path`` (relative to the repository) imported as module ``name`` (also
    put in sys.modules, so the script's dataclasses and pickling find it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def smoke_rows(script: str, tmp_path: Path, table: str) -> list[dict]:
    """Run ``bench/<script> --smoke --out tmp_path``; the rows of its CSV ``table`` (whose PNG,
    same name, must be there and not empty)."""
    result = subprocess.run([sys.executable, str(BENCH / script), "--smoke", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / table).with_suffix(".png").stat().st_size > 0
    with (tmp_path / table).open() as file:
        return list(csv.DictReader(file))
