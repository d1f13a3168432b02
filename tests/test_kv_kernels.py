"""KV cache kernels: compact_kv (Triton in the interpreter on CPU, the CUDA kernel's host twin,
the GPU), write_kv and rope_write_kv (Triton on the GPU where one is, else in the interpreter).

Every backend must equal the reference exactly (compact_kv and write_kv move raw bytes;
rope_write_kv rounds as the reference's ops do). Caches of one call differ
in head count, head size and dtype, so every word size the kernels pick (16 / 8 / 4 / 2 / 1
bytes) is exercised.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import kv, reference

from cuda_support import gpu_when_present, needs_gpu, seed_note
from test_kv import position_cache, random_case

GOLDEN = dict(lens=[2, 0], nodes=[[0, 2, 3, -1], [0, -1, -1, -1]], accepted=[2, 0])

# (heads, head_dim, dtype) per cache: row sizes of 96, 48, 8, 6 and 3 bytes
LAYERS = [(3, 8, torch.float32), (3, 8, torch.float16), (1, 4, torch.bfloat16),
          (3, 1, torch.float16), (3, 1, torch.uint8)]


def golden_args(device="cpu"):
    return [torch.tensor(GOLDEN[key], dtype=torch.int32, device=device)
            for key in ("lens", "nodes", "accepted")]


def expected_after(caches, lens, nodes, accepted):
    want = [cache.clone() for cache in caches]
    reference.compact_kv(want, lens, nodes, accepted)
    return want


def host_compact(ext, caches, lens, nodes, accepted):
    layout = kv._layout(caches, relative=False, largest_word=16)
    ext.compact_kv_host(layout.addresses.data_ptr(), layout.row_words.data_ptr(), len(caches),
                        lens.data_ptr(), nodes.data_ptr(), accepted.data_ptr(), caches[0].shape[0],
                        caches[0].shape[1], nodes.shape[1], layout.word_bytes)
    return layout.word_bytes


def test_word_size_is_the_largest_that_divides_every_row():
    def word(*layers):
        return kv._word_bytes([torch.zeros(1, 2, h, d, dtype=t) for h, d, t in layers], 16)

    assert word((2, 8, torch.float32)) == 16
    assert word((2, 8, torch.float32), (1, 4, torch.bfloat16)) == 8
    assert word((3, 1, torch.float16)) == 2
    assert word((3, 1, torch.uint8), (2, 8, torch.float32)) == 1


def test_triton_golden():
    k, v = position_cache(2, 10), position_cache(2, 10, offset=100.0, dtype=torch.float16)
    ops.compact_kv([k, v], *golden_args(), backend="triton")
    assert k[0, :, 0, 0].tolist() == [0, 1, 2, 4, 5, 5, 6, 7, 8, 9]
    assert v[0, :, 0, 0].tolist() == [100, 101, 102, 104, 105, 105, 106, 107, 108, 109]
    assert k[1, :, 0, 0].tolist() == list(range(10))


def test_triton_random_paths_every_layer(gen):
    for layers in (LAYERS, LAYERS[:3], LAYERS[3:4]):  # word sizes 1, 8 and 2
        caches, lens, nodes, accepted = random_case(gen, layers=layers)
        want = expected_after(caches, lens, nodes, accepted)
        ops.compact_kv(caches, lens, nodes, accepted, backend="triton")
        for index, (got, exp) in enumerate(zip(caches, want)):
            assert torch.equal(got, exp), f"cache {index} {seed_note(gen)}"


def test_host_twin_golden(ext):
    k, v = position_cache(2, 10), position_cache(2, 10, offset=100.0, dtype=torch.float16)
    host_compact(ext, [k, v], *golden_args())
    assert k[0, :, 0, 0].tolist() == [0, 1, 2, 4, 5, 5, 6, 7, 8, 9]
    assert v[0, :, 0, 0].tolist() == [100, 101, 102, 104, 105, 105, 106, 107, 108, 109]


@pytest.mark.parametrize("layers", [LAYERS, LAYERS[:1], LAYERS[:3], LAYERS[3:4]],
                         ids=["mixed-1B", "16B", "8B", "2B"])
def test_host_twin_random_paths(ext, gen, layers):
    for _ in range(5):
        caches, lens, nodes, accepted = random_case(gen, layers=layers)
        want = expected_after(caches, lens, nodes, accepted)
        host_compact(ext, caches, lens, nodes, accepted)
        for index, (got, exp) in enumerate(zip(caches, want)):
            assert torch.equal(got, exp), f"cache {index} {seed_note(gen)}"


def test_host_twin_clamps_count_to_width(ext):
    """num_accepted past the width (outside the contract) never reads past accepted_nodes."""
    k = position_cache(1, 8)
    lens, nodes = torch.tensor([1], dtype=torch.int32), torch.tensor([[0, 2]], dtype=torch.int32)
    host_compact(ext, [k], lens, nodes, torch.tensor([5], dtype=torch.int32))
    assert k[0, :, 0, 0].tolist() == [0, 1, 3, 3, 4, 5, 6, 7]


@needs_gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_gpu_matches_reference(gen, backend):
    if backend == "cuda":
        pytest.importorskip("eagle_kernels._C")
    for batch, num_nodes in ((1, 8), (16, 60), (64, 64)):
        caches, lens, nodes, accepted = random_case(gen, LAYERS, batch, num_nodes, 128)
        caches = [cache.cuda() for cache in caches]
        want = expected_after(caches, lens.cuda(), nodes.cuda(), accepted.cuda())
        ops.compact_kv(caches, lens.cuda(), nodes.cuda(), accepted.cuda(), backend=backend)
        for got, exp in zip(caches, want):
            assert torch.equal(got, exp), seed_note(gen)


@needs_gpu
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_gpu_in_cuda_graph(gen, backend):
    if backend == "cuda":
        pytest.importorskip("eagle_kernels._C")
    caches, lens, nodes, accepted = random_case(gen, LAYERS, 8, 30, 96)
    caches, lens, nodes, accepted = ([c.cuda() for c in caches], lens.cuda(), nodes.cuda(),
                                     accepted.cuda())
    originals = [c.clone() for c in caches]
    ops.compact_kv(caches, lens, nodes, accepted, backend=backend)  # warm-up: layout table
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.compact_kv(caches, lens, nodes, accepted, backend=backend)
    for cache, original in zip(caches, originals):
        cache.copy_(original)
    want = expected_after(caches, lens, nodes, accepted)
    graph.replay()
    torch.cuda.synchronize()
    for got, exp in zip(caches, want):
        assert torch.equal(got, exp), seed_note(gen)


# ---- write_kv: a pass's new rows --------------------------------------------------------------


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("heads, dim", [(3, 8), (8, 128), (1, 3)])
def test_write_kv_equals_the_reference(gen, backend, dtype, heads, dim):
    """Exact (a copy); rows of 24 / 1024 / 3 elements (one block, exactly one, a padded one),
    lengths that put the last row at the end of the cache."""
    batch, count, max_len, offset = 3, 5, 40, 2
    k, v = (torch.randn(batch, count, heads, dim, generator=gen).to(dtype) for _ in range(2))
    lens = torch.tensor([0, 17, max_len - offset - count], dtype=torch.int32)
    caches = [torch.randn(batch, max_len, heads, dim, generator=gen).to(dtype) for _ in range(2)]
    want = [cache.clone() for cache in caches]
    reference.write_kv(k, v, *want, lens, offset)
    ops.write_kv(k, v, *caches, lens, offset, backend=backend)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1]), seed_note(gen)


def test_write_kv_refuses_rows_past_the_cache_and_stays_inside_without_checks(gen):
    """A row past max_len is refused with value checks on; with them off the Triton kernel
    skips it (and a negative length's rows) instead of writing outside the sequence."""
    from eagle_kernels.ops._validate import no_value_checks

    k, v = (torch.randn(2, 3, 1, 4, generator=gen) for _ in range(2))
    lens = torch.tensor([8, -2], dtype=torch.int32)
    caches = [torch.zeros(2, 10, 1, 4) for _ in range(2)]
    with pytest.raises(ValueError, match=r"cache_lens: expected values in \[0, 8\)"):
        ops.write_kv(k, v, *caches, lens, 0, backend="triton")
    with no_value_checks():
        ops.write_kv(k, v, *caches, lens, 0, backend="triton")
    assert torch.equal(caches[0][0, 8:], k[0, :2]) and torch.equal(caches[1][1, :1], v[1, 2:])
    assert int((caches[0] != 0).sum()) == 4 * 3  # rows 8, 9 of sequence 0, row 0 of sequence 1


@pytest.mark.parametrize("call, message", [
    (lambda c, l: ops.write_kv(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4).half(), c, c, l),
     "v: expected dtype"),
    (lambda c, l: ops.write_kv(torch.randn(2, 1, 2, 4), torch.randn(2, 1, 2, 4), c, c, l),
     "k_cache: expected shape"),
    (lambda c, l: ops.write_kv(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4), c, c,
                               l.long()), "cache_lens: expected dtype"),
    (lambda c, l: ops.write_kv(torch.randn(2, 1, 1, 4), torch.randn(2, 1, 1, 4), c, c, l, -1),
     "offset"),
    (lambda c, l: ops.write_kv(torch.randn(2, 3, 1, 4), torch.randn(2, 3, 1, 4), c, c, l, 8),
     r"k: 3 new rows past offset 8 do not fit the caches' max_len 10"),
])
def test_write_kv_bad_arguments_name_themselves(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(torch.zeros(2, 10, 1, 4), torch.zeros(2, dtype=torch.int32))


# ---- rope_write_kv: RoPE of q and k, then write_kv ----------------------------------------------


ROPE_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _rope_write_arguments(gen, dtype, q_heads, kv_heads, dim, batch=3, count=5, max_len=40):
    """(q, k, v, positions, cos, sin, [k_cache, v_cache]) on ROPE_DEVICE."""
    q = torch.randn(batch, count, q_heads, dim, generator=gen).to(dtype)
    k, v = (torch.randn(batch, count, kv_heads, dim, generator=gen).to(dtype) for _ in range(2))
    positions = torch.randint(0, 60, (batch, count), generator=gen)
    angles = torch.randn(60, dim // 2, generator=gen).repeat(1, 2) * 3
    caches = [torch.randn(batch, max_len, kv_heads, dim, generator=gen).to(dtype)
              for _ in range(2)]
    moved = [t.to(ROPE_DEVICE) for t in (q, k, v, positions, angles.cos().to(dtype),
                                          angles.sin().to(dtype), *caches)]
    return (*moved[:6], moved[6:])


@gpu_when_present
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("q_heads, kv_heads, dim", [(4, 2, 16), (9, 3, 80), (1, 1, 2), (0, 2, 8)])
def test_rope_write_kv_is_the_reference_bit_for_bit(gen, dtype, q_heads, kv_heads, dim):
    """The rotated q and both caches equal apply_rope + write_kv's bit for bit: GQA, a padded
    head (80 in a block of 128), the smallest head, no q heads; lengths that put the last row at
    the end of the cache. Power: the Triton kernel writing k unrotated, or rotating v too, or
    offsetting the v blocks by q's block count only, failed every case here."""
    q, k, v, positions, cos, sin, caches = _rope_write_arguments(gen, dtype, q_heads, kv_heads,
                                                                 dim)
    lens = torch.tensor([0, 17, 40 - 2 - 5], dtype=torch.int32, device=ROPE_DEVICE)
    want = [cache.clone() for cache in caches]
    want_q = reference.rope_write_kv(q, k, v, positions, cos, sin, *want, lens, 2)
    got_q = ops.rope_write_kv(q, k, v, positions, cos, sin, *caches, lens, 2, backend="triton")
    assert torch.equal(got_q, want_q), seed_note(gen)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1]), seed_note(gen)


@gpu_when_present
def test_rope_write_kv_stays_inside_the_caches_and_tables_without_checks(gen):
    """With value checks off, rows past the cache (or before it) are skipped and a position past
    the tables reads row 0 (as apply_rope's kernel): the caches hold exactly the rows inside."""
    from eagle_kernels.ops._validate import no_value_checks

    q, k, v, positions, cos, sin, caches = _rope_write_arguments(gen, torch.float32, 2, 1, 4,
                                                                 batch=2, count=3, max_len=10)
    caches = [torch.zeros_like(c) for c in caches]
    lens = torch.tensor([8, -2], dtype=torch.int32, device=ROPE_DEVICE)  # rows 8, 9; 0
    with pytest.raises(ValueError, match=r"cache_lens: expected values in \[0, 8\)"):
        ops.rope_write_kv(q, k, v, positions, cos, sin, *caches, lens, 0, backend="triton")
    read = positions.clone()
    positions[1, 2] = read[1, 2] = 1000
    read[1, 2] = 0
    with no_value_checks():
        got_q = ops.rope_write_kv(q, k, v, positions, cos, sin, *caches, lens, 0,
                                  backend="triton")
    assert torch.equal(got_q, reference.apply_rope(q, read, cos, sin)), seed_note(gen)
    want = [torch.zeros_like(c) for c in caches]
    for cache, rows in zip(want, (reference.apply_rope(k, read, cos, sin), v)):
        cache[0, 8:], cache[1, :1] = rows[0, :2], rows[1, 2:]
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1]), seed_note(gen)


@pytest.mark.parametrize("change, message", [
    (dict(q=torch.randn(2, 1, 2, 3)), "q: expected shape"),
    (dict(q=None), "q: expected a torch.Tensor, got NoneType"),  # was an AttributeError
    (dict(k=torch.randn(2, 1, 1, 4).half()), "k: expected dtype"),
    (dict(k=torch.randn(2, 2, 1, 4)), "k: expected shape"),
    (dict(positions=torch.zeros(2, 1, dtype=torch.int32)), "positions: expected dtype"),
    (dict(positions=torch.full((2, 1), 9)), r"positions: expected values in \[0, 5\)"),
    (dict(cos=torch.randn(5, 6)), "cos: expected shape"),
    (dict(k_cache=torch.zeros(2, 10, 2, 4)), "k_cache: expected shape"),
    (dict(offset=10), r"k: 1 new rows past offset 10 do not fit the caches' max_len 10"),
    (dict(offset=2**63), r"offset: expected an int in \[0, 10\]"),  # bounded, no overflow
    (dict(q=torch.randn(2, 1, 0, 4), cos=torch.randn(0, 4), sin=torch.randn(0, 4)),
     "cos: expected at least one row"),  # k's rows need one even where q has no heads
])
def test_rope_write_kv_bad_arguments_name_themselves(change, message):
    arguments = dict(q=torch.randn(2, 1, 2, 4), k=torch.randn(2, 1, 1, 4),
                     v=torch.randn(2, 1, 1, 4), positions=torch.zeros(2, 1, dtype=torch.int64),
                     cos=torch.randn(5, 4), sin=torch.randn(5, 4), k_cache=torch.zeros(2, 10, 1, 4),
                     v_cache=torch.zeros(2, 10, 1, 4), cache_lens=torch.zeros(2, dtype=torch.int32),
                     offset=0)
    with pytest.raises((ValueError, TypeError), match=message):
        ops.rope_write_kv(**{**arguments, **change})
