"""bench/sanitize_kernels.py: the one-pass kernel check that compute-sanitizer runs on a GPU.

Here (no GPU) the Triton kernels run in the interpreter (conftest sets TRITON_INTERPRET=1), so
this proves the script's example inputs are valid for every op and that it reports every
(op, backend) pair; a deliberately broken kernel must make it fail.
"""

from __future__ import annotations

import importlib.util
import os
import time
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


FAKE_SANITIZER = """#!/bin/sh
# the real one's options, then the command: log when each op's process runs
op=$(echo "$*" | sed 's/.*--op //')
if [ "$op" = rms_norm ]; then  # hangs in a child, as the sanitizer's Python would
  ( sleep 3; echo "orphan $op $(date +%s.%N)" >> "$MEMCHECK_LOG" ) & wait; exit 0
fi
echo "start $op $(date +%s.%N)" >> "$MEMCHECK_LOG"
sleep 0.5
echo "end $op $(date +%s.%N)" >> "$MEMCHECK_LOG"
[ "$op" = linear ] && { echo "========= Invalid __global__ read"; exit 1; }
exit 0
"""


def test_memcheck_each_runs_every_op_alone_a_few_at_once(sanitize, tmp_path, monkeypatch, capsys):
    """--memcheck-each: one process per op (a fake compute-sanitizer here), never more than
    ``workers`` at once; a failing and a hanging op are each reported failed, the others clean."""
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MEMCHECK_LOG", str(tmp_path / "log"))
    chosen = ["build_tree", "linear", "compact_kv", "rms_norm", "eagle2_expand", "topk_log_softmax"]
    table = tmp_path / "memcheck.tsv"
    started = time.monotonic()
    assert sanitize.memcheck_each(str(table), 0, chosen, timeout_s=2, workers=2) == 1
    time.sleep(max(0.0, started + 5 - time.monotonic()))  # an orphaned child would log by now

    rows = [line.split("\t") for line in table.read_text().splitlines()]
    assert sorted(row[0] for row in rows) == sorted(chosen)
    assert {row[0]: row[1] for row in rows} == {
        op: "failed" if op in ("linear", "rms_norm") else "clean" for op in chosen}
    assert all(float(row[2]) >= 0 for row in rows)
    out = capsys.readouterr().out
    assert "Invalid __global__ read" in out and "timed out after 2 s" in out, out

    log = (tmp_path / "log").read_text()
    assert "orphan" not in log, log  # the timeout killed the hanging op's child too
    events = sorted((float(when), kind) for kind, _, when in
                    (line.split() for line in log.splitlines()))
    alive, most = 0, 0  # processes between their start and end lines
    for _, kind in events:
        alive += 1 if kind == "start" else -1
        most = max(most, alive)
    assert [kind for _, kind in events].count("start") == len(chosen) - 1
    assert most == 2, events  # side by side, and no more than asked


def test_memcheck_each_killed_by_sigterm_leaves_no_sanitizer_running(tmp_path):
    """A plain `timeout` (SIGTERM) stops the runner: the sanitizers' sessions, which a signal
    to the runner's group does not reach, are killed with it."""
    import signal
    import subprocess
    import sys

    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "compute-sanitizer"
    fake.write_text('#!/bin/sh\n( sleep 3; echo orphan >> "$MEMCHECK_LOG" ) & wait\n')
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
               MEMCHECK_LOG=str(tmp_path / "log"))
    code = (f"import importlib.util, sys; spec = importlib.util.spec_from_file_location('s', "
            f"{str(SCRIPT)!r}); m = importlib.util.module_from_spec(spec); "
            f"spec.loader.exec_module(m); print('ready', flush=True); "
            f"m.memcheck_each({str(tmp_path / 't.tsv')!r}, 0, ['build_tree', 'linear'])")
    runner = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True)
    assert runner.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # both sanitizers started
    runner.send_signal(signal.SIGTERM)
    assert runner.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(3.5)  # an orphaned child would log by now
    assert not (tmp_path / "log").exists(), (tmp_path / "log").read_text()
