"""Weight packs of the cpu linear: weights exactly representable in bf16, Q4_1 or Q8_0 blocks
pack narrow (bf16, 4-bit and 8-bit levels summed in blocks) and give the fp32 pack's bits;
others stay fp32. Layout, recovery in row chunks and refusals."""

import pytest
import torch

from eagle_kernels import ops

from cpu_support import each_cpu_isa, needs_cpu_backend, q4_exact_weight, q8_exact_weight

def _narrow_pack_gives_the_fp32_bits(monkeypatch, x, exact, pack_dtype, flag: str) -> None:
    """``exact`` packs as ``pack_dtype``, the same weight with one value moved off the grid
    packs in fp32, and ops.linear over the narrow pack equals it over the fp32 pack
    (``decoder.<flag>`` off) bit for bit on every instruction set."""
    from eagle_kernels.ops import decoder

    assert decoder.pack_weight(exact).dtype == pack_dtype
    inexact = exact.clone()
    inexact[exact.shape[0] // 2, exact.shape[1] // 2] += 2.0**-20
    assert decoder.pack_weight(inexact).dtype == torch.float32
    for isa in each_cpu_isa():
        ours = ops.linear(x, exact.clone(), backend="cpu")
        with monkeypatch.context() as patch:
            patch.setattr(decoder, flag, False)
            fp32_pack = ops.linear(x, exact.clone(), backend="cpu")
        assert torch.equal(ours, fp32_pack), isa


def _block_pack_contract(x, exact, pack_dtype, levels, scales, offsets) -> None:
    """``exact`` [N, K] packs as ``pack_dtype`` (one value moved off the grid: fp32), and
    ops.linear over the block pack (decoder_linear.h "block packs": per block of 32 k, S = sum x L in
    an FMA chain, X = sum x, T = fma(d, S, fma(o, X, T))) is, on every instruction set:
    row-invariant (each row equals its one-row GEMM: every GEMM path agrees), the same bits on
    every instruction set, and within the worst-case rounding error of that formula of the exact
    product: a term d x L passes through at most 32 roundings in S, one in its block's outer fma
    and 2 per later block; a term o x at most 31 in X, 2 in its block and 2 per later block: at
    most 32 + 2 B (B = K / 32 blocks), so |y - x w^T| <= gamma_(32 + 2B) * sum_k |x_k|
    (|d| |L_k| + |o|) with gamma_n = n u / (1 - n u), u = 2^-24 (a proven bound: no false
    failure). ``levels`` [N, K], ``scales`` / ``offsets`` [N, K / 32] are the weight's L, d, o."""
    from eagle_kernels.ops import decoder

    assert decoder.pack_weight(exact).dtype == pack_dtype
    inexact = exact.clone()
    inexact[exact.shape[0] // 2, exact.shape[1] // 2] += 2.0**-20
    assert decoder.pack_weight(inexact).dtype == torch.float32
    per_k = (scales.abs().repeat_interleave(32, 1) * levels.abs()
             + offsets.abs().repeat_interleave(32, 1)).double()
    terms = 32 + 2 * (exact.shape[1] // 32)
    bound = terms * 2.0**-24 / (1 - terms * 2.0**-24) * (x.double().abs() @ per_k.T)
    exact_product = x.double() @ exact.double().T
    results = []
    for isa in each_cpu_isa():
        ours = ops.linear(x, exact.clone(), backend="cpu")
        one_row = torch.cat([ops.linear(x[i:i + 1], exact.clone(), backend="cpu")
                             for i in range(x.shape[0])])
        assert torch.equal(ours, one_row), isa
        assert ((ours.double() - exact_product).abs() <= bound).all(), isa
        results.append(ours)
    assert all(torch.equal(results[0], other) for other in results[1:])


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 300, 40), (3, 576, 100),
                                            (4, 577, 37), (5, 64, 16), (9, 96, 37),
                                            (13, 64, 40), (61, 1536, 200), (70, 96, 33)])
def test_bf16_exact_weights_pack_in_bf16_with_the_fp32_packs_bits(gen, monkeypatch, rows, width,
                                                                  out):
    """A weight whose every element is a bf16 value (a bf16 checkpoint run in fp32) is packed in
    bf16, half the bytes, and gives the fp32 pack's results bit for bit, on every instruction
    set; any other weight keeps an fp32 pack."""
    x = torch.randn(rows, width, generator=gen)
    exact = torch.randn(out, width, generator=gen).bfloat16().float()
    _narrow_pack_gives_the_fp32_bits(monkeypatch, x, exact, torch.bfloat16, "PACK_BF16_EXACT")


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 576, 100),
                                            (5, 96, 37), (6, 576, 100), (9, 96, 37),
                                            (13, 64, 16), (61, 1536, 200), (70, 96, 33)])
def test_q4_exact_weights_pack_in_4_bits_and_sum_in_blocks(gen, rows, width, out):
    """A weight whose every block of 32 k is exactly a GGUF Q4_1 block (d * q + m, fp16 d and
    m) is packed in 4 bits plus its scales, and its GEMM keeps the block-pack contract
    (_block_pack_contract) on every instruction set and every GEMM path (one row, one row tile,
    row groups, widened blocks: which row counts take which path differs per instruction set,
    see decoder_linear.h); a weight with one other value, or K not a multiple of 32, keeps a wider
    pack."""
    from eagle_kernels.ops import decoder

    x = torch.randn(rows, width, generator=gen)
    exact = q4_exact_weight(gen, out, width)
    packed = decoder.pack_weight(exact)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-out // 16) * width // 32 * 384
    q, d, m = decoder.q4_blocks(exact)
    assert int(q.max()) <= 15 and torch.equal(d.half().float(), d)
    assert decoder.pack_weight(exact[:, :width - 1].contiguous()).dtype != torch.uint8
    zero = decoder.Q4_ZERO_LEVEL
    _block_pack_contract(x, exact, torch.uint8, q.float() - zero, d, m + zero * d)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 96, 37),
                                            (6, 576, 100), (9, 96, 37), (13, 64, 16),
                                            (70, 96, 33)])
def test_q8_exact_weights_pack_in_8_bits_and_sum_in_blocks(gen, rows, width, out):
    """A weight whose every block of 32 k is exactly a GGUF Q8_0 block (d * q, fp16 d, the
    default target's tied embedding / lm_head) is packed in 8 bits plus its scales, and its
    GEMM keeps the block-pack contract (o = 0) on every instruction set and GEMM path; one
    changed value keeps an fp32 pack."""
    from eagle_kernels.ops import decoder

    x = torch.randn(rows, width, generator=gen)
    exact = q8_exact_weight(gen, out, width)
    packed = decoder.pack_weight(exact)
    assert packed.dtype == torch.int8 and packed.numel() == -(-out // 16) * width // 32 * 576
    assert decoder.q8_blocks(torch.randn(16, 64, generator=gen)) is None
    q, d = decoder.q8_blocks(exact)
    _block_pack_contract(x, exact, torch.int8, q.float(), d, torch.zeros_like(d))


@needs_cpu_backend
def test_q4_pack_layout_is_the_kernels(gen):
    """The packer's zero level (ops/decoder.py Q4_ZERO_LEVEL) is the kernels' (kernels.h
    kQ4ZeroLevel), and a pack's block holds d[16], o[16] = m + 8 d, then 16 row pairs of 16 bytes,
    byte j holding column j's q of the even row in its low nibble and of the odd row in its
    high nibble (decoder_linear.h "block packs", simd.h vq4_level_pair)."""
    from eagle_kernels import _cpu
    from eagle_kernels.ops import decoder

    assert decoder.Q4_ZERO_LEVEL == _cpu.Q4_ZERO_LEVEL == 8
    exact = q4_exact_weight(gen, 16, 32)
    q, d, m = decoder.q4_blocks(exact)
    block = decoder.pack_q4_exact(exact)[0, 0]
    assert torch.equal(block[:64].view(torch.float32), d[:, 0])
    assert torch.equal(block[64:128].view(torch.float32), m[:, 0] + 8 * d[:, 0])
    pairs = block[128:].view(16, 16)  # [row pair, column]
    assert torch.equal(pairs & 15, q[:, 0::2].T) and torch.equal(pairs >> 4, q[:, 1::2].T)


@needs_cpu_backend
def test_q4_block_that_rounds_keeps_a_wider_pack(gen, monkeypatch):
    """A block pack's GEMM works with the exact d q + m (decoder_linear.h "block packs"), so a
    Q4_1 block whose fp32 values are d q + m rounded must not be packed in 4 bits: d = 1 + 2^-10
    beside m = 32768 (d q + m needs up to 26 significant bits; m + 8 d is exact, so only the
    values tell), and m = 2^-24 beside d = 1 (m + 8 d rounds too). The wider pack gives the fp32
    pack's results bit for bit."""
    from eagle_kernels.ops import decoder

    x = torch.randn(3, 64, generator=gen)
    for d, m in ((1 + 2.0**-10, 32768.0), (1.0, 2.0**-24)):
        exact = q4_exact_weight(gen, 16, 64)
        q = torch.arange(32.0) % 16
        exact[5, :32] = q * d + m  # fp32: d q exact, + m rounded
        assert not torch.equal(exact[5, :32].double(), q.double() * d + m)
        assert decoder.q4_blocks(exact) is None
        assert decoder.pack_weight(exact).dtype != torch.uint8
        ours = ops.linear(x, exact.clone(), backend="cpu")
        with monkeypatch.context() as patch:
            for flag in ("PACK_Q4_EXACT", "PACK_Q8_EXACT", "PACK_BF16_EXACT"):
                patch.setattr(decoder, flag, False)
            assert torch.equal(ours, ops.linear(x, exact.clone(), backend="cpu"))


def test_q4_q8_recovery_in_row_chunks_equals_the_whole(gen, monkeypatch):
    """Large weights are recovered RECOVERY_CHUNK_ROWS rows at a time (bounded temporaries):
    the same (q, d, m) as in one piece, and one off-grid value in a later chunk refuses all."""
    from eagle_kernels.ops import decoder

    for exact, recover in ((q4_exact_weight(gen, 300, 64), decoder.q4_blocks),
                           (q8_exact_weight(gen, 300, 64), decoder.q8_blocks)):
        whole = recover(exact)
        with monkeypatch.context() as patch:
            patch.setattr(decoder, "RECOVERY_CHUNK_ROWS", 70)
            chunked = recover(exact)
            broken = exact.clone()
            broken[290, 3] += 2.0**-20
            assert recover(broken) is None
        assert all(torch.equal(a, b) for a, b in zip(whole, chunked))


def test_q4_recovery_refuses_what_is_not_exactly_q4(gen):
    """Random fp32 values, non-finite values and a negative zero where d * 0 + m gives +0 are
    not Q4_1 blocks: no 4-bit pack (its weights would not be the tensor's)."""
    from eagle_kernels.ops import decoder

    assert decoder.q4_blocks(torch.randn(16, 64, generator=gen)) is None
    exact = q4_exact_weight(gen, 16, 64)
    for bad in (float("nan"), float("inf")):
        broken = exact.clone()
        broken[3, 5] = bad
        assert decoder.q4_blocks(broken) is None
    zeros = torch.zeros(16, 64)
    zeros[2, 7] = -0.0
    assert decoder.q4_blocks(zeros) is None
    assert decoder.q4_blocks(torch.zeros(16, 64)) is not None  # d = 0, q = 0, m = 0


def _narrow_packs_run_the_fp32_bits(gen, monkeypatch, flag: str, convert) -> None:
    """A tiny target whose weights ``convert`` makes exactly representable in a narrow pack
    gives the same hidden states and K/V with ``decoder.<flag>`` on (narrow packs) and off
    (fp32 packs), bit for bit."""
    from runtime_helpers import tiny_target

    from eagle_kernels.ops import decoder

    seed = int(torch.randint(1000, (1,), generator=gen))
    tokens = torch.randint(0, 300, (2, 5), generator=gen)
    mask = ops.pack_tree_mask(torch.tril(torch.ones(2, 5, 5, dtype=torch.bool)))
    results = []
    for narrow in (True, False):
        target = tiny_target(seed=seed)
        with torch.no_grad():
            convert(target)
        cache = target.allocate_cache(2, 16)
        positions = torch.arange(5).repeat(2, 1)
        with monkeypatch.context() as patch, torch.inference_mode():
            patch.setattr(decoder, flag, narrow)
            hidden, _ = target(tokens, positions, cache, mask)
            packed = decoder._PACKS.get(target.model.layers[0].mlp.down_proj.weight)
            assert (packed.dtype != torch.float32) == narrow
        results.append((hidden, cache))
    (h1, c1), (h2, c2) = results
    assert torch.equal(h1, h2)
    assert all(torch.equal(a, b) for a, b in zip(c1.keys + c1.values, c2.keys + c2.values))


@needs_cpu_backend
def test_bf16_exact_target_runs_the_fp32_bits(gen, monkeypatch):
    """The fused layers over bf16 packs (a bf16 checkpoint loaded in fp32) give the hidden states
    and K/V of the same layers over fp32 packs, bit for bit."""
    def to_bf16(target):
        for parameter in target.parameters():
            parameter.copy_(parameter.bfloat16().float())

    _narrow_packs_run_the_fp32_bits(gen, monkeypatch, "PACK_BF16_EXACT", to_bf16)
