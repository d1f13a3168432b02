"""Engine calls are independent: per-call state, graph capture and the seeded random stream.

* Calls keep their state in the call (issue 13 f): a stream paused between cycles while other
  calls run on the same engine (another max_new_tokens, another tree) ends exactly as it does
  alone, and each call reports its own output and graph status.
* Graph capture must not draw from the call's seeded generator (issue 13 a): on CPU the capture
  path is forced with a fake ``GraphedStep.try_capture`` that does what the real one does to the
  state (warm-up runs on copies of the inputs, then restores the mutable tensors) and then
  declines, so the loop runs eagerly; its tokens must equal a ``cuda_graphs=False`` run.
* The packed causal-mask cache stays bounded however many prompt lengths come by.
"""

from __future__ import annotations

import pytest
import torch

from eagle_kernels.ops.reference import unpack_tree_mask
from eagle_kernels.runtime import Engine, SamplingConfig, TreeConfig, drafting, generation
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from runtime_helpers import tiny_target

TREE = TreeConfig(top_k=2, depth=2, total_tokens=5)
OTHER_TREE = TreeConfig(top_k=1, depth=1, total_tokens=2)
SAMPLED = SamplingConfig(temperature=1.0, seed=1234)


@pytest.fixture(scope="module")
def models():
    target = tiny_target(seed=7)
    return target, new_draft_head(EAGLE3, target, seed=3)


def _prompts(gen, lengths):
    return [torch.randint(0, 299, (n,), generator=gen).tolist() for n in lengths]


def test_a_paused_stream_is_unaffected_by_other_calls(models, gen):
    target, head = models
    a_prompts, b_prompts = _prompts(gen, [4, 7]), _prompts(gen, [5])
    alone_a = Engine(target, head, TREE).generate(a_prompts, 4, SAMPLED)
    alone_b = Engine(target, head, OTHER_TREE).generate(b_prompts, 7, speculative=False)
    alone_c = Engine(target, head, OTHER_TREE).generate(b_prompts, 3, SAMPLED)

    engine = Engine(target, head, TREE)
    stream = engine.stream(a_prompts, 4, SAMPLED)
    pieces = [next(stream), next(stream)]  # prefill and one cycle, then paused
    engine.tree = OTHER_TREE  # settings of later calls; the paused call keeps its own
    mid_c = engine.generate(b_prompts, 3, SAMPLED)
    mid_b = engine.generate(b_prompts, 7, speculative=False)
    pieces += list(stream)
    out_a = stream.output

    for alone, mid in ((alone_a, out_a), (alone_b, mid_b), (alone_c, mid_c)):
        assert mid.tokens == alone.tokens
        # max_new_tokens is per call: a later call's larger value must not turn A's
        # "max_new_tokens" into "max_length".
        assert mid.stop_reasons == alone.stop_reasons
        assert mid.stats.accepted_histogram == alone.stats.accepted_histogram
        assert mid.stats.graph_status == "eager (not a CUDA device)"
    assert out_a.stop_reasons == ["max_new_tokens"] * 2
    assert [sum((p[b] for p in pieces), []) for b in range(2)] == out_a.tokens
    assert engine.last_output is out_a  # the call that finished last


def test_stream_output_is_available_only_once_exhausted(models, gen):
    target, head = models
    stream = Engine(target, head, TREE).stream(_prompts(gen, [3]), 3)
    next(stream)
    with pytest.raises(RuntimeError, match="exhausted"):
        stream.output
    list(stream)
    assert len(stream.output.tokens[0]) == 3


def test_stream_checks_its_arguments_before_the_first_item(models):
    target, head = models
    with pytest.raises(ValueError, match="max_new_tokens"):
        Engine(target, head, TREE).stream([[1, 2]], 0)


def test_stream_leaves_the_callers_autograd_mode_alone(models, gen):
    target, head = models
    stream = Engine(target, head, TREE).stream(_prompts(gen, [3]), 4)
    next(stream)
    assert not torch.is_inference_mode_enabled()
    assert torch.ones(1, requires_grad=True).mul(2).requires_grad
    list(stream)


def _fake_capture(record):
    """A CPU stand-in for GraphedStep.try_capture with the same effects on the call's state."""

    def try_capture(fn, inputs, mutable_state, warmup=2):
        record.append([t.clone() for t in inputs])
        saved = [t.clone() for t in mutable_state]
        static_inputs = [t.clone() for t in inputs]
        for _ in range(warmup):
            fn(*static_inputs)
        for tensor, value in zip(mutable_state, saved):
            tensor.copy_(value)
        return None, "eager (fake capture declined)"

    return try_capture


@pytest.mark.parametrize("speculative", [True, False])
def test_graph_capture_leaves_the_seeded_random_stream_alone(models, gen, monkeypatch,
                                                            speculative):
    """One seed samples the same tokens with and without CUDA graphs (both as on a CUDA
    device), also when every sequence has a context draft, which an eager loop could verify in
    place of a cycle's tree: a sampling call does not there (the chain draws its uniforms)."""
    from eagle_kernels.runtime import lookup

    target, head = models
    prompts = _prompts(gen, [5, 3])
    monkeypatch.setattr(lookup.ContextIndex, "propose",  # a draft for every row, every time
                        lambda self, row, limit, min_ngram=2: [7, 8, 9][:limit])
    engine_off = Engine(target, head, TREE, cuda_graphs=False)
    monkeypatch.setattr(engine_off, "_graph_plan",  # as on a CUDA device, cuda_graphs=False
                        lambda cuda_graphs=None: None if cuda_graphs else "eager (off)")
    eager = engine_off.generate(prompts, 6, SAMPLED, speculative=speculative)
    engine = Engine(target, head, TREE, cuda_graphs=True)
    captured = []
    monkeypatch.setattr(engine, "_graph_plan", lambda cuda_graphs=None: None)  # a CUDA device
    monkeypatch.setattr(generation.GraphedStep, "try_capture",
                        staticmethod(_fake_capture(captured)))
    graphed = engine.generate(prompts, 6, SAMPLED, speculative=speculative)
    assert len(captured) == 1, "the capture path did not run"
    assert graphed.stats.graph_status == "eager (fake capture declined)"
    assert engine.graph_status == "eager (fake capture declined)"
    assert graphed.tokens == eager.tokens
    assert graphed.stats.accepted_histogram == eager.stats.accepted_histogram


def test_graph_status_says_why_the_loop_ran_eagerly(models, monkeypatch):
    target, head = models
    engine = Engine(target, head, TREE, cuda_graphs=False)
    assert engine.graph_status == "no call has finished yet"
    monkeypatch.setattr(type(engine), "device", property(lambda self: torch.device("cuda")))
    assert engine._graph_plan() == "eager (cuda_graphs=False)"
    engine.cuda_graphs = True
    assert engine._graph_plan() is None


def test_causal_mask_cache_stays_bounded():
    for count in range(1, 3 * drafting.CAUSAL_MASK_CACHE_SIZE + 1):
        mask = drafting.causal_tree_mask(2, count, "cpu")
    assert drafting._packed_causal_mask.cache_info().currsize <= drafting.CAUSAL_MASK_CACHE_SIZE
    dense = unpack_tree_mask(mask, count)
    assert torch.equal(dense, torch.tril(torch.ones(count, count, dtype=torch.bool))
                       .expand(2, -1, -1))
    mask.fill_(0)  # a caller writing to its mask must not corrupt the cached one
    assert torch.equal(unpack_tree_mask(drafting.causal_tree_mask(1, count, "cpu"), count)[0],
                       dense[0])
