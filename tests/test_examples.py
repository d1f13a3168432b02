"""The user-facing examples in python/ run end to end at smoke size (tiny random models, no
downloads, no default-model package), each in a fresh interpreter as a user would run it.

Each example checks its own results (greedy speculative output equal to plain greedy decoding)
and prints "ok" last.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {
    "ops_dropin": ["--smoke"],
    "generate": ["--smoke"],
    "train_head": ["--smoke"],
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_at_smoke_size(name, tmp_path):
    env = dict(os.environ)
    for name_ in ("TRITON_INTERPRET", "EAGLE_KERNELS_BACKEND"):  # as a user runs them
        env.pop(name_, None)
    env.setdefault("OMP_NUM_THREADS", "1")  # tiny matrices: threads only contend on CI cores
    env["EAGLE_KERNELS_CACHE"] = str(tmp_path / "cache")  # nothing of the user's is touched
    result = subprocess.run([sys.executable, str(ROOT / "python" / f"{name}.py"),
                             *EXAMPLES[name]], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert result.stdout.rstrip().endswith("ok"), output[-4000:]
