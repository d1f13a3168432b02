"""A draft head rounded to Q8_0 values: the nearest 8-bit values, packed in 8 bits, only the
head's own weights touched, and generation still exactly the target's."""

from __future__ import annotations

import pytest
import torch

from cpu_support import needs_cpu_backend
from runtime_helpers import oracle_head, tiny_target

from eagle_kernels.ops import decoder
from eagle_kernels.runtime.draft_heads import EAGLE1, EAGLE3, new_draft_head, round_head_to_q8_0
from eagle_kernels.runtime.drafting import TreeConfig
from eagle_kernels.runtime.generation import Engine


def _fp16_at_or_above(values: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 >= each value (float64 arithmetic, independent of the code under test)."""
    near = values.half()
    above = near.double() < values.double()
    return torch.where(above, (near.view(torch.int16) + 1).view(torch.float16), near).float()


def test_round_to_q8_0_is_the_nearest_multiple_of_a_scale_that_needs_no_clamp(gen):
    w = torch.randn(37, 96, generator=gen) * 0.02
    w[3, :32] = 0.0  # a zero block
    w[4, 32:64] *= 15  # a block of larger values
    w[5, 64:] *= 1e4
    rounded = decoder.round_to_q8_0(w)
    blocks, got = w.view(37, 3, 32), rounded.view(37, 3, 32)
    d = _fp16_at_or_above(blocks.abs().amax(-1, keepdim=True) / 127)
    q = torch.round(blocks / torch.where(d > 0, d, 1.0))
    assert int(q.abs().max()) == 127  # d >= max / 127: no value needs clamping
    assert torch.equal(got, d * q + 0.0)
    assert torch.all((got - blocks).abs() <= d / 2)  # the nearest multiple of d
    assert not torch.signbit(got[got == 0]).any()  # no -0.0: q8_blocks refuses it (d * 0 is +0)
    assert decoder.pack_weight(rounded).dtype == torch.int8
    assert torch.equal(decoder.round_to_q8_0(rounded), rounded)  # Q8_0 values stay


def test_round_to_q8_0_of_tiny_blocks_stays_packable(gen):
    """Blocks whose scale is a subnormal fp16 (max |w| < 127 * 2^-14): d from above may be too
    coarse for the max to reach q = 127 (then the packer could not recover d); the fp16 below is
    used, q clamped. Below 2^-25 a block is 0."""
    for scale in (3e-3, 1e-3, 1e-4, 1e-5):
        w = torch.randn(64, 64, generator=gen) * scale
        rounded = decoder.round_to_q8_0(w)
        assert rounded is not None and decoder.pack_weight(rounded).dtype == torch.int8, scale
        step = w.view(64, 2, 32).abs().amax(-1, keepdim=True) / 127
        # d >= step - 2^-24: the clamped max is off by at most 127 * 2^-24
        assert torch.all((rounded - w).view(64, 2, 32).abs() <= step + 127 * 2.0 ** -24), scale
    tiny = torch.randn(4, 64, generator=gen) * 1e-9
    assert torch.equal(decoder.round_to_q8_0(tiny), torch.zeros_like(tiny))


def test_round_to_q8_0_refuses_what_it_cannot_pack(gen):
    assert decoder.round_to_q8_0(torch.randn(4, 48, generator=gen)) is None  # K % 32
    w = torch.randn(4, 64, generator=gen)
    w[1, 7] = float("inf")
    assert decoder.round_to_q8_0(w) is None
    assert decoder.round_to_q8_0(torch.full((2, 32), 1e9)) is None  # d beyond fp16
    with pytest.raises(TypeError, match="w: expected a float32 tensor"):
        decoder.round_to_q8_0(torch.zeros(2, 32, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"w: expected a 2-D \[N, K\] weight"):
        decoder.round_to_q8_0(torch.zeros(64))


@pytest.mark.parametrize("kind", [EAGLE3, EAGLE1])
def test_round_head_touches_only_the_heads_own_projections(kind):
    target = tiny_target(seed=1)
    head = new_draft_head(kind, target, seed=2)
    before = {k: v.clone() for k, v in head.state_dict().items()}
    target_before = {k: v.clone() for k, v in target.state_dict().items()}
    linears = [name + ".weight" for name, m in head.named_modules()
               if isinstance(m, torch.nn.Linear)]
    packs = [decoder._PACKS.get(head.get_parameter(name)) for name in linears]
    assert all(pack.dtype == torch.float32 for pack in packs)  # random fp32 values
    assert round_head_to_q8_0(head) == len(linears) > 0
    # The in-place rounding is seen by the pack cache: the next GEMM streams 8-bit packs.
    assert all(decoder._PACKS.get(head.get_parameter(name)).dtype == torch.int8
               for name in linears)
    for key, value in head.state_dict().items():
        if key in linears:
            assert not torch.equal(value, before[key]) and decoder.q8_blocks(value) is not None
        else:
            assert torch.equal(value, before[key]), key  # norms, d2t, t2d
    for key, value in target.state_dict().items():
        assert torch.equal(value, target_before[key]), key  # shared embedding / lm_head


@needs_cpu_backend
@pytest.mark.parametrize("tree", [TreeConfig(1, 1, 2), TreeConfig(4, 3, 12)])
def test_generation_with_a_rounded_head_is_the_targets_greedy_output(tree):
    """The rounded head changes what is drafted, never what is output: greedy speculative
    tokens equal autoregressive ones (an oracle head, so drafts are accepted and rejected)."""
    target = tiny_target(seed=4)
    prompts = [[5, 17, 42, 99, 7], [3, 11, 250, 8, 64, 1, 2]]
    reference = Engine(target).generate(prompts, 24, speculative=False).tokens
    head = oracle_head(target, [p + r for p, r in zip(prompts, reference)], seed=3)
    round_head_to_q8_0(head)
    out = Engine(target, head, tree).generate(prompts, 24, speculative=True)
    assert out.tokens == reference
    assert out.stats.tau > 1.0  # drafts were accepted: the rounded head was used


def test_from_pretrained_keeps_the_head_as_draft_weights_says():
    """'auto' rounds an fp32 cpu head, 'exact' keeps the checkpoint's values; a wrong value is
    refused before anything is loaded."""
    from eagle_kernels.runtime.api import _store_head_weights, from_pretrained

    with pytest.raises(ValueError, match="draft_weights: expected one of auto, exact, q8_0"):
        from_pretrained(draft_weights="int4")
    target = tiny_target(seed=1)
    for setting, applied in (("auto", "q8_0"), ("q8_0", "q8_0"), ("exact", "exact")):
        head = new_draft_head(EAGLE3, target, seed=2)
        before = head.fc.weight.clone()
        assert _store_head_weights(head, setting) == applied
        assert torch.equal(head.fc.weight, before) == (applied == "exact"), setting
    assert _store_head_weights(None, "auto") == "exact"  # no head: autoregressive only
    low = new_draft_head(EAGLE3, target, seed=2).to(torch.bfloat16)
    assert _store_head_weights(low, "auto") == "exact"  # no 8-bit kernels to stream it
    with pytest.raises(ValueError, match="draft_weights: 'q8_0' rounds an fp32 head"):
        _store_head_weights(low, "q8_0")
