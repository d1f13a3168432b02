"""The cpu backend's GEMM over Q4 / Q8 block packs with quantized activations (opt-in,
ops.set_cpu_activations("int8" | "int16"); csrc/cpu/linear_int8.h): x rounded exactly as the
reference rounds it, the product within a proven bound of the exact product of the rounded x,
row-invariant, and the same bits on every instruction set (VNNI tiles and the scalar
fallback)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import decoder, reference

from cpu_support import each_cpu_isa, needs_cpu_backend, q4_exact_weight, q8_exact_weight

pytestmark = needs_cpu_backend

ROWS = (1, 2, 3, 4, 5, 9, 17)  # one row (4-panel tiles), 4-row tiles and their tails
MODES = {"int8": 8, "int16": 16}  # set_cpu_activations mode -> reference bits


@contextlib.contextmanager
def quantized_activations(mode: str):
    ops.set_cpu_activations(mode)
    try:
        yield
    finally:
        ops.set_cpu_activations("fp32")


def _awkward_rows(gen, rows: int, width: int, levels: int = 127) -> torch.Tensor:
    """Random rows with blocks of every kind: all zero, ties (max ``levels``, so s = 1 and
    x / s lands on halves), tiny (subnormal s), large, a single nonzero value, and a max so
    small that s underflows to 0 (beside zeros)."""
    x = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    blocks = x.view(rows, width // 32, 32)
    kinds = torch.randint(0, 7, (rows, width // 32), generator=gen)
    for i, b in (kinds == 1).nonzero().tolist():
        blocks[i, b] = 0.0
    for i, b in (kinds == 2).nonzero().tolist():
        blocks[i, b] = torch.randint(-levels, levels, (32,), generator=gen) + 0.5
        blocks[i, b, 0] = float(levels)
    for i, b in (kinds == 6).nonzero().tolist():
        blocks[i, b] = torch.randint(-5, 6, (32,), generator=gen) * 2.0**-149
        blocks[i, b, 0] = 0.0
    for i, b in (kinds == 3).nonzero().tolist():
        blocks[i, b] *= 1e-37
    for i, b in (kinds == 4).nonzero().tolist():
        blocks[i, b] *= 1e30
    for i, b in (kinds == 5).nonzero().tolist():
        blocks[i, b] = 0.0
        blocks[i, b, 7] = -3.0
    return x


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("width", (64, 96, 576))
def test_x_is_rounded_as_the_reference_rounds_it(gen, mode, rows, width):
    """A Q4 weight that reads x back (w[n, n] = 15 / 16: d = 1/16, q = 15, m = 0; all-zero
    blocks elsewhere) makes each output s q (15 / 16) rounded once (every step before is exact,
    also for int16's q): the kernel's integer rows and scales equal quantize_activations' bit for
    bit (ties to even, zero blocks, subnormal scales), on every instruction set and row count; a
    block holding inf or NaN turns its row's outputs into NaN."""
    x = _awkward_rows(gen, rows, width, reference.ACTIVATION_LEVELS[MODES[mode]])
    weight = torch.eye(width) * (15 / 16)
    assert decoder.pack_weight(weight).dtype == torch.uint8
    q, scale = reference.quantize_activations(x, MODES[mode])
    expected = scale.repeat_interleave(32, -1) * (q.float() * 15 / 16)
    poisoned = x.clone()
    poisoned[0, width // 2] = float("inf")
    if rows > 1:
        poisoned[rows - 1, 3] = float("nan")
    with quantized_activations(mode):
        for isa in each_cpu_isa():
            assert torch.equal(ops.linear(x, weight, backend="cpu"), expected), isa
            out = ops.linear(poisoned, weight, backend="cpu")
            assert out[0].isnan().all() and out[-1].isnan().all(), isa
            assert torch.equal(out[1:-1], expected[1:-1]), isa


def _quantized_contract(gen, mode, x, exact, pack_dtype, levels, scales, offsets) -> None:
    """ops.linear over the block pack of ``exact`` (+ a bias) with ``mode`` activations is, on
    every instruction set: row-invariant (each row equals its one-row GEMM), the same bits on
    every instruction set, and within gamma_(B + 4) (sum_k |s q_k| (|d| |L_k| + |o|) + |bias|)
    of the exact product of the rounded x (s q) with the weight plus the bias (each term passes
    through at most B + 3 roundings, see linear_int8.h, and the bias's add one more;
    gamma_n = n u / (1 - n u), u = 2^-24, plus 2^-150 a rounding where a result falls among
    the subnormals (the weights' d >= 1e-4 keep s's own such term below it): a proven bound,
    no false failure). ``levels`` [N, K], ``scales`` / ``offsets``
    [N, K / 32] are the weight's L, d, o."""
    assert decoder.pack_weight(exact).dtype == pack_dtype
    rounded = reference.rounded_activations(x, MODES[mode])
    per_k = (scales.abs().repeat_interleave(32, 1) * levels.abs()
             + offsets.abs().repeat_interleave(32, 1)).double()
    bias = torch.randn(exact.shape[0], generator=gen)
    terms = exact.shape[1] // 32 + 4
    # + terms * 2^-149: a rounding into fp32's subnormals errs by up to 2^-150 absolutely (rows
    # of tiny x give tiny s and outputs), however small the relative bound
    bound = (terms * 2.0**-24 / (1 - terms * 2.0**-24)
             * (rounded.abs() @ per_k.T + bias.double().abs()) + terms * 2.0**-149)
    exact_product = reference.linear_quantized_activations(x.double(), exact, bias, MODES[mode])
    # the mode takes effect: random normal x (unlike x made of zero or one-value blocks) is
    # not exactly an integer grid, so every output moves
    probe = torch.randn(2, exact.shape[1], generator=gen)
    fp32_activations = ops.linear(probe, exact, backend="cpu")
    results = []
    with quantized_activations(mode):
        assert (ops.linear(probe, exact, backend="cpu") != fp32_activations).any()
        for isa in each_cpu_isa():
            ours = ops.linear(x, exact, bias, backend="cpu")
            one_row = torch.cat([ops.linear(x[i:i + 1], exact, bias, backend="cpu")
                                 for i in range(x.shape[0])])
            assert torch.equal(ours, one_row), isa
            assert ((ours.double() - exact_product).abs() <= bound).all(), isa
            results.append(ours)
    assert all(torch.equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 96, 37),
                                            (4, 576, 100), (6, 1536, 70), (17, 64, 16)])
def test_q4_packs_with_quantized_activations(gen, mode, rows, width, out):
    """Q4 packs (the default target's layers): _quantized_contract."""
    x = _awkward_rows(gen, rows, width, reference.ACTIVATION_LEVELS[MODES[mode]])
    exact = q4_exact_weight(gen, out, width)
    q, d, m = decoder.q4_blocks(exact)
    zero = decoder.Q4_ZERO_LEVEL
    _quantized_contract(gen, mode, x, exact, torch.uint8, q.float() - zero, d, m + zero * d)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (5, 96, 37),
                                            (17, 64, 16)])
def test_q8_packs_with_quantized_activations(gen, mode, rows, width, out):
    """Q8 packs (the default target's lm_head): _quantized_contract (o = 0)."""
    x = _awkward_rows(gen, rows, width, reference.ACTIVATION_LEVELS[MODES[mode]])
    exact = q8_exact_weight(gen, out, width)
    q, d = decoder.q8_blocks(exact)
    _quantized_contract(gen, mode, x, exact, torch.int8, q.float(), d, torch.zeros_like(d))


@pytest.mark.parametrize("mode", MODES)
def test_other_packs_and_mixed_groups_keep_fp32_activations(gen, mode):
    """fp32 / bf16 packs (draft heads) ignore the mode; a group mixing them with a Q4 pack gives
    each weight its own pack's result."""
    x = torch.randn(3, 64, generator=gen)
    dense, q4 = torch.randn(40, 64, generator=gen), q4_exact_weight(gen, 24, 64)
    alone = [ops.linear(x, dense, backend="cpu")]
    with quantized_activations(mode):
        alone.append(ops.linear(x, q4, backend="cpu"))
        mixed = ops.linear_group(x, [dense, q4], backend="cpu")
        assert torch.equal(ops.linear(x, dense, backend="cpu"), alone[0])
    assert torch.equal(mixed[0], alone[0]) and torch.equal(mixed[1], alone[1])


@needs_cpu_backend
def test_which_weights_follow_the_mode(gen):
    """follows_cpu_activations: Q4 / Q8 block weights in fp32 do (the mode changes their
    product), dense fp32, bf16-exact and bf16 weights do not (the mode leaves them alone)."""
    q4, q8 = q4_exact_weight(gen, 24, 64), q8_exact_weight(gen, 24, 64)
    dense = torch.randn(24, 64, generator=gen)
    assert decoder.follows_cpu_activations(q4) and decoder.follows_cpu_activations(q8)
    for weight in (dense, dense.bfloat16().float(), dense.bfloat16()):
        assert not decoder.follows_cpu_activations(weight)
    x = torch.randn(2, 64, generator=gen)  # on int8's grid with probability 0
    fp32 = [ops.linear(x, w, backend="cpu") for w in (q4, dense)]
    with quantized_activations("int8"):
        changed = [not torch.equal(ops.linear(x, w, backend="cpu"), y)
                   for w, y in zip((q4, dense), fp32)]
    assert changed == [True, False]
    with pytest.raises(ValueError, match="weight: expected shape"):
        decoder.follows_cpu_activations(torch.zeros(3))


@needs_cpu_backend
def test_a_forced_torch_backend_does_not_follow_the_mode(gen, monkeypatch):
    """With EAGLE_KERNELS_BACKEND=torch no linear runs the cpu kernels: no weight follows."""
    from eagle_kernels.ops import BACKEND_ENV

    q4 = q4_exact_weight(gen, 24, 64)
    monkeypatch.setenv(BACKEND_ENV, "torch")
    assert not decoder.follows_cpu_activations(q4)


def test_the_switch_checks_its_argument():
    for wrong in ("int4", 8, None):
        with pytest.raises(ValueError, match="mode: expected one of fp32, int16, int8"):
            ops.set_cpu_activations(wrong)
    assert ops.cpu_activations() == "fp32"
    for mode in MODES:
        with quantized_activations(mode):
            assert ops.cpu_activations() == mode
    assert ops.cpu_activations() == "fp32"


def test_int16_rounds_x_finer_than_int8(gen):
    """int16 activations land ~256x closer to the fp32-activation product than int8 (what the
    mode exists for): on 2048 random outputs (K = 576), the mean |error| ratio is about 1/256;
    asserted below 1/64. Each mean averages 2048 outputs whose errors are sums of 576
    independent roundings: its relative spread is ~2 %, so a 4x miss lies > 50 standard
    deviations out (false failure far below 1e-6); the seed is printed with the test's id."""
    x = torch.randn(4, 576, generator=gen)
    exact = q4_exact_weight(gen, 512, 576)
    fp32 = ops.linear(x, exact, backend="cpu").double()
    errors = {}
    for mode in MODES:
        with quantized_activations(mode):
            errors[mode] = (ops.linear(x, exact, backend="cpu").double() - fp32).abs().mean()
    assert errors["int16"] < errors["int8"] / 64


def test_vnni_tiles_run_where_the_processor_has_them():
    """On a processor with AVX-512 VNNI + VBMI the tests above compare the VNNI tiles with the
    scalar fallback (the avx2 / generic kernels); elsewhere only the fallback runs (skipped)."""
    from eagle_kernels import _cpu

    flags = set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        flags = next((set(line.split(":", 1)[1].split()) for line in info
                      if line.startswith("flags")), set())
    needed = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512vbmi"}
    if not needed <= flags:
        pytest.skip(f"this processor lacks {sorted(needed - flags)}")
    assert _cpu.int8_vnni()
