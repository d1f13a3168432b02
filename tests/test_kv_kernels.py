"""compact_kv kernels: Triton (interpreter on CPU), the CUDA kernel's host twin, and the GPU.

Every backend must equal the reference exactly (it moves raw bytes). Caches of one call differ
in head count, head size and dtype, so every word size the kernels pick (16 / 8 / 4 / 2 / 1
bytes) is exercised.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import kv, reference

from cuda_support import needs_gpu, seed_note
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
