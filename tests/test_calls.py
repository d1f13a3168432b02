"""What a generate / stream call takes and fixes when it starts: its arguments refused by name
(prompts in an order, a SamplingConfig, a temperature float32 can divide by, a max_length the
target can run), the engine settings it runs with, the shared tree budget left alone by a call
that is refused, the caller's random stream left alone by an unseeded one (tiny targets, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from eagle_kernels.runtime import Engine, SamplingConfig, TreeConfig, drafting
from eagle_kernels.runtime.calls import MIN_TEMPERATURE
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.tree_budget import AdaptiveTree, CycleCost
from runtime_helpers import oracle_head, tiny_target

TREE = TreeConfig(top_k=4, depth=3, total_tokens=16)
PROMPT = [5, 17, 42, 7, 99, 3]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def head(target):
    return new_draft_head(EAGLE3, target, seed=3)


# ----------------------------------------------------------------------------- sampling
def test_a_temperature_float32_cannot_divide_by_is_refused(target, head):
    """Regression: 1e-40 (an fp32 subnormal) sent logits / T to inf and softmax to NaN; both
    modes returned token 0 every step, silently (the loop runs with value checks off)."""
    for tiny in (1e-40, 1e-9, MIN_TEMPERATURE / 2):
        with pytest.raises(ValueError, match=r"temperature: expected 0 \(greedy\) or >= 1e-06 "
                                             r".*got " + repr(tiny)):
            SamplingConfig(temperature=tiny)
    greedy = Engine(target).generate([PROMPT], 8, speculative=False).tokens
    engine = Engine(target, head, TREE)
    coldest = SamplingConfig(temperature=MIN_TEMPERATURE, seed=1)
    for speculative in (False, True):  # as cold as allowed: the argmax, finite all the way
        assert engine.generate([PROMPT], 8, coldest, speculative=speculative).tokens == greedy


@pytest.mark.parametrize("sampling", [0, {}, "greedy", 0.7])
def test_sampling_must_be_a_sampling_config_or_none(target, sampling):
    """0 and {} read as greedy (``sampling or SamplingConfig()``); a float failed later with
    an AttributeError naming nothing."""
    with pytest.raises(TypeError, match=r"sampling: expected a SamplingConfig or None \(greedy\), "
                                        f"got {type(sampling).__name__}"):
        Engine(target).generate([PROMPT], 2, sampling, speculative=False)
    assert Engine(target).generate([PROMPT], 2, None, speculative=False).stats.new_tokens == [2]


@pytest.mark.parametrize("speculative", [False, True])
def test_an_unseeded_call_leaves_the_global_random_stream_alone(target, head, speculative):
    """seed=None drew the call's seed from torch's global generator, shifting the caller's
    own random stream by every call."""
    engine = Engine(target, head, TREE)
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    engine.generate([PROMPT], 6, SamplingConfig(temperature=1.0), speculative=speculative)
    assert torch.equal(torch.rand(4), expected)


# ------------------------------------------------------------------------------ prompts
def test_prompts_in_no_order_are_refused(target):
    """A set's order is arbitrary: as a prompt (or as the batch) it gave arbitrary output.
    EOS ids, whose order means nothing, may be a set."""
    engine = Engine(target)
    with pytest.raises(TypeError, match=r"prompts\[0\]: expected a sequence of token ids, "
                                        r"got set"):
        engine.generate([{1, 2, 3}], 2, speculative=False)
    with pytest.raises(TypeError, match=r"prompts\[0\]: .* got frozenset"):
        engine.generate([frozenset({1, 2})], 2, speculative=False)
    with pytest.raises(TypeError, match=r"prompts: expected a sequence of token lists, got set"):
        engine.generate({(1, 2, 3)}, 2, speculative=False)
    out = engine.generate([PROMPT], 3, eos_token_ids={299, 298}, speculative=False)
    assert out.stats.new_tokens[0] >= 1


def test_an_empty_prompt_is_named_by_its_index(target):
    """One empty prompt in a batch was reported as "at least one non-empty token list", as if
    all were empty; the index of the empty one says which."""
    engine = Engine(target)
    with pytest.raises(ValueError, match=r"prompts\[1\]: expected a non-empty token list"):
        engine.generate([PROMPT, []], 2, speculative=False)
    with pytest.raises(ValueError, match=r"prompts: expected at least one .* got none"):
        engine.generate([], 2, speculative=False)


# --------------------------------------------------------------------- engine settings
class Poisoned:
    """An engine setting changed after a call started: any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"the call used an engine setting changed after it started "
                             f"(.{name})")


def test_a_stream_runs_with_the_settings_it_started_with(target, head, monkeypatch):
    """Engine.stream's loop is a generator: the head, the CUDA-graph plan and the tree budget
    were read at its first next(), so a set_tree (or a new head) between stream() and the
    first item applied to a call already started (a graph planned for a tree policy the call
    does not use). They are fixed when the call starts."""
    engine = Engine(target, head, TREE, prompt_lookup=False)
    want = Engine(target).generate([PROMPT], 12, speculative=False).tokens
    stream = engine.stream([PROMPT], 12)
    engine.head, engine.tree_policy, engine.cuda_graphs = Poisoned(), Poisoned(), Poisoned()
    engine.tree = TreeConfig(1, 0, 2)
    monkeypatch.setattr(engine, "_graph_plan", lambda cuda_graphs=None: Poisoned().plan)
    items = list(stream)
    assert [token for item in items for token in item[0]] == want[0]
    assert stream.output.tokens == want
    assert set(stream.output.stats.tree_cycles) == {"4/3/16"}


def test_a_stream_keeps_the_tree_budget_it_started_with(target, head):
    """A stream started under set_tree("auto")'s policy keeps timing and adapting with it
    after the engine's policy is reset (set_tree(None) before the first item)."""
    policy = AdaptiveTree({TREE: CycleCost(0.004, 0.01)}, prior_alpha=0.9, step_seconds=0.1)
    engine = Engine(target, head, tree_policy=policy, prompt_lookup=False)
    stream = engine.stream([PROMPT], 12)
    engine.tree_policy, engine.tree = None, TreeConfig(1, 0, 2)
    list(stream)
    assert stream.output.stats.tree_cycles.get("4/3/16") == stream.output.stats.cycles
    assert len(policy.history) == stream.output.stats.cycles  # observed by the call's policy
    assert policy._cycle_timings.get(TREE)  # and timed by it


def test_a_refused_call_leaves_the_tree_budget_untouched(target, head, monkeypatch):
    """The call told the shared policy it started (call count, batch, re-picked tree) before
    allocating its cache; a call refused there (out of memory) left the policy changed."""
    policy = AdaptiveTree({TREE: CycleCost(0.004, 0.01)}, prior_alpha=0.9, step_seconds=0.1,
                          online_timing=False)
    engine = Engine(target, head, tree_policy=policy)
    before = copy.deepcopy(vars(policy))

    def out_of_memory(batch, max_len, used=None):
        raise MemoryError("no room for the cache")

    monkeypatch.setattr(target, "allocate_cache", out_of_memory)
    with pytest.raises(MemoryError):
        engine.generate([PROMPT, PROMPT], 4)
    assert vars(policy) == before


def test_a_causal_mask_is_never_the_cached_tensor():
    """At batch 1 ``expand(1, ...).contiguous()`` returned the cached mask itself: writable by
    the caller, and, built first under inference_mode, an inference tensor everywhere."""
    drafting._packed_causal_mask.cache_clear()
    with torch.inference_mode():
        drafting.causal_tree_mask(1, 37, "cpu")
    for batch in (1, 3):
        mask = drafting.causal_tree_mask(batch, 37, "cpu")
        assert not mask.is_inference() and mask.is_contiguous()
        mask.zero_()
    assert drafting.causal_tree_mask(1, 37, "cpu").any()


# ----------------------------------------------------------------------- length limits
def test_max_length_past_the_position_limit_warns(gen):
    """A max_length beyond max_position_embeddings was taken silently; it runs (RoPE takes
    any position; YaRN configs keep the unscaled limit there), with a warning naming it."""
    target = tiny_target()
    target.config.max_position_embeddings = 32
    prompt = torch.randint(0, 299, (28,), generator=gen).tolist()
    engine = Engine(target)
    with pytest.warns(UserWarning, match="max_length: 64 lets prompt \\+ new tokens reach 36 "
                                         "positions, past the target's "
                                         "max_position_embeddings 32"):
        out = engine.generate([prompt], 8, max_length=64, speculative=False)
    assert out.stats.new_tokens == [8]
    default = engine.generate([prompt], 8, speculative=False)  # stops at the limit, quietly
    assert default.stop_reasons == ["max_length"] and default.tokens[0] == out.tokens[0][:4]


@pytest.fixture(scope="module")
def mistral():
    """A 7-layer Mistral (an EAGLE-3 head needs 7) with a 64-token sliding window."""
    from transformers import MistralConfig

    from eagle_kernels.runtime.model import TargetModel

    config = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=256, sliding_window=64, eos_token_id=299)
    torch.manual_seed(11)
    model = TargetModel(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def test_a_sliding_window_limits_prompt_and_output_not_the_cache(mistral, gen):
    """The window check counted the cache's room for a verify tree past prompt + budget, so
    a call whose tokens fit the window was refused (40 + 20 < 64 asked a 127-entry cache);
    by default a call now stops at the window, and an explicit max_length that lets prompt +
    output pass it is refused by name."""
    prompt = torch.randint(0, 299, (40,), generator=gen).tolist()
    plain = Engine(mistral).generate([prompt], 24, speculative=False)
    assert plain.stop_reasons == ["max_new_tokens"] and len(plain.tokens[0]) == 24
    head = oracle_head(mistral, [prompt + plain.tokens[0]])
    head.hit_rate = 1.0  # long accepted paths: trees written past the window's last position
    spec = Engine(mistral, head, TREE).generate([prompt], 24)
    assert spec.tokens == plain.tokens and max(spec.stats.accepted_histogram[1:]) > 0
    longer = Engine(mistral).generate([prompt], 200, speculative=False)
    assert longer.stop_reasons == ["max_length"] and longer.tokens[0] == plain.tokens[0]
    with pytest.raises(ValueError, match="max_length: expected <= 64, the target's "
                                         "sliding_window .* got 100"):
        Engine(mistral).generate([prompt], 200, speculative=False, max_length=100)
