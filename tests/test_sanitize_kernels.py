"""bench/sanitize_kernels.py: the one-pass kernel check that compute-sanitizer runs on a GPU.

Here (no GPU) the Triton kernels run in the interpreter (conftest sets TRITON_INTERPRET=1), so
this proves the script's example inputs are valid for every op and that it reports every
(op, backend) pair; a deliberately broken kernel must make it fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import _backend

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "sanitize_kernels.py"


@pytest.fixture(scope="module")
def sanitize():
    spec = importlib.util.spec_from_file_location("sanitize_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _needs_triton():
    if not _backend.backend_status("triton").available:
        pytest.skip(_backend.backend_status("triton").reason)


@pytest.fixture(scope="module")
def results(sanitize):
    """(op, backend, status, detail) of one pass on this machine's default device."""
    return sanitize.check_all(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def test_every_triton_kernel_matches_the_reference(results):
    _needs_triton()
    triton_ops = sorted(op for op, backends in ops.op_backends().items() if "triton" in backends)
    assert triton_ops
    assert {(op, status) for op, backend, status, _ in results if backend == "triton"} == \
        {(op, "ok") for op in triton_ops}, results


def test_one_report_per_registered_kernel(results):
    """Every GPU kernel (cuda, triton) gets one report; the cpu backend has no GPU code."""
    pairs = [(op, b) for op, backends in ops.op_backends().items() for b in backends
             if b in ("cuda", "triton")]
    assert [(op, backend) for op, backend, _, _ in results] == pairs
    assert all(status in ("ok", "skipped") for _, _, status, _ in results), results


def test_cuda_backend_is_skipped_with_its_reason_without_a_gpu(results):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the cuda backend runs")
    cuda = [r for r in results if r[1] == "cuda"]
    assert cuda and all(status == "skipped" and detail for _, _, status, detail in cuda), cuda


def test_a_wrong_kernel_is_reported_and_fails_the_run(sanitize, monkeypatch, capsys):
    """main prints one line per pair and exits 1 when a kernel disagrees with the reference."""
    _needs_triton()

    def wrong_build_tree(parents, max_depth):
        depth, mask, paths = _backend._REGISTRY["build_tree"]["torch"].fn(parents, max_depth)
        return depth + 1, mask, paths

    implementations = dict(_backend._REGISTRY["build_tree"])
    implementations["triton"] = _backend._Implementation(wrong_build_tree, False)
    monkeypatch.setitem(_backend._REGISTRY, "build_tree", implementations)
    assert sanitize.main(["--device", "cuda" if torch.cuda.is_available() else "cpu"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert ["build_tree", "triton", "MISMATCH:"] in [line.split()[:3] for line in lines], out
    assert lines[-1].endswith("1 failed"), out
