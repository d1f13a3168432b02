"""Triton linear and rms_norm (eagle_kernels/ops/decoder_triton.py): the reference's contract
within the flash rule, and row invariance bit for bit (interpreter here, the GPU's -m gpu run
there: on a CUDA machine the same tests take CUDA tensors).

Tolerance: against the fp64 reference, the kernel's largest error is at most twice torch's own
error in the same dtype plus fp32 rounding noise around the output. False failures: at fp16 /
bf16 none while the fp32 sums stay below that noise, by construction: kernel and torch each round
an fp32 value to the output dtype, and where their roundings differ both values lie within the
fp32 difference of the rounding boundary, so the kernel's error exceeds torch's by at most twice
that difference (measured over 40 seeds of every case: 0.50 of the bound). At fp32 the largest
error reached 0.26 of the bound over the same 40 seeds. Row invariance is exact for every input by
construction (each row's code does not depend on M): no false failures.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import decoder_triton, reference
from eagle_kernels.ops._backend import backend_status

from conftest import assert_as_close_as_torch
from cuda_support import gpu_when_present, seed_note

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = [gpu_when_present, pytest.mark.skipif(not backend_status("triton").available,
                                                  reason=backend_status("triton").reason)]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
IDS = ["fp32", "fp16", "bf16"]


def _draw(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def assert_within_flash_rule(got, want64, torch_result, note):
    """The project's rule (conftest.assert_as_close_as_torch), in torch's dtype and shape."""
    assert got.dtype == torch_result.dtype and got.shape == torch_result.shape, note
    assert_as_close_as_torch(got, torch_result, want64, note)


# (rows, width, out): one row, awkward widths (1, 63, 1000: four K splits), awkward outputs,
# rows over three 64-row tiles (decoder_triton.LINEAR_BLOCK_M)
LINEAR_SIZES = [(1, 64, 64), (1, 1000, 130), (17, 63, 65), (37, 200, 1), (5, 1, 33),
                (64, 576, 192), (130, 96, 70)]


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rows, width, out", LINEAR_SIZES,
                         ids=[f"M{m}-K{k}-N{n}" for m, k, n in LINEAR_SIZES])
def test_linear_triton_matches_reference(gen, dtype, rows, width, out):
    x = _draw(gen, rows, width, dtype=dtype)
    w = _draw(gen, out, width, dtype=dtype, scale=width**-0.5)
    b = _draw(gen, out, dtype=dtype) if out % 2 else None
    got = ops.linear(x, w, b, backend="triton")
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    assert_within_flash_rule(got, want, reference.linear_group(x, [w], [b])[0],
                             f"{dtype} {seed_note(gen)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
def test_linear_triton_rows_do_not_depend_on_the_row_count(gen, dtype):
    """Each row alone (M = 1, a decode step) equals, bit for bit, the same row among 130 (a
    verify pass over three 64-row tiles) and among 5 others; a group's outputs equal single
    linears. Rows checked alone: each tile's first and last, and a few between."""
    x = _draw(gen, 130, 1000, dtype=dtype)
    weights = [_draw(gen, n, 1000, dtype=dtype, scale=0.03) for n in (130, 64)]
    bias = _draw(gen, 64, dtype=dtype)
    batched = ops.linear_group(x, weights, [None, bias], backend="triton")
    few = ops.linear_group(x[10:15].contiguous(), weights, [None, bias], backend="triton")
    for i in (0, 1, 10, 14, 36, 63, 64, 65, 100, 127, 128, 129):
        alone = ops.linear_group(x[i:i + 1].contiguous(), weights, [None, bias],
                                 backend="triton")
        for j in range(2):
            assert torch.equal(alone[j][0], batched[j][i]), (i, j, seed_note(gen))
            if 10 <= i < 15:
                assert torch.equal(few[j][i - 10], batched[j][i]), (i, j, seed_note(gen))


def test_row_count_check_catches_a_split_that_follows_the_call(gen, monkeypatch):
    """Power of the test above: K splits chosen per call (four for the batch, as the weight's
    shape gives, one pass for a single row) change a row's bits: over seeds 0-19 all 37 rows
    differed every time; the check needs one, so one is what this asserts."""
    x = _draw(gen, 37, 1000)
    w = _draw(gen, 130, 1000, scale=0.03)
    batched = ops.linear(x, w, backend="triton")
    monkeypatch.setattr(decoder_triton, "linear_splits", lambda cols, width, device: 1)
    differ = sum(not torch.equal(ops.linear(x[i:i + 1].contiguous(), w, backend="triton")[0],
                                 batched[i]) for i in range(37))
    assert differ >= 1, (differ, seed_note(gen))


# Split counts per weight width for the group test: every weight of a launch its own (one of
# them unsplit), as q / k / v of different widths get on a GPU.
GROUP_SPLITS = {130: 3, 64: 1, 70: 4, 33: 2, 7: 1}


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rows", [1, 70])
def test_linear_triton_group_is_single_linears_bit_for_bit(gen, dtype, rows, monkeypatch):
    """A group runs LINEAR_GROUP_MAX weights per launch (and one launch of their split sums);
    each weight's outputs equal, bit for bit, those of a launch of that weight alone: groups of
    1-6 weights (two launches from five: the empty weight is skipped), biases on some, split
    and unsplit weights with and without one.
    Power: with every weight of a launch given the first weight's split count, the fp32 cases
    failed for seeds 0-9 every time (at fp16 / bf16 the output rounding hides the last-bit
    differences from some draws: the fp32 cases carry this check); with the third weight's
    tiles offset by the second's tile count instead of its own, every case failed (seeds 0-2);
    with the split sums' bias flags taken from the uncompacted weight list, every case failed."""
    monkeypatch.setattr(decoder_triton, "linear_splits",
                        lambda cols, width, device: GROUP_SPLITS.get(cols, 1))
    x = _draw(gen, rows, 1000, dtype=dtype)
    widths = [130, 64, 0, 70, 33, 7]
    weights = [_draw(gen, n, 1000, dtype=dtype, scale=0.03) for n in widths]
    biased = [True, False, False, True, False, True]  # split and not, with and without
    biases = [_draw(gen, n, dtype=dtype) if b else None for n, b in zip(widths, biased)]
    for count in range(1, len(widths) + 1):
        group = ops.linear_group(x, weights[:count], biases[:count], backend="triton")
        for i in range(count):
            alone = ops.linear(x, weights[i], biases[i], backend="triton")
            assert torch.equal(group[i], alone), (count, i, seed_note(gen))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, cols, bias", [(1, 130, True), (70, 70, False), (5, 1, True)])
def test_fused_split_sums_experiment_is_the_shipped_linear_bit_for_bit(gen, dtype, rows, cols,
                                                                        bias):
    """bench/kernels/linear_fused_sum.py (the next GPU run's experiment: each output tile's
    last split program adds the K-split partials, no second launch) gives the shipped Triton
    linear's bits: the same fp32 adds in split order. Three draws per case: on a GPU a race
    between a partial's store and the last program's load would show as a differing draw.
    Exact, so no false failures; power: the partials added in reverse order failed every fp32
    case (bf16's output rounding hides the last bits; checked with that mutation). Ordering
    between programs is the GPU's to show: the interpreter runs them one after another."""
    from bench_support import load_script

    fused = load_script("bench/kernels/linear_fused_sum.py", "linear_fused_sum")
    assert decoder_triton.linear_splits(cols, 1000, DEVICE) > 1  # the path under test
    for _ in range(3):
        x = _draw(gen, rows, 1000, dtype=dtype)
        weight = _draw(gen, cols, 1000, dtype=dtype, scale=0.03)
        b = _draw(gen, cols, dtype=dtype) if bias else None
        want = ops.linear(x, weight, b, backend="triton")
        assert torch.equal(fused.linear_fused_sum(x, weight, b), want), seed_note(gen)


def test_linear_triton_empty_sizes(gen):
    x = _draw(gen, 3, 0)
    w = _draw(gen, 5, 0)
    b = _draw(gen, 5)
    assert torch.equal(ops.linear(x, w, b, backend="triton"), b.expand(3, 5))
    assert torch.equal(ops.linear(x, w, backend="triton"), torch.zeros(3, 5, device=DEVICE))
    assert ops.linear(_draw(gen, 0, 4), _draw(gen, 5, 4), backend="triton").shape == (0, 5)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rows, width", [(1, 1), (7, 3), (33, 576), (4, 1000)])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
def test_rms_norm_triton_matches_reference(gen, dtype, rows, width, with_residual):
    x = _draw(gen, rows, width, dtype=dtype)
    weight = _draw(gen, width, dtype=dtype)
    residual = _draw(gen, rows, width, dtype=dtype) if with_residual else None
    got = ops.rms_norm(x, weight, 1e-5, residual, backend="triton")
    mine = reference.rms_norm(x, weight, 1e-5, residual)
    h = x.double() if residual is None else (x + residual).double()
    exact = weight.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
    note = f"{dtype} {seed_note(gen)}"
    if residual is None:
        assert_within_flash_rule(got, exact, mine, note)
    else:
        assert torch.equal(got[1], mine[1]), note  # h = x + residual in the dtype, as torch
        assert_within_flash_rule(got[0], exact, mine[0], note)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rms_norm_triton_rows_do_not_depend_on_the_row_count(gen, dtype):
    x = _draw(gen, 2, 9, 576, dtype=dtype)
    weight = _draw(gen, 576, dtype=dtype)
    residual = _draw(gen, 2, 9, 576, dtype=dtype)
    out, h = ops.rms_norm(x, weight, 1e-6, residual, backend="triton")
    for b in range(2):
        for t in range(9):
            alone = ops.rms_norm(x[b, t:t + 1].contiguous(), weight, 1e-6,
                                 residual[b, t:t + 1].contiguous(), backend="triton")
            assert torch.equal(alone[0][0], out[b, t]) and torch.equal(alone[1][0], h[b, t])


def test_rms_norm_triton_refuses_rows_wider_than_its_block(gen):
    width = decoder_triton.RMS_NORM_MAX_WIDTH + 1
    x = _draw(gen, 1, width)
    with pytest.raises(ValueError, match="RMS_NORM_MAX_WIDTH"):
        ops.rms_norm(x, _draw(gen, width), 1e-5, backend="triton")
    assert ops.rms_norm(x, _draw(gen, width), 1e-5).shape == (1, width)  # auto: another backend


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("heads, dim", [(9, 64), (2, 80), (1, 2), (32, 128), (3, 256)])
def test_apply_rope_triton_is_the_reference_bit_for_bit(gen, dtype, heads, dim):
    """Each product and the sum rounded to the dtype as torch rounds them, no multiply-add:
    the reference's bits for every dtype (an fma, or a product kept in fp32, changes some of
    them; 9 and 3 heads leave part of a head block empty, 80 pads the head dimension)."""
    x = _draw(gen, 2, 5, heads, dim, dtype=dtype)
    positions = torch.randint(0, 50, (2, 5), generator=gen).to(DEVICE)
    cos, sin = _draw(gen, 50, dim, dtype=dtype), _draw(gen, 50, dim, dtype=dtype)
    got = ops.apply_rope(x, positions, cos, sin, backend="triton")
    assert torch.equal(got, reference.apply_rope(x, positions, cos, sin)), \
        f"{dtype} {seed_note(gen)}"


def test_apply_rope_triton_stays_in_bounds_for_out_of_range_positions(gen):
    """With value checks off, a position outside the tables reads row 0 (no OOB read)."""
    from eagle_kernels.ops._validate import no_value_checks

    x = _draw(gen, 1, 3, 2, 8)
    cos, sin = _draw(gen, 4, 8), _draw(gen, 4, 8)
    positions = torch.tensor([[-5, 2, 1000]], device=DEVICE)
    with no_value_checks():
        out = ops.apply_rope(x, positions, cos, sin, backend="triton")
    expected = reference.apply_rope(x, torch.tensor([[0, 2, 0]], device=DEVICE), cos, sin)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=IDS)
@pytest.mark.parametrize("rows, width", [(1, 1536), (5, 1537), (2, 3)])
def test_silu_mul_triton_matches_reference(gen, dtype, rows, width):
    gate = _draw(gen, rows, width, dtype=dtype, scale=8.0)
    gate[0, :3] = torch.tensor([-100.0, 100.0, 0.0])[: min(3, width)].to(dtype)  # saturated
    up = _draw(gen, rows, width, dtype=dtype)
    got = ops.silu_mul(gate, up, backend="triton")
    assert_within_flash_rule(got, reference.silu_mul(gate.double(), up.double()),
                             reference.silu_mul(gate, up), f"{dtype} {seed_note(gen)}")


def test_apply_rope_triton_keeps_the_sign_of_zero(gen):
    """rotate_half negates x's second half: -(+0.0) is -0.0 in torch, and the kernel's sign
    factor keeps it (a 0 - x negation, Triton 3.6's lowering of -x, gives +0.0)."""
    x = torch.zeros(1, 1, 1, 4, device=DEVICE)
    cos = torch.full((1, 4), -1.0, device=DEVICE)
    sin = torch.ones(1, 4, device=DEVICE)
    positions = torch.zeros(1, 1, dtype=torch.int64, device=DEVICE)
    got = ops.apply_rope(x, positions, cos, sin, backend="triton")
    want = reference.apply_rope(x, positions, cos, sin)
    assert torch.equal(torch.signbit(got), torch.signbit(want)), (got, want)
