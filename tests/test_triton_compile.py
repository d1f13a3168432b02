"""Every Triton kernel compiles for sm_90 (H100 / H200) on this GPU-less machine, over the
specializations the runtime launches, within the H100's shared memory, with the venv's triton
and with triton 3.6.0 (what the lent GPU machine has).

The interpreter that CI runs the kernels in is lenient (non-constexpr globals, loop-carried
type changes, ...): compiling each kernel for real, in a subprocess without TRITON_INTERPRET,
catches what would only fail on a GPU.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

KERNELS = 29  # every @triton.jit kernel launched by eagle_kernels.ops
GPU_TRITON = "3.6.0"  # the lent GPU machine's triton (bench/README.md)
ROOT = Path(__file__).resolve().parents[1]
TRITON36 = ROOT / "build" / f"triton-{GPU_TRITON}"  # pip --target dir, reused between runs
SCRIPT = Path(__file__).with_name("triton_sm90_compile.py")


def _compile(extra_path: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if extra_path is not None:  # triton from here, torch and the rest from the venv
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(extra_path), str(ROOT), env.get("PYTHONPATH")) if p)
        env["TRITON_CACHE_DIR"] = str(TRITON36 / "cache")
    result = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    kernels = set(re.findall(r"^(\w+) \[[\w]+\]: compiled for sm_90", result.stdout, re.M))
    assert len(kernels) == KERNELS, result.stdout
    return result.stdout


def test_triton_kernels_compile_for_sm90():
    _compile()


def _install_gpu_triton() -> None:
    """pip install --target the GPU machine's triton once; skip when it cannot be had."""
    marker = TRITON36 / f"triton-{GPU_TRITON}.dist-info"
    if marker.is_dir():
        return
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                             "--target", str(TRITON36), f"triton=={GPU_TRITON}"],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0 or not marker.is_dir():
        pytest.skip(f"triton {GPU_TRITON} wheel not available here (no network?): "
                    + (result.stderr.strip().splitlines() or ["pip failed"])[-1])


def test_triton_kernels_compile_for_sm90_with_the_gpu_machines_triton():
    _install_gpu_triton()
    out = _compile(TRITON36)
    assert f"triton {GPU_TRITON}: every specialization compiled" in out, out
