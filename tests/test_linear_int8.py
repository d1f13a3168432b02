"""The cpu backend's GEMM over Q4 / Q8 block packs with int8 activations (opt-in,
ops.set_int8_activations; csrc/cpu/linear_int8.h): x rounded exactly as the reference rounds it,
the product within a proven bound of the exact product of the rounded x, row-invariant, and the
same bits on every instruction set (VNNI tiles and the scalar fallback)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import decoder, reference

from cpu_support import each_cpu_isa, needs_cpu_backend, q4_exact_weight, q8_exact_weight

pytestmark = needs_cpu_backend

ROWS = (1, 2, 3, 4, 5, 9, 17)  # one row (4-panel tiles), 4-row tiles and their tails


@contextlib.contextmanager
def int8_activations():
    ops.set_int8_activations(True)
    try:
        yield
    finally:
        ops.set_int8_activations(False)


def _awkward_rows(gen, rows: int, width: int) -> torch.Tensor:
    """Random rows with blocks of every kind: all zero, ties (max 127, so s = 1 and x / s
    lands on halves), tiny (subnormal s), large, and a single nonzero value."""
    x = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    blocks = x.view(rows, width // 32, 32)
    kinds = torch.randint(0, 6, (rows, width // 32), generator=gen)
    for i, b in (kinds == 1).nonzero().tolist():
        blocks[i, b] = 0.0
    for i, b in (kinds == 2).nonzero().tolist():
        blocks[i, b] = torch.randint(-127, 127, (32,), generator=gen) + 0.5
        blocks[i, b, 0] = 127.0
    for i, b in (kinds == 3).nonzero().tolist():
        blocks[i, b] *= 1e-37
    for i, b in (kinds == 4).nonzero().tolist():
        blocks[i, b] *= 1e30
    for i, b in (kinds == 5).nonzero().tolist():
        blocks[i, b] = 0.0
        blocks[i, b, 7] = -3.0
    return x


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", (64, 96, 576))
def test_x_is_rounded_as_the_reference_rounds_it(gen, rows, width):
    """A Q4 weight that reads x back (w[n, n] = 15 / 16: d = 1/16, q = 15, m = 0; all-zero
    blocks elsewhere) makes each output s q (15 / 16) rounded once: the kernel's int8 rows and
    scales equal quantize_activations_int8's bit for bit (ties to even, zero blocks, subnormal
    scales), on every instruction set and row count; a block holding inf or NaN turns its
    row's outputs into NaN."""
    x = _awkward_rows(gen, rows, width)
    weight = torch.eye(width) * (15 / 16)
    assert decoder.pack_weight(weight).dtype == torch.uint8
    q, scale = reference.quantize_activations_int8(x)
    expected = scale.repeat_interleave(32, -1) * (q.float() * 15 / 16)
    poisoned = x.clone()
    poisoned[0, width // 2] = float("inf")
    if rows > 1:
        poisoned[rows - 1, 3] = float("nan")
    with int8_activations():
        for isa in each_cpu_isa():
            assert torch.equal(ops.linear(x, weight, backend="cpu"), expected), isa
            out = ops.linear(poisoned, weight, backend="cpu")
            assert out[0].isnan().all() and out[-1].isnan().all(), isa
            assert torch.equal(out[1:-1], expected[1:-1]), isa


def _int8_contract(x, exact, pack_dtype, levels, scales, offsets) -> None:
    """ops.linear over the block pack of ``exact`` with int8 activations is, on every
    instruction set: row-invariant (each row equals its one-row GEMM), the same bits on every
    instruction set, not the fp32-activation result, and within gamma_(B + 2) sum_k |s q_k|
    (|d| |L_k| + |o|) of the exact product of the rounded x (s q) with the weight (each term
    passes through at most B + 2 roundings, see linear_int8.h; gamma_n = n u / (1 - n u),
    u = 2^-24: a proven bound, no false failure). ``levels`` [N, K], ``scales`` / ``offsets``
    [N, K / 32] are the weight's L, d, o."""
    assert decoder.pack_weight(exact).dtype == pack_dtype
    q, s = reference.quantize_activations_int8(x)
    rounded = q.double() * s.double().repeat_interleave(32, -1)
    per_k = (scales.abs().repeat_interleave(32, 1) * levels.abs()
             + offsets.abs().repeat_interleave(32, 1)).double()
    terms = exact.shape[1] // 32 + 2
    bound = terms * 2.0**-24 / (1 - terms * 2.0**-24) * (rounded.abs() @ per_k.T)
    exact_product = rounded @ exact.double().T
    fp32_activations = ops.linear(x, exact, backend="cpu")
    results = []
    with int8_activations():
        for isa in each_cpu_isa():
            ours = ops.linear(x, exact, backend="cpu")
            one_row = torch.cat([ops.linear(x[i:i + 1], exact, backend="cpu")
                                 for i in range(x.shape[0])])
            assert torch.equal(ours, one_row), isa
            assert ((ours.double() - exact_product).abs() <= bound).all(), isa
            results.append(ours)
    assert all(torch.equal(results[0], other) for other in results[1:])
    assert not torch.equal(results[0], fp32_activations)


@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 96, 37),
                                            (4, 576, 100), (6, 1536, 70), (17, 64, 16)])
def test_q4_packs_with_int8_activations(gen, rows, width, out):
    """Q4 packs (the default target's layers) with int8 activations: _int8_contract."""
    x = _awkward_rows(gen, rows, width)
    exact = q4_exact_weight(gen, out, width)
    q, d, m = decoder.q4_blocks(exact)
    zero = decoder.Q4_ZERO_LEVEL
    _int8_contract(x, exact, torch.uint8, q.float() - zero, d, m + zero * d)


@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (5, 96, 37),
                                            (17, 64, 16)])
def test_q8_packs_with_int8_activations(gen, rows, width, out):
    """Q8 packs (the default target's lm_head) with int8 activations: _int8_contract (o = 0)."""
    x = _awkward_rows(gen, rows, width)
    exact = q8_exact_weight(gen, out, width)
    q, d = decoder.q8_blocks(exact)
    _int8_contract(x, exact, torch.int8, q.float(), d, torch.zeros_like(d))


def test_other_packs_and_mixed_groups_keep_fp32_activations(gen):
    """fp32 / bf16 packs (draft heads) ignore the mode; a group mixing them with a Q4 pack gives
    each weight its own pack's result."""
    x = torch.randn(3, 64, generator=gen)
    dense, q4 = torch.randn(40, 64, generator=gen), q4_exact_weight(gen, 24, 64)
    alone = [ops.linear(x, dense, backend="cpu")]
    with int8_activations():
        alone.append(ops.linear(x, q4, backend="cpu"))
        mixed = ops.linear_group(x, [dense, q4], backend="cpu")
        assert torch.equal(ops.linear(x, dense, backend="cpu"), alone[0])
    assert torch.equal(mixed[0], alone[0]) and torch.equal(mixed[1], alone[1])


def test_the_switch_checks_its_argument():
    with pytest.raises(TypeError, match="enabled: expected a bool"):
        ops.set_int8_activations(1)
    assert not ops.int8_activations()
    with int8_activations():
        assert ops.int8_activations()
    assert not ops.int8_activations()
