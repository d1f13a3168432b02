"""topk_log_softmax and eagle2_expand kernels against the reference.

Three CPU routes prove the kernels here: ``backend="triton"`` runs the Triton kernels under the
interpreter (conftest sets TRITON_INTERPRET=1 without a GPU), the ``*_host`` twins of
csrc/topk.cu run the CUDA kernels' own per-thread code on CPU pointers, and ``backend="cpu"``
runs csrc/cpu/topk.h in every instruction set the processor has. The ``gpu`` tests run
``backend="cuda"`` / ``"triton"`` against ``"torch"`` on the full grid when a GPU is present.

What "matches" means for topk_log_softmax (see the docstring of eagle_kernels/ops/topk.py):

* ids: exactly the reference's ids, which are the ids of a stable descending sort of the fp32
  logits (-0.0 == 0.0): the reference ranks by logit, not by the rounded log-prob, so even two
  different logits whose log-probs round to one value have one exact order
  (``test_topk_collapsed_tie_follows_the_logit``).
* values: error against an fp64 log-softmax at most twice the reference's own fp32 error (the
  flash-attention rule) plus atol 1e-6 and rtol 1e-6 (a few ulps of the log-prob). At V = 152k
  the reference's fp32 sum is off by ~5e-6 while the kernels' are ~2e-7, so a plain rtol/atol
  of 1e-6 against the reference would test torch.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import _backend, reference

from cpu_support import CPU_ISAS, using_cpu_isa
from cuda_support import DTYPE_CODES, SENTINEL, needs_gpu, seed_note

VALUE_ATOL = 1e-6
VALUE_RTOL = 1e-6  # a few fp32 ulps of the log-prob itself: (x - max) - log(sum) rounds twice


def host_topk(ext, logits, k, d2t=None):
    rows, vocab = logits.shape
    values = torch.full((rows, k), float(SENTINEL))
    ids = torch.full((rows, k), SENTINEL, dtype=torch.int64)
    ext.topk_log_softmax_host(logits.data_ptr(), DTYPE_CODES[logits.dtype],
                              0 if d2t is None else d2t.data_ptr(), values.data_ptr(),
                              ids.data_ptr(), rows, vocab, k)
    return values, ids


def host_expand(ext, frontier, children, top_k):
    batch, k, c = children.shape
    outputs = (torch.full((batch, k * c), float(SENTINEL)),
               torch.full((batch, top_k), SENTINEL, dtype=torch.int64),
               torch.full((batch, top_k), float(SENTINEL)))
    ext.eagle2_expand_host(frontier.data_ptr(), children.data_ptr(),
                           *(t.data_ptr() for t in outputs), batch, k, c, top_k)
    return outputs


@pytest.fixture(params=["triton", "cuda_host", *(f"cpu-{isa}" for isa in CPU_ISAS)])
def impl(request):
    """(name, topk_log_softmax, eagle2_expand) of one kernel route that runs on CPU: the
    Triton interpreter, the CUDA kernels' host twins, the cpu backend in each instruction set."""
    if request.param.startswith("cpu-"):
        with using_cpu_isa(request.param.removeprefix("cpu-")):
            yield (request.param, lambda *a: ops.topk_log_softmax(*a, backend="cpu"),
                   lambda *a: ops.eagle2_expand(*a, backend="cpu"))
        return
    if request.param == "triton":
        yield ("triton", lambda *a: ops.topk_log_softmax(*a, backend="triton"),
               lambda *a: ops.eagle2_expand(*a, backend="triton"))
        return
    ext = request.getfixturevalue("ext")
    yield ("cuda_host", lambda *a: host_topk(ext, *a), lambda *a: host_expand(ext, *a))


def assert_topk_matches(values, ids, logits, k, d2t=None, note=""):
    """The comparison rule of the module docstring."""
    logits = logits.cpu()
    values, ids = values.cpu(), ids.cpu()
    ref_values, ref_ids = reference.topk_log_softmax(logits, k)
    order = torch.sort(logits.float() + 0.0, dim=-1, descending=True, stable=True).indices[:, :k]
    raw_ids = ids if d2t is None else order  # with d2t, ids are checked through the mapping
    expected_ids = order if d2t is None else order + d2t.cpu()[order]
    assert torch.equal(ids, expected_ids), f"ids differ {note}\n{ids}\n{expected_ids}"
    assert torch.equal(raw_ids, ref_ids), f"ids differ from the reference {note}\n{ids}\n{ref_ids}"
    truth = torch.log_softmax(logits.double(), dim=-1)
    finite = torch.isfinite(ref_values)
    assert torch.equal(torch.isfinite(values), finite), f"-inf pattern differs {note}"
    ref_error = torch.where(finite, ref_values.double() - truth.gather(1, ref_ids), 0).abs()
    error = torch.where(finite, values.double() - truth.gather(1, raw_ids), 0).abs()
    magnitude = torch.where(finite, truth.gather(1, raw_ids), 0).abs()
    bound = 2 * ref_error.amax(1, keepdim=True) + VALUE_ATOL + VALUE_RTOL * magnitude
    assert bool((error <= bound).all()), \
        f"log-probs off by {float(error.max()):.3g} > {float(bound.max()):.3g} {note}"


def random_logits(rows, vocab, dtype, gen, style="normal"):
    if style == "ties":  # few distinct values: many exact ties, lowest index must win
        logits = torch.randint(-3, 3, (rows, vocab), generator=gen).float()
    else:
        logits = torch.randn(rows, vocab, generator=gen) * 3
    masked = torch.rand(rows, vocab, generator=gen) < 0.2
    logits[masked] = float("-inf")
    logits[:, 0] = torch.where(torch.rand(rows, generator=gen) < 0.5, 1.0, logits[:, 0])
    return logits.to(dtype)


def test_topk_golden_with_ties_and_d2t(impl):
    name, topk, _ = impl
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [-0.0, 0.0, float("-inf"), -0.0]])
    values, ids = topk(logits, 3, None)
    assert ids.tolist() == [[1, 2, 3], [0, 1, 3]], name  # -0.0 ties with 0.0: lowest id
    assert_topk_matches(values, ids, logits, 3, note=name)
    d2t = torch.tensor([0, 5, 5, 10])
    assert topk(logits, 3, d2t)[1].tolist() == [[6, 7, 13], [0, 6, 13]], name


def test_topk_rows_with_fewer_finite_logits_than_k(impl):
    name, topk, _ = impl
    logits = torch.full((2, 40), float("-inf"))
    logits[:, 7], logits[1, 3] = 1.0, 1.0
    values, ids = topk(logits, 5, None)
    assert ids.tolist() == [[7, 0, 1, 2, 3], [3, 7, 0, 1, 2]], name  # -inf ties: lowest ids
    assert_topk_matches(values, ids, logits, 5, note=name)


def test_topk_collapsed_tie_follows_the_logit(impl):
    """Two different logits whose fp32 log-probs round to one value: the documented case."""
    name, topk, _ = impl
    logits = torch.zeros(1, 111)
    logits[0, 40] = 1e-7  # log-prob rounds to the value of the 0.0 logits
    values, ids = topk(logits, 3, None)
    ref_values, ref_ids = reference.topk_log_softmax(logits, 3)
    assert ref_ids.tolist() == [[40, 0, 1]] and bool((ref_values == ref_values[0, 0]).all())
    assert ids.tolist() == [[40, 0, 1]], name
    assert_topk_matches(values, ids, logits, 3, note=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_topk_random_small_vocab(impl, gen, dtype, batch):
    name, topk, _ = impl
    for style in ("normal", "ties"):
        logits = random_logits(batch, 111, dtype, gen, style)
        k = int(torch.randint(1, 33, (1,), generator=gen))
        d2t = torch.randint(0, 1000, (111,), generator=gen)
        values, ids = topk(logits, k, None)
        assert_topk_matches(values, ids, logits, k, note=f"{name} {style} {seed_note(gen)}")
        values, ids = topk(logits[:3], k, d2t)  # d2t on a few rows (the interpreter is slow)
        assert_topk_matches(values, ids, logits[:3], k, d2t, f"{name} d2t {seed_note(gen)}")


def test_topk_many_tied_rows(impl, gen):
    """1000 rows (150 in the slow interpreter) of a 3-valued vocabulary: almost every pick is
    decided by the tie rule."""
    name, topk, _ = impl
    rows = 150 if name == "triton" else 1000
    logits = torch.randint(0, 3, (rows, 37), generator=gen).float()
    values, ids = topk(logits, 10, None)
    assert_topk_matches(values, ids, logits, 10, note=f"{name} {seed_note(gen)}")


@pytest.mark.parametrize("vocab", [32000, 128256, 151936])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_topk_large_vocab(impl, gen, vocab, batch):
    """The host twin takes the whole grid; the interpreter (~1 s per 32k row) one or two rows."""
    name, topk, _ = impl
    if name == "triton" and batch > 1:
        pytest.skip("interpreter: batch 1 only (the GPU tests run the full grid)")
    rows = min(2, 32000 // vocab + 1) if name == "triton" else batch
    dtype = (torch.bfloat16, torch.float16, torch.float32)[vocab % 3]
    logits = random_logits(rows, vocab, dtype, gen)
    logits[0, -5:] = 20.0  # winners at the very end of the row (last chunk), tied
    d2t = torch.randint(0, 50, (vocab,), generator=gen) if vocab == 32000 else None
    values, ids = topk(logits, 10, d2t)
    assert_topk_matches(values, ids, logits, 10, d2t, f"{name} V={vocab} {seed_note(gen)}")


def test_cpu_select_limit(gen):
    """k = _cpu.SELECT_MAX_K runs on the cpu kernels and matches; one more falls through to
    torch under auto and is refused by name when the cpu backend is asked for."""
    with using_cpu_isa("generic"):
        from eagle_kernels import _cpu

        most = _cpu.SELECT_MAX_K
        logits = random_logits(2, most + 300, torch.float32, gen, "ties")
        values, ids = ops.topk_log_softmax(logits, most, backend="cpu")
        assert_topk_matches(values, ids, logits, most, note=seed_note(gen))
        assert _backend.resolve("topk_log_softmax", "auto", logits.device,
                                k=most + 1)[0] == "torch"
        with pytest.raises(ValueError, match="SELECT_MAX_K"):
            ops.topk_log_softmax(logits, most + 1, backend="cpu")
        with pytest.raises(ValueError, match="SELECT_MAX_K"):
            ops.eagle2_expand(torch.zeros(1, 2), torch.zeros(1, 2, most), most + 1, backend="cpu")


def test_triton_topk_refuses_k_past_its_limit(gen):
    """k past TOPK_TRITON_MAX_K is refused by name when triton is asked for, and auto takes
    another backend; k at the limit runs and matches."""
    from eagle_kernels.ops import _backend, topk

    most = topk.TOPK_TRITON_MAX_K
    logits = random_logits(2, 3000, torch.float32, gen)
    values, ids = ops.topk_log_softmax(logits, most, backend="triton")
    assert_topk_matches(values, ids, logits, most, note=seed_note(gen))
    with pytest.raises(ValueError, match="TOPK_TRITON_MAX_K"):
        ops.topk_log_softmax(logits, most + 1, backend="triton")
    assert _backend.resolve("topk_log_softmax", "auto", logits.device, k=most + 1)[0] != "triton"


def test_cuda_topk_rejects_large_k(ext):
    with pytest.raises(ValueError, match="k must be in"):
        host_topk(ext, torch.randn(1, 100), 33)


# --------------------------------------------------------------------------------------------
# eagle2_expand
# --------------------------------------------------------------------------------------------


def assert_expand_matches(actual, frontier, children, top_k, note):
    expected = reference.eagle2_expand(frontier, children, top_k)
    for name, a, e in zip(("candidate_scores", "next_index", "next_scores"), actual, expected):
        assert a.dtype == e.dtype and torch.equal(a.cpu(), e), f"{name} differs {note}\n{a}\n{e}"


def test_expand_golden(impl):
    name, _, expand = impl
    frontier = torch.tensor([[-1.0, -2.0], [0.0, 0.0]])
    children = torch.tensor([[[-0.1, -0.5], [-0.2, -0.3]], [[-1.0, -2.0], [-1.0, -2.0]]])
    _, index, _ = actual = expand(frontier, children, 3)
    assert index.tolist() == [[0, 1, 2], [0, 2, 1]], name
    assert_expand_matches(actual, frontier, children, 3, name)


@pytest.mark.parametrize("shape", [(10, 10, 10), (4, 3, 4), (1, 1, 1), (7, 13, 91), (3, 5, 2)])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_expand_random_with_ties(impl, gen, shape, batch):
    name, _, expand = impl
    k, c, top_k = shape
    frontier = -(torch.rand(batch, k, generator=gen) * 4).round(decimals=1)
    children = -(torch.rand(batch, k, c, generator=gen) * 4).round(decimals=1)
    children = torch.sort(children, dim=-1, descending=True).values
    if batch > 1:
        children[0] = 0.0  # a tree of all-equal scores
        children[1, :, 0] = -0.0
    assert_expand_matches(expand(frontier, children, top_k), frontier, children, top_k,
                          f"{name} {shape} {seed_note(gen)}")


def test_expand_thousand_trees(impl, gen):
    name, _, expand = impl
    frontier = -(torch.rand(1000, 10, generator=gen) * 2).round(decimals=1)
    children = -(torch.rand(1000, 10, 10, generator=gen) * 2).round(decimals=1)
    assert_expand_matches(expand(frontier, children, 10), frontier, children, 10,
                          f"{name} {seed_note(gen)}")


def test_bench_smoke(tmp_path):
    """bench/kernels/bench_topk.py --smoke runs here and writes one CSV + PNG per op."""
    script = Path(__file__).resolve().parents[1] / "bench" / "kernels" / "bench_topk.py"
    result = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    for op in ("topk_log_softmax", "eagle2_expand", "eagle2_rerank", "build_tree"):
        assert (tmp_path / f"{op}.csv").exists() and (tmp_path / f"{op}.png").exists(), op
        # the floor is the bytes at the measured rate; the empty launch has its own column
        for row in csv.DictReader((tmp_path / f"{op}.csv").open()):
            floor = float(row["bytes"]) / (float(row["floor_gbps"]) * 1e3)
            assert float(row["floor_us"]) == pytest.approx(floor, rel=0.01, abs=0.002), row
            assert float(row["launch_us"]) >= 0 and "floor_note" in row
            under = float(row["median_us"]) < float(row["floor_us"])
            assert ("below its floor" in row["floor_note"]) == under, row


# --------------------------------------------------------------------------------------------
# GPU: the real launches against torch on the full grid
# --------------------------------------------------------------------------------------------


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("vocab", [111, 32000, 128256, 151936])
@pytest.mark.parametrize("batch", [1, 5, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_gpu_topk_matches_torch(ext, gen, backend, vocab, batch, dtype):
    logits = random_logits(batch, vocab, dtype, gen).cuda()
    d2t = torch.randint(0, 100, (vocab,), generator=gen).cuda()
    for k in (1, 10, 32):
        values, ids = ops.topk_log_softmax(logits, k, backend=backend)
        assert_topk_matches(values, ids, logits, k, note=f"{backend} k={k} {seed_note(gen)}")
    values, ids = ops.topk_log_softmax(logits, 10, d2t, backend=backend)
    assert_topk_matches(values, ids, logits, 10, d2t, f"{backend} d2t {seed_note(gen)}")


@needs_gpu
@pytest.mark.parametrize("backend", ["cuda", "triton"])
@pytest.mark.parametrize("batch", [1, 5, 64, 1000])
def test_gpu_expand_matches_torch(ext, gen, backend, batch):
    for k, c, top_k in ((10, 10, 10), (7, 13, 91), (60, 100, 60)):
        frontier = -(torch.rand(batch, k, generator=gen) * 4).round(decimals=1).cuda()
        children = -(torch.rand(batch, k, c, generator=gen) * 4).round(decimals=1).cuda()
        assert_expand_matches(ops.eagle2_expand(frontier, children, top_k, backend=backend),
                              frontier.cpu(), children.cpu(), top_k,
                              f"{backend} {(k, c, top_k)} {seed_note(gen)}")
