"""The C++ CPU kernels (csrc/cpu/) under AddressSanitizer: no read or write outside any buffer.

The Triton kernels are bounds-checked in the interpreter (tests/interpreter_bounds.py); the CPU
kernels are native code, so this test compiles csrc/cpu/ once more with ``-fsanitize=address``
into a copy of the package in a temporary directory and runs the CPU-kernel test files there,
in a subprocess with libasan preloaded (torch allocates every tensor through malloc, so each
one gets redzones, and an access past a tensor aborts with ASan's report). A control first
proves the subprocess loads that build and that ASan stops a one-row overread in it. About 150 s
on 2 cores: 60 s to compile, 90 s of tests. The subprocess replays this run's seed.

Skipped where g++ or its libasan is missing (the cpu backend itself needs the compiler).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import BASE_SEED

ROOT = Path(__file__).resolve().parent.parent
KERNEL_TESTS = ("test_decoder.py", "test_decoder_layer.py", "test_weight_packs.py",
                "test_linear_int8.py", "test_attention_cpu.py", "test_loss.py",
                "test_row_invariance.py", "test_model.py", "test_kv.py", "test_record_tokens.py")
# Their Triton cases run in the interpreter (numpy, no C++ of ours; bounds-checked by
# tests/interpreter_bounds.py) and took ~180 s of this test under ASan: deselected.
NOT_TRITON = ["-k", "not triton"]
# Files whose cpu routes are fixture parameters beside the Triton / CUDA-host ones: only
# their tests with "cpu" in the id run under ASan.
CPU_ROUTE_TESTS = ("test_topk_kernels.py", "test_tree_kernels.py", "test_acceptance_kernels.py")
# Same as setup.py's CPU_FLAGS but -O1 -g (ASan's advice: readable reports, still fast).
FLAGS = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-std=c++17", "-fopenmp",
         "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]


POSITIVE_CONTROL = """
import torch
import eagle_kernels._cpu as cpu
print(cpu.__file__, flush=True)
gate, up, y = torch.ones(1, 64), torch.ones(1, 64), torch.zeros(2, 64)
cpu.silu_mul(gate.data_ptr(), up.data_ptr(), y.data_ptr(), 2, 64, 64, 64, 1)
"""


def _runtime_library(compiler: str, name: str) -> str | None:
    found = subprocess.run([compiler, f"-print-file-name={name}"], capture_output=True,
                           text=True).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def _sanitized_package(compiler: str, where: Path) -> None:
    """eagle_kernels' Python files (heads linked, not copied) and an ASan build of _cpu."""
    package = where / "eagle_kernels"
    shutil.copytree(ROOT / "eagle_kernels", package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "heads"))
    os.symlink(ROOT / "eagle_kernels" / "heads", package / "heads")
    pybind11 = pytest.importorskip("pybind11")
    sources = sorted(str(p) for p in (ROOT / "csrc" / "cpu").glob("*.cpp"))
    output = package / ("_cpu" + sysconfig.get_config_var("EXT_SUFFIX"))
    command = [compiler, *FLAGS, f"-I{pybind11.get_include()}",
               f"-I{sysconfig.get_paths()['include']}", f"-I{ROOT / 'csrc' / 'cpu'}", *sources,
               "-o", str(output)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, f"ASan build failed:\n{built.stderr[-3000:]}"


def test_cpu_kernel_tests_pass_under_address_sanitizer(tmp_path):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    libraries = [_runtime_library(compiler, name) for name in ("libasan.so", "libstdc++.so.6")]
    if None in libraries:
        pytest.skip("g++ has no libasan")
    _sanitized_package(compiler, tmp_path)
    env = dict(os.environ, LD_PRELOAD=" ".join(libraries), PYTHONDONTWRITEBYTECODE="1",
               EAGLE_TEST_SEED=str(BASE_SEED), CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1",
               # torch's own allocation pairs trip these two checks; leaks are not our subject
               ASAN_OPTIONS="detect_leaks=0:alloc_dealloc_mismatch=0:"
                            "new_delete_type_mismatch=0:halt_on_error=1")
    # control: this process loads the ASan build, and ASan stops a kernel reading one row past
    # a tensor (silu_mul over 2 rows of 1-row tensors); else a pass below would prove nothing
    control = subprocess.run([sys.executable, "-c", POSITIVE_CONTROL], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    assert control.stdout.strip().startswith(str(tmp_path)), \
        f"the subprocess did not load the ASan build: {control.stdout}{control.stderr[-2000:]}"
    assert control.returncode != 0 and "AddressSanitizer" in control.stderr, \
        f"ASan missed a one-row overread: {control.stdout}{control.stderr[-2000:]}"
    for names, selection in ((KERNEL_TESTS, NOT_TRITON), (CPU_ROUTE_TESTS, ["-k", "cpu"])):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p",
                              "no:cacheprovider", *selection,
                              *(str(ROOT / "tests" / name) for name in names)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
        start = run.stderr.find("ERROR: AddressSanitizer")
        report = run.stderr[start:start + 6000] if start >= 0 else run.stderr[-6000:]
        assert run.returncode == 0, f"under ASan:\n{run.stdout[-3000:]}\n{report}"
