"""Decoder-layer ops (linear, rms_norm, silu_mul, apply_rope): every backend against the fp64
reference, row invariance of the cpu kernels on every instruction set this processor has, and
clear errors for bad input. The fused layer: test_decoder_layer.py; weight packs:
test_weight_packs.py."""

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference
from eagle_kernels.ops._validate import no_value_checks

from conftest import assert_as_close_as_torch
from cpu_support import each_cpu_isa, needs_cpu_backend


LINEAR_SHAPES = [(1, 576, 1536), (16, 576, 192), (61, 1536, 576), (5, 577, 13), (4, 576, 1000),
                 (6, 33, 50), (3, 5, 7), (1, 1, 1), (2, 33, 0), (0, 8, 4)]


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", LINEAR_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_cpu_matches_reference(gen, rows, width, out, bias):
    x = torch.randn(rows, width, generator=gen)
    w = torch.randn(out, width, generator=gen)
    b = torch.randn(out, generator=gen) if bias else None
    exact = reference.linear_group(x.double(), [w.double()], [None if b is None else b.double()])[0]
    for isa in each_cpu_isa():
        ours = ops.linear(x, w, b, backend="cpu")
        assert ours.shape == (rows, out) and ours.dtype == torch.float32, isa
        assert_as_close_as_torch(ours, torch.nn.functional.linear(x, w, b), exact)


@needs_cpu_backend
def test_linear_group_is_one_linear_per_weight(gen):
    x = torch.randn(2, 7, 64, generator=gen)
    weights = [torch.randn(n, 64, generator=gen) for n in (40, 8, 8)]
    biases = [torch.randn(40, generator=gen), None, torch.randn(8, generator=gen)]
    for isa in each_cpu_isa():
        group = ops.linear_group(x, weights, biases, backend="cpu")
        for y, w, b in zip(group, weights, biases):
            assert y.shape == (2, 7, w.shape[0]), isa
            assert torch.equal(y, ops.linear(x, w, b, backend="cpu")), isa


@needs_cpu_backend
@pytest.mark.parametrize("op", ["linear", "linear_bf16_pack", "rms_norm", "silu_mul",
                                "apply_rope"])
def test_cpu_rows_do_not_depend_on_their_neighbours(gen, op):
    """Row invariance: each row computed alone equals, bit for bit, the same row computed among
    up to 80 others, whatever its place, on every instruction set (linear: every tiling, up to
    and past the row groups' 64 rows, over fp32 and bf16 packs)."""
    width, most = 576, 80
    x = torch.randn(most, width, generator=gen)
    w = torch.randn(200, width, generator=gen)
    if op == "linear_bf16_pack":  # every element a bf16 value: packed in bf16
        w = w.bfloat16().float()
    norm_weight = torch.randn(width, generator=gen)
    up = torch.randn(most, width, generator=gen)
    cos, sin = torch.randn(300, 64, generator=gen), torch.randn(300, 64, generator=gen)
    positions = torch.randint(0, 300, (1, most), generator=gen)

    def run(rows):
        if op.startswith("linear"):
            return ops.linear(x[rows], w, backend="cpu")
        if op == "rms_norm":
            return ops.rms_norm(x[rows], norm_weight, 1e-5, residual=up[rows], backend="cpu")[0]
        if op == "silu_mul":
            return ops.silu_mul(x[rows], up[rows], backend="cpu")
        heads = x[rows].view(1, -1, 9, 64)
        return ops.apply_rope(heads, positions[:, rows].contiguous(), cos, sin, backend="cpu")[0]

    for isa in each_cpu_isa():
        for count in (1, 2, 3, 4, 5, 6, 7, 13, 16, 37, 64, 65, 80):
            rows = torch.randperm(most, generator=gen)[:count]
            together = run(rows)
            for place in range(count):
                alone = run(rows[place:place + 1])
                assert torch.equal(alone.reshape(together[place].shape), together[place]), \
                    (isa, count, place)


@needs_cpu_backend
@pytest.mark.parametrize("pack", ["fp32", "bf16", "q4", "q8"])
def test_gemm_bits_do_not_depend_on_the_team(gen, pack):
    """A GEMM's threads share its pieces (csrc/cpu/linear_shared_tiles.h: a thread whose own
    pieces are done takes the others' from the back): whichever thread computes a piece, and
    however many threads there are, every output comes out with the same bits, none skipped or
    left half-written (each call's y may reuse an earlier one's memory: that is filled with
    NaN first). Three weights in one group with
    widths that end mid-piece, row counts that take every GEMM path on some instruction set
    (one row, one row tile over blocks, row groups, widened blocks), 1 to 8 threads on this
    machine's cores: teams larger than the cores leave threads descheduled mid-call, so pieces
    change hands (a deterministic outcome compared bit for bit: no false failure)."""
    from cpu_support import q4_exact_weight, q8_exact_weight

    width = 576
    maker = {"fp32": lambda n: torch.randn(n, width, generator=gen),
             "bf16": lambda n: torch.randn(n, width, generator=gen).bfloat16().float(),
             "q4": lambda n: q4_exact_weight(gen, n, width),
             "q8": lambda n: q8_exact_weight(gen, n, width)}[pack]
    weights = [maker(n) for n in (1000, 200, 37)]
    threads = torch.get_num_threads()
    try:
        for isa in each_cpu_isa():
            for rows in (1, 2, 3, 6, 7, 13, 50, 70):
                x = torch.randn(rows, width, generator=gen)
                torch.set_num_threads(1)
                alone = ops.linear_group(x, weights, backend="cpu")
                for team in (2, 3, 5, 8):
                    torch.set_num_threads(team)
                    for _ in range(12 if rows == 1 else 3):
                        shared = ops.linear_group(x, weights, backend="cpu")
                        assert all(torch.equal(a, b) for a, b in zip(alone, shared)), \
                            (isa, rows, team)
                        for y in shared:  # its memory may be the next call's y: no old bits
                            y.fill_(float("nan"))
    finally:
        torch.set_num_threads(threads)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 577), (3, 1), (0, 16)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_cpu_matches_reference(gen, rows, width, with_residual):
    x = torch.randn(rows, width, generator=gen) * 3
    weight = torch.randn(width, generator=gen)
    residual = torch.randn(rows, width, generator=gen) if with_residual else None
    exact = reference.rms_norm(x.double(), weight.double(), 1e-6,
                               None if residual is None else residual.double())
    torch_low = reference.rms_norm(x, weight, 1e-6, residual)
    for isa in each_cpu_isa():
        ours = ops.rms_norm(x, weight, 1e-6, residual=residual, backend="cpu")
        if with_residual:
            assert torch.equal(ours[1], torch_low[1]), isa  # x + residual: one exact add
            ours, exact_y, torch_y = ours[0], exact[0], torch_low[0]
        else:
            exact_y, torch_y = exact, torch_low
        assert_as_close_as_torch(ours, torch_y, exact_y)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width", [(1, 1536), (5, 1537), (2, 3)])
def test_silu_mul_cpu_matches_reference(gen, rows, width):
    gate = torch.randn(rows, width, generator=gen) * 8
    gate[0, :3] = torch.tensor([-100.0, 100.0, 0.0])[: min(3, width)]  # saturated and zero
    up = torch.randn(rows, width, generator=gen)
    exact = reference.silu_mul(gate.double(), up.double())
    for isa in each_cpu_isa():
        assert_as_close_as_torch(ops.silu_mul(gate, up, backend="cpu"),
                                 reference.silu_mul(gate, up), exact)


@needs_cpu_backend
@pytest.mark.parametrize("heads,dim", [(9, 64), (2, 80), (1, 2), (4, 128)])
def test_apply_rope_cpu_is_the_reference_bit_for_bit(gen, heads, dim):
    x = torch.randn(2, 5, heads, dim, generator=gen)
    positions = torch.randint(0, 50, (2, 5), generator=gen)
    cos, sin = torch.randn(50, dim, generator=gen), torch.randn(50, dim, generator=gen)
    expected = reference.apply_rope(x, positions, cos, sin)
    for isa in each_cpu_isa():
        assert torch.equal(ops.apply_rope(x, positions, cos, sin, backend="cpu"), expected), isa


@needs_cpu_backend
def test_apply_rope_cpu_stays_in_bounds_for_out_of_range_positions(gen):
    """Positions outside the table are a caller bug: refused with value checks on (every
    backend), and with checks off the cpu kernel clamps them (no OOB read)."""
    x = torch.randn(1, 3, 2, 8, generator=gen)
    cos, sin = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    positions = torch.tensor([[-5, 2, 1000]])
    for backend in ("cpu", "torch"):
        with pytest.raises(ValueError, match=r"positions: expected values in \[0, 4\)"):
            ops.apply_rope(x, positions, cos, sin, backend=backend)
    with no_value_checks():
        out = ops.apply_rope(x, positions, cos, sin, backend="cpu")
    clamped = reference.apply_rope(x, positions.clamp(0, 3), cos, sin)
    assert torch.equal(out, clamped)


def test_torch_backend_handles_low_precision(gen):
    x = torch.randn(3, 32, generator=gen).to(torch.bfloat16)
    w = torch.randn(8, 32, generator=gen).to(torch.bfloat16)
    assert ops.linear(x, w).dtype == torch.bfloat16  # auto falls back to torch for bf16
    with pytest.raises(ValueError, match="float32"):
        ops.linear(x, w, backend="cpu")


@pytest.mark.parametrize("call,message", [
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 5)), r"^weight: expected shape"),
    (lambda: ops.linear_group(torch.randn(2, 4), [torch.randn(3, 4), torch.randn(3, 5)]),
     r"weights\[1\]: expected shape"),
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 4).double()), "dtype"),
    (lambda: ops.linear(torch.randn(4, 2).t(), torch.randn(3, 4)), "contiguous"),
    (lambda: ops.linear_group(torch.randn(2, 4), []), "weights"),
    (lambda: ops.linear_group(torch.randn(2, 4), [torch.randn(3, 4)], [None, None]), "biases"),
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4)), r"^bias: "),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-6), "weight"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), -1.0), "eps"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), True), "eps"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), 1e-6, torch.randn(3, 4)), "residual"),
    (lambda: ops.silu_mul(torch.randn(2, 4), torch.randn(2, 5)), "up"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 3), torch.zeros(1, 2, dtype=torch.int64),
                            torch.randn(4, 3), torch.randn(4, 3)), r"\[B, T, H, D\]"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 1, 4), torch.zeros(1, 2, dtype=torch.int32),
                            torch.randn(4, 4), torch.randn(4, 4)), "positions"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 1, 4), torch.zeros(1, 2, dtype=torch.int64),
                            torch.randn(4, 4), torch.randn(5, 4)), "sin"),
])
def test_bad_input_raises_naming_the_argument(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()
