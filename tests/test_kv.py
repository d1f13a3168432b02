"""compact_kv: golden moves, random paths on several layers and dtypes, bad inputs."""

import pytest
import torch

from eagle_kernels import ops

from conftest import random_parents
from cpu_support import needs_cpu_backend


def position_cache(batch, max_len, heads=1, dim=1, offset=0.0, dtype=torch.float32):
    """Cache whose entry at position t holds the value offset + t (easy to read moves)."""
    values = torch.arange(max_len, dtype=torch.float32) + offset
    return values.view(1, max_len, 1, 1).expand(batch, max_len, heads, dim).to(dtype).contiguous()


def test_golden_compaction():
    k, v = position_cache(2, 10), position_cache(2, 10, offset=100.0)
    ops.compact_kv([k, v], torch.tensor([2, 0], dtype=torch.int32),
                   torch.tensor([[0, 2, 3, -1], [0, -1, -1, -1]], dtype=torch.int32),
                   torch.tensor([2, 0], dtype=torch.int32))
    assert k[0, :, 0, 0].tolist() == [0, 1, 2, 4, 5, 5, 6, 7, 8, 9]
    assert v[0, :, 0, 0].tolist() == [100, 101, 102, 104, 105, 105, 106, 107, 108, 109]
    assert k[1, :, 0, 0].tolist() == list(range(10))


# A case where no accepted node leaves its slot (node i at position i for every i <= accepted
# of every sequence) moves nothing, so compact_kv doing nothing would pass it: such a case is
# drawn again, at most this often. Measured P(no move): 0.04 for 4 sequences of 20 nodes, 0.56
# for 1 of 8 (the smallest here), 0 for 16 of 60: a case that never moves after all of them,
# < 0.6^64 < 1e-14.
CASE_REDRAWS = 64


def random_case(gen, layers, batch=4, num_nodes=20, max_len=64):
    """Caches [B, max_len, heads, dim] of the given (heads, dim, dtype) layers, random committed
    lengths, and a random accepted prefix of a random root-to-leaf path per sequence, at least
    one sequence with a node to move (see CASE_REDRAWS)."""
    for draws in range(1, CASE_REDRAWS + 1):
        parents = random_parents(batch, num_nodes, gen)
        _, _, paths = ops.build_tree(parents)
        lens = torch.randint(0, max_len - num_nodes, (batch,), generator=gen).to(torch.int32)
        leaves = (paths[:, :, 0] >= 0).sum(1)
        rows = (torch.rand(batch, generator=gen) * leaves).long()
        nodes = paths[torch.arange(batch), rows]
        depth = (nodes >= 0).sum(1) - 1
        accepted = (torch.rand(batch, generator=gen) * (depth + 1)).to(torch.int32)
        slots = torch.arange(nodes.shape[1])
        nodes = torch.where(slots <= accepted[:, None], nodes, -1)
        if ((nodes != slots) & (slots <= accepted[:, None])).any():
            break
        assert draws < CASE_REDRAWS, f"no node to move after {draws} draws"
    caches = [(torch.randn(batch, max_len, heads, dim, generator=gen) * 50).to(dtype)
              for heads, dim, dtype in layers]
    return caches, lens, nodes.to(torch.int32).contiguous(), accepted


def test_random_paths_every_layer(gen):
    caches, lens, accepted_nodes, num_accepted = random_case(
        gen, [(3, 8, torch.float32), (3, 8, torch.float16), (1, 8, torch.bfloat16)])
    before = [cache.clone() for cache in caches]
    ops.compact_kv(caches, lens, accepted_nodes, num_accepted)
    for cache, old in zip(caches, before):
        for b in range(cache.shape[0]):
            start, count = int(lens[b]), int(num_accepted[b]) + 1
            source = start + accepted_nodes[b, :count].long()
            assert torch.equal(cache[b, start:start + count], old[b, source])
            assert torch.equal(cache[b, :start], old[b, :start])
            assert torch.equal(cache[b, start + count:], old[b, start + count:])


def test_bad_inputs():
    k = position_cache(1, 8)
    lens = torch.tensor([2], dtype=torch.int32)
    nodes = torch.tensor([[0, 1, -1]], dtype=torch.int32)
    count = torch.tensor([1], dtype=torch.int32)
    with pytest.raises(TypeError, match="caches: expected a non-empty list"):
        ops.compact_kv(k, lens, nodes, count)
    with pytest.raises(ValueError, match=r"caches\[1\]: expected shape \[1, 8, \*, \*\]"):
        ops.compact_kv([k, position_cache(1, 9)], lens, nodes, count)
    with pytest.raises(ValueError, match="num_accepted: expected values in"):
        ops.compact_kv([k], lens, nodes, torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"accepted_nodes: expected at least one column"):
        ops.compact_kv([k], lens, torch.zeros(1, 0, dtype=torch.int32), count * 0)
    with pytest.raises(ValueError,
                       match=r"accepted_nodes: expected the root .*got 1 at index \[0\]"):
        ops.compact_kv([k], lens, torch.tensor([[1, 2, -1]], dtype=torch.int32), count)
    with pytest.raises(ValueError, match=r"accepted_nodes: expected strictly increasing .*got row "
                                         r"0: \[0, 2, 2\]"):
        ops.compact_kv([k], lens, torch.tensor([[0, 2, 2]], dtype=torch.int32),
                       torch.tensor([2], dtype=torch.int32))
    with pytest.raises(ValueError, match="cache_lens \\+ accepted_nodes: expected values in"):
        ops.compact_kv([k], torch.tensor([7], dtype=torch.int32), nodes, count)
    with pytest.raises(ValueError, match="cache_lens: expected dtype int32"):
        ops.compact_kv([k], lens.long(), nodes, count)
    with pytest.raises(ValueError, match=r"caches\[0\]: expected a contiguous .*got strides"):
        ops.compact_kv([position_cache(1, 8, heads=2, dim=2).transpose(2, 3)], lens, nodes,
                       count)
    # a cache given twice (or two views of one buffer) would be moved twice by the reference
    # and raced on by the GPU kernels, which move every cache at once
    with pytest.raises(ValueError, match=r"caches\[2\]: expected memory of its own, got memory "
                                         r"shared with caches\[0\]"):
        ops.compact_kv([k, position_cache(1, 8), k], lens, nodes, count)
    flat = torch.zeros(2 * k.numel())
    first, shifted = (flat[start:start + k.numel()].view(k.shape) for start in (0, 1))
    with pytest.raises(ValueError, match=r"caches\[1\]: .* shared with caches\[0\]"):
        ops.compact_kv([first, shifted], lens, nodes, count)  # overlapping views
    ops.compact_kv([first, flat[k.numel():].view(k.shape)], lens, nodes, count)  # adjacent: fine


@needs_cpu_backend
def test_cpu_backend_equals_the_reference(gen):
    """The cpu backend (csrc/cpu/kv.h) moves exactly the reference's rows, any dtype / row size."""
    layers = [(3, 8, torch.float32), (2, 5, torch.float16), (1, 8, torch.bfloat16)]
    caches, lens, accepted_nodes, num_accepted = random_case(gen, layers)
    reference_caches = [cache.clone() for cache in caches]
    ops.compact_kv(caches, lens, accepted_nodes, num_accepted, backend="cpu")
    ops.compact_kv(reference_caches, lens, accepted_nodes, num_accepted, backend="torch")
    assert all(torch.equal(a, b) for a, b in zip(caches, reference_caches))


@needs_cpu_backend
def test_cpu_backend_stays_in_bounds_with_value_checks_off():
    """Out-of-contract lengths and nodes (value checks off) never move a row from or to outside
    the cache: guard rows on both sides stay NaN."""
    from eagle_kernels.ops._validate import no_value_checks

    storage = torch.full((1, 12, 2, 4), float("nan"))
    cache = storage[:, 1:-1]  # [1, 10, 2, 4], contiguous, a guard row either side
    cache.copy_(position_cache(1, 10, heads=2, dim=4))
    count = torch.tensor([3], dtype=torch.int32)
    cases = [(9, [0, 4, 7, 1]), (8, [0, -5, 1, 2]), (0, [0, 12, 40, -1]), (-3, [0, 2, 3, 4]),
             (2, [0, 1, 2, 3])]
    with no_value_checks():
        for prefix, nodes in cases:
            ops.compact_kv([cache], torch.tensor([prefix], dtype=torch.int32),
                           torch.tensor([nodes], dtype=torch.int32), count, backend="cpu")
    assert storage[:, 0].isnan().all() and storage[:, -1].isnan().all()
    assert not cache.isnan().any()


@needs_cpu_backend
def test_cpu_backend_takes_empty_batches_and_rows():
    """No sequences, no path columns or empty rows: nothing to move, no error."""
    empty_rows = torch.zeros(1, 8, 0, 4)
    one = torch.zeros(1, dtype=torch.int32)
    ops.compact_kv([empty_rows], torch.tensor([2], dtype=torch.int32),
                   torch.tensor([[0, 2]], dtype=torch.int32), torch.tensor([1], dtype=torch.int32),
                   backend="cpu")
    ops.compact_kv([torch.zeros(0, 8, 1, 4)], one[:0], torch.zeros(0, 3, dtype=torch.int32),
                   one[:0], backend="cpu")
