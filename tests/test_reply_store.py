"""The reply store (runtime/reply_store.py): its draft rule, its file and the checks on it, and
speculative calls that draft from it in their plain steps: output equal to plain decoding token
for token (greedy, batches with EOS cuts and budgets, and sampling with top_k = 1), the store's
drafts counted, and none with prompt_lookup off or in a cycle of the head's tree."""

from __future__ import annotations

import pytest
import torch

from eagle_kernels.runtime import Engine, SamplingConfig
from eagle_kernels.runtime.api import DEFAULT_REPLY_STORE
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.reply_store import STORE_MIN_COUNT, STORE_MIN_SHARE, ReplyStore
from runtime_helpers import tiny_target
from test_lookup import plain_policy


@pytest.fixture(scope="module")
def target():
    return tiny_target(seed=5)


def test_the_longest_match_drafts_its_most_frequent_follower_seen_often_enough():
    rows = [[9, 2, 3, 5]] * 12 + [[7, 2, 3, 6]] * 2 + [[1, 2, 3, 4]]
    store = ReplyStore(rows + [[8, 8, 8]], 10)
    assert store.draft([0, 2, 3]) == [5]  # (2, 3): 5 twelve times of 15
    assert store.draft([9, 2, 3]) == [5]  # (9, 2, 3): 5 every time
    assert store.draft([7, 2, 3]) == [6]  # the longest match wins over the commoner short one
    assert store.draft([1, 2, 3]) == []  # ... also when it drafts nothing: 4 once only
    assert store.draft([3]) == [] and store.draft([]) == []  # one-token matches draft nothing
    assert store.draft([8, 8]) == []  # (8, 8) followed by 8 once: below STORE_MIN_COUNT
    assert len(store) == 63


def test_share_and_count_thresholds_and_ties():
    assert STORE_MIN_SHARE == 0.8 and STORE_MIN_COUNT == 2  # the cases below are built on them
    assert ReplyStore([[4, 5, 2]] * 2, 10).draft([4, 5]) == [2]  # 2 of 2
    assert ReplyStore([[4, 5, 2]], 10).draft([4, 5]) == []  # once only
    many = [[4, 5, 2]] * 8 + [[4, 5, 3]] * 2  # 8 of 10 = STORE_MIN_SHARE
    assert ReplyStore(many, 10).draft([4, 5]) == [2]
    assert ReplyStore(many + [[4, 5, 1]], 10).draft([4, 5]) == []  # 8 of 11
    tied = ReplyStore([[4, 5, 3]] * 2 + [[4, 5, 2]] * 2, 10)
    assert tied.followers[(4, 5)] == (2, 2, 0.5)  # the smaller id holds a tie


def test_a_saved_store_loads_back_and_a_bad_file_is_refused_by_name(tmp_path):
    from safetensors.torch import save_file

    store = ReplyStore([[1, 2, 3, 1, 2, 4], [], [2, 3]], 10, "test replies")
    store.save(tmp_path / "s.safetensors")
    loaded = ReplyStore.load(tmp_path / "s.safetensors", 10)
    assert loaded.replies == store.replies and loaded.source == "test replies"
    assert loaded.followers == store.followers
    with pytest.raises(ValueError, match="made for a vocabulary of 10 tokens, the target has 11"):
        ReplyStore.load(tmp_path / "s.safetensors", 11)
    tokens = torch.tensor([1, 2, 3], dtype=torch.int32)
    for name, tensors in {"offsets": {"tokens": tokens, "offsets": torch.tensor([0, 2])},
                          "expected tensors": {"tokens": tokens}}.items():
        save_file(tensors, str(tmp_path / "bad.safetensors"), metadata={"vocab_size": "10"})
        with pytest.raises(ValueError, match=name):
            ReplyStore.load(tmp_path / "bad.safetensors", 10)
    save_file({"tokens": tokens.float(), "offsets": torch.tensor([0, 3])},
              str(tmp_path / "bad.safetensors"), metadata={"vocab_size": "10"})
    with pytest.raises(ValueError, match="expected int32 / int64 tokens"):
        ReplyStore.load(tmp_path / "bad.safetensors", 10)
    save_file({"tokens": tokens * 5, "offsets": torch.tensor([0, 3])},
              str(tmp_path / "bad.safetensors"), metadata={"vocab_size": "10"})
    with pytest.raises(ValueError, match=r"bad.safetensors: token ids must lie in \[0, 10\)"):
        ReplyStore.load(tmp_path / "bad.safetensors", 10)
    with pytest.raises(ValueError, match=r"replies: token ids must lie in \[0, 10\), got 10"):
        ReplyStore([[1, 10]], 10)
    with pytest.raises(TypeError, match=r"replies\[1\]: expected a sequence"):
        ReplyStore([[1], "ab"], 10)
    with pytest.raises(ValueError, match="vocab_size"):
        ReplyStore([[1]], 0)


def test_the_engine_refuses_a_store_it_cannot_draft_from(target):
    engine = Engine(target, new_draft_head(EAGLE3, target), reply_store="store.safetensors")
    with pytest.raises(TypeError, match="reply_store: expected a ReplyStore or None, got str"):
        engine.generate([[1, 2]], 4)
    engine.reply_store = ReplyStore([[1, 2]], target.vocab_size + 1)
    with pytest.raises(ValueError, match=f"reply_store: expected a store of the target's "
                                         f"{target.vocab_size}-token vocabulary"):
        engine.generate([[1, 2]], 4)


def test_a_row_with_room_for_one_token_or_a_pause_takes_no_store_draft():
    """A draft needs room for itself and the step's own token: a row that may record one more
    token gets none (the store would draft for it), the others theirs."""
    from types import SimpleNamespace

    from eagle_kernels.runtime.calls import GenerationStats
    from eagle_kernels.runtime.lookup import ContextDrafts

    call = SimpleNamespace(generated=torch.tensor([0, 0, 0]), out=torch.zeros(3, 10),
                           done=torch.tensor([False, False, False]),
                           budgets=torch.tensor([10, 1, 2]), stats=GenerationStats("x"))
    store = ReplyStore([[5, 6, 7]] * 2, 10)
    context = ContextDrafts(call, [[5, 6], [5, 6], [5, 6]], store=store)
    # row 1 may record one token (its step's own); rows 0 and 2 have room for a draft too
    assert context.propose() == [[7], [], [7]] and context.store_rows == [0, 2]
    assert call.stats.store_steps == 1
    context.paused = 2  # drafts found to lose: the store's pause with the context's
    assert context.propose() == [[], [], []] and context.store_rows == []
    assert call.stats.store_steps == 1


def test_the_bundled_store_is_the_default_targets():
    store = ReplyStore.load(DEFAULT_REPLY_STORE, 49152)
    assert len(store.replies) >= 1000 and "sharegpt" in store.source
    assert store.followers  # drafts something


def store_of(target, prompts, seed: int) -> ReplyStore:
    """The target's own plain replies to ``prompts``, once as they are and four times with
    about a third of their tokens changed: after unchanged n-grams a changed token follows 4
    times in 5 (enough to draft), so the store drafts right in some steps and wrong in others."""
    replies = Engine(target).generate(prompts, 30, speculative=False).tokens
    gen = torch.Generator().manual_seed(seed)
    changed = []
    for reply in replies:
        tokens = torch.tensor(reply)
        hit = torch.rand(len(reply), generator=gen) < 1 / 3
        changed.append(torch.where(hit, (tokens + 1) % target.vocab_size, tokens).tolist())
    return ReplyStore(replies + changed * 4, target.vocab_size)


def varied_prompts(seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 20, (n,), generator=gen).tolist() for n in (4, 9, 6)]


@pytest.mark.parametrize("max_new_tokens,eos", [(30, False), (30, True), (9, False)])
def test_store_drafts_keep_plain_greedy_output(target, max_new_tokens, eos):
    prompts = varied_prompts(1)
    plain = Engine(target).generate(prompts, 30, speculative=False).tokens
    eos_ids = [plain[1][5]] if eos else []  # a token the store drafts (row 1's reply)
    reference = Engine(target).generate(prompts, max_new_tokens, eos_token_ids=eos_ids,
                                        speculative=False)
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0),
                    reply_store=store_of(target, prompts, 2))
    out = engine.generate(prompts, max_new_tokens, eos_token_ids=eos_ids)
    assert out.tokens == reference.tokens and out.stop_reasons == reference.stop_reasons
    stats = out.stats
    assert stats.store_steps > 0 and 0 < stats.store_accepted <= stats.lookup_accepted, \
        stats.summary()
    assert stats.store_steps <= stats.lookup_steps <= stats.plain_steps == stats.cycles
    engine.prompt_lookup = False  # the store drafts only with the context's lookups on
    off = engine.generate(prompts, max_new_tokens, eos_token_ids=eos_ids)
    assert off.tokens == reference.tokens and off.stats.lookup_steps == 0
    assert off.stats.store_steps == 0


def test_sampling_with_top_k_1_verifies_store_drafts_to_the_greedy_tokens(target):
    prompts = varied_prompts(3)
    greedy = Engine(target).generate(prompts, 25, speculative=False).tokens
    engine = Engine(target, new_draft_head(EAGLE3, target), tree_policy=plain_policy(0.0),
                    reply_store=store_of(target, prompts, 4))
    out = engine.generate(prompts, 25, sampling=SamplingConfig(temperature=0.8, top_k=1, seed=1))
    assert out.tokens == greedy
    assert out.stats.store_steps > 0 and out.stats.lookup_accepted > 0, out.stats.summary()


def test_cycles_of_the_tree_take_no_store_drafts(target):
    """A speculative call with a fixed tree (no tree budget: it never decodes plainly) and a
    store holding its own prompts and outputs twice (a draft after every prefix of 2+
    tokens): its cycles draft the head's tree, never the store's token."""
    prompts = varied_prompts(5)
    reference = Engine(target).generate(prompts, 12, speculative=False).tokens
    seen = [prompt + reply for prompt, reply in zip(prompts, reference)] * 2
    engine = Engine(target, new_draft_head(EAGLE3, target), prompt_lookup=True,
                    reply_store=ReplyStore(seen, target.vocab_size))
    out = engine.generate(prompts, 12)
    assert out.tokens == reference
    assert out.stats.store_steps == 0 and out.stats.cycles > 0 and not out.stats.plain_steps
