"""Training forward passes (runtime/training.py), data rendering and the training CLI (train.py).

The training-time-test (TTT) mask is checked against an element-by-element construction, the
mask-free attention against SDPA under that dense mask, and the whole TTT forward against the
runtime's own drafting path (cache + packed tree mask): step i at position p must be exactly
the depth-i chain node drafted after committing positions 0..p. Losses must fall on a tiny set,
and an interrupted training run resumed must end where an uninterrupted one does.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from eagle_kernels.data import draft_vocabulary, render_conversation, sharegpt_messages
from eagle_kernels.ops.reference import pack_tree_mask
from eagle_kernels.runtime import training
from eagle_kernels.runtime.api import DEFAULT_HEAD
from eagle_kernels.runtime.draft_heads import EAGLE1, EAGLE3, load_draft_head, new_draft_head
from eagle_kernels.runtime.drafting import causal_tree_mask
from package_support import default_model_or_skip
from cpu_support import needs_cpu_backend
from runtime_helpers import tiny_target


@pytest.fixture(scope="module")
def target():
    model = tiny_target(seed=3)
    model.requires_grad_(False)
    return model


def random_batch(target, batch=2, length=23, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.vocab_size, (batch, length), generator=gen)
    mask = torch.rand(batch, length, generator=gen) < 0.8
    return ids, mask


def ttt_inputs(target, head, ids):
    hidden, features = training.target_pass(target, ids, head.feature_layers)
    logits, argmax = training.target_draft_logits(target, hidden, training.draft_vocab_ids(head))
    return features, logits, head.t2d[argmax]


# ------------------------------------------------------------------------------ mask


def test_ttt_dense_mask_matches_the_rule_element_by_element():
    length, steps = 5, 4
    mask = training.ttt_dense_mask(length, steps)
    for i in range(steps):
        for p in range(length):
            for j in range(steps):
                for q in range(length):
                    sees = (j == 0 and q <= p) or (1 <= j <= i and q == p)
                    assert bool(mask[i * length + p, j * length + q]) == sees, (i, p, j, q)


@pytest.mark.parametrize("steps", [1, 2, 5])
def test_ttt_attention_equals_sdpa_under_the_dense_mask(steps):
    gen = torch.Generator().manual_seed(steps)
    batch, heads, length, dim = 2, 3, 11, 16
    q = torch.randn(batch, heads, length, dim, generator=gen)
    keys = [torch.randn(batch, heads, length, dim, generator=gen) for _ in range(steps)]
    values = [torch.randn(batch, heads, length, dim, generator=gen) for _ in range(steps)]
    rows = training.ttt_dense_mask(length, steps)[(steps - 1) * length:]
    want = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                          attn_mask=rows)
    torch.testing.assert_close(training.ttt_attention(q, keys, values), want,
                               rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ TTT == drafting


def drafted_chain(head, features, ids, p, steps):
    """Head outputs of a chain drafted after committing positions 0..p (the runtime's path)."""
    cache = head.allocate_cache(1, ids.shape[1] + steps)
    pairs = p + 1
    out = head(ids[:, 1:pairs + 1], head.project(None, features[:, :pairs]),
               torch.arange(pairs).unsqueeze(0), cache, causal_tree_mask(1, pairs, ids.device))
    cache.lens += pairs
    outputs, hidden = [out[:, p]], out[:, p:p + 1]
    for step in range(1, steps):
        visible = torch.ones(1, 1, step, dtype=torch.bool)
        hidden = head(ids[:, p + 1 + step:p + 2 + step], hidden,
                      torch.tensor([[p + step]]), cache, pack_tree_mask(visible),
                      tree_offset=step - 1)
        outputs.append(hidden[:, 0])
    return outputs


def test_ttt_forward_equals_the_drafting_path(target):
    head = new_draft_head(EAGLE3, target, draft_vocab=200, seed=1).float()
    head.t2d[:200] = True
    ids, mask = random_batch(target, batch=1, length=19)
    features, logits, in_draft = ttt_inputs(target, head, ids)
    steps = 4
    result = training.eagle3_ttt_loss(head, features, ids, logits, in_draft, mask, steps=steps,
                                      keep_hidden=True)
    for p in (0, 5, 13):  # p + steps + 1 < length: every token of the chain exists
        chain = drafted_chain(head, features, ids, p, steps)
        for step in range(steps):
            torch.testing.assert_close(result.hidden[step][:, p], chain[step],
                                       rtol=1e-4, atol=1e-5, msg=f"step {step} position {p}")


def test_ttt_loss_is_the_weighted_sum_of_masked_soft_cross_entropies(target):
    head = new_draft_head(EAGLE3, target, draft_vocab=150, seed=2).float()
    head.d2t.copy_(torch.arange(150) * 2 - torch.arange(150))  # draft id i -> target id 2i
    head.t2d.zero_()
    head.t2d[torch.arange(150) * 2] = True
    ids, mask = random_batch(target, batch=2, length=17, seed=5)
    features, logits, in_draft = ttt_inputs(target, head, ids)
    result = training.eagle3_ttt_loss(head, features, ids, logits, in_draft, mask, steps=3,
                                      keep_hidden=True)
    total = 0.0
    for step, hidden in enumerate(result.hidden):
        draft = head.draft_logits(hidden)
        terms = []
        for b in range(2):
            for p in range(17 - 2 - step):
                if mask[b, p + 2 + step] and in_draft[b, p + 1 + step]:
                    y = logits[b, p + 1 + step]
                    terms.append(-(torch.softmax(y, -1) * torch.log_softmax(draft[b, p], -1)).sum())
        assert len(terms) == result.step_counts[step]
        total += 0.8 ** step * torch.stack(terms).mean()
    torch.testing.assert_close(result.loss, total, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_target_temperature_divides_the_target_logits_only(target, temperature):
    """The soft labels become softmax(y / T): the loss equals T = 1 on logits divided by T (the
    head's own logits untouched), and differs from T = 1 (the option reaches the loss)."""
    head = new_draft_head(EAGLE3, target, draft_vocab=150, seed=4).float()
    head.t2d[:150] = True
    ids, mask = random_batch(target, batch=2, length=15, seed=6)
    features, logits, in_draft = ttt_inputs(target, head, ids)
    scaled = training.eagle3_ttt_loss(head, features, ids, logits, in_draft, mask, steps=3,
                                      target_temperature=temperature)
    divided = training.eagle3_ttt_loss(head, features, ids, logits / temperature, in_draft,
                                       mask, steps=3)
    plain = training.eagle3_ttt_loss(head, features, ids, logits, in_draft, mask, steps=3)
    torch.testing.assert_close(scaled.loss, divided.loss, rtol=1e-6, atol=1e-6)
    assert scaled.step_accuracy == plain.step_accuracy  # the argmax is the same
    assert abs(float(scaled.loss.detach()) - float(plain.loss.detach())) > 1e-3


# ------------------------------------------------------------------------------ losses fall


def overfit(head, loss_fn, steps=40, lr=3e-3):
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def test_eagle3_loss_falls_on_a_tiny_set(target):
    head = new_draft_head(EAGLE3, target, seed=4).float().train()
    ids, mask = random_batch(target, batch=2, length=24, seed=7)
    features, logits, in_draft = ttt_inputs(target, head, ids)
    losses = overfit(head, lambda: training.eagle3_ttt_loss(head, features, ids, logits,
                                                            in_draft, mask, steps=3).loss)
    assert losses[-1] < 0.5 * losses[0], losses


def test_eagle1_loss_falls_on_a_tiny_set(target):
    head = new_draft_head(EAGLE1, target, seed=4).float().train()
    ids, mask = random_batch(target, batch=2, length=24, seed=8)
    hidden, _ = training.target_pass(target, ids)
    gen = torch.Generator().manual_seed(0)
    losses = overfit(head, lambda: training.eagle1_loss(head, target, hidden, ids, mask,
                                                        generator=gen)[0])
    assert losses[-1] < 0.5 * losses[0], losses


# ------------------------------------------------------------------------------ data


def test_draft_vocabulary_keeps_the_most_frequent_and_forced_tokens():
    counts = torch.tensor([5, 0, 9, 9, 1, 0, 3, 7])
    d2t, t2d = draft_vocabulary(counts, 4, always=[5])
    used = torch.arange(4) + d2t
    assert used.tolist() == [2, 3, 5, 7]  # 9, 9, forced, 7 (5 loses to the forced id)
    assert t2d.nonzero().squeeze(1).tolist() == used.tolist()
    d2t, _ = draft_vocabulary(torch.zeros(6), 3)  # all tied: the lowest ids
    assert (torch.arange(3) + d2t).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="draft vocabulary size"):
        draft_vocabulary(counts, 9)


def test_sharegpt_messages_accepts_only_alternating_chats():
    turn = lambda who, text="hi": {"from": who, "value": text}  # noqa: E731
    assert sharegpt_messages({"conversations": [turn("human"), turn("gpt")]}) == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}]
    for bad in ([turn("gpt"), turn("human")], [turn("human"), turn("human")], [turn("human")],
                [turn("human"), turn("gpt", "  ")], [turn("human"), turn("robot")], []):
        assert sharegpt_messages({"conversations": bad}) is None


def default_tokenizer():
    """The default model's tokenizer; skips, saying why, where the default model is absent."""
    from transformers import AutoTokenizer

    from eagle_kernels.runtime.default_model import default_model_dir

    default_model_or_skip()
    return AutoTokenizer.from_pretrained(str(default_model_dir()), local_files_only=True)


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def test_render_conversation_masks_assistant_turns_only(tokenizer):
    messages = [{"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": "Another?"},
                {"role": "assistant", "content": "Green, of course."}]
    ids, mask = render_conversation(tokenizer, messages, max_length=512)
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == "Blue.<|im_end|>\nGreen, of course.<|im_end|>\n"
    assert "Name a colour" in tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    short_ids, short_mask = render_conversation(tokenizer, messages, max_length=10)
    assert short_ids == ids[:10] and short_mask == mask[:10]


# ------------------------------------------------------------------------------ CLI / resume


def train_config(out, **overrides):
    from eagle_kernels.train import TrainConfig

    settings = dict(out=str(out), conversations=6, max_length=48, batch_tokens=100, ttt_steps=2,
                    draft_vocab=4096, warmup_steps=2, save_every=100, lr=1e-3, export_dtype="float32")
    settings.update(overrides)
    return TrainConfig(**settings)


def test_training_resumes_where_it_stopped(tokenizer, tmp_path):
    from eagle_kernels.train import train

    target = tiny_target(seed=1, vocab=len(tokenizer))
    target.requires_grad_(False)
    whole = train(train_config(tmp_path / "whole"), target, tokenizer, progress=False)
    assert whole["finished"] and whole["steps_total"] >= 3
    first = train(train_config(tmp_path / "split", max_minutes=1e-9), target, tokenizer,
                  progress=False)
    assert first["steps_done"] == 1 and not first["finished"]
    second = train(train_config(tmp_path / "split"), target, tokenizer, progress=False)
    assert second["finished"]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "split" / "train_log.jsonl")]
    assert steps == list(range(1, whole["steps_total"] + 1))
    heads = [load_draft_head(tmp_path / name, target) for name in ("whole", "split")]
    for (name, a), b in zip(heads[0].state_dict().items(), heads[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    head = heads[0]
    assert head.lm_head.out_features == 4096
    assert bool(head.t2d[training.draft_vocab_ids(head)].all()) and int(head.t2d.sum()) == 4096
    assert bool(head.t2d[tokenizer.convert_tokens_to_ids("<|im_end|>")])
    config = json.load(open(tmp_path / "whole" / "config.json"))
    assert config["draft_vocab_size"] == 4096 and config["architectures"] == ["LlamaForCausalLMEagle3"]


def test_train_rejects_an_unknown_head_kind(tokenizer, tmp_path, target):
    from eagle_kernels.train import train

    with pytest.raises(ValueError, match="kind"):
        train(train_config(tmp_path, kind="medusa"), target, tokenizer, progress=False)


def test_train_config_refuses_what_it_would_ignore_or_fail_on_late(tmp_path):
    """Combinations that were ignored (a warm start of an EAGLE-1 run) or failed only after the
    target loaded (code prompts without regenerate, no data) are refused at once, by name."""
    for overrides, message in (({"kind": "eagle1", "init_from": str(tmp_path)},
                                "init_from: warm starts take an EAGLE-3 head"),
                               ({"code_prompts": 2}, "code_prompts: .*need regenerate"),
                               ({"conversations": 0}, "conversations: expected training data")):
        with pytest.raises(ValueError, match=message):
            train_config(tmp_path, **overrides)


@pytest.mark.skipif(not (DEFAULT_HEAD / "config.json").is_file(), reason="no bundled head")
def test_bundled_head_is_small_official_and_loads(tokenizer):
    from safetensors import safe_open

    from eagle_kernels.runtime.default_model import default_model_dir
    from eagle_kernels.runtime.model import load_target

    assert (DEFAULT_HEAD / "model.safetensors").stat().st_size <= 25 * 2 ** 20
    with safe_open(str(DEFAULT_HEAD / "model.safetensors"), "pt") as handle:
        keys = set(handle.keys())
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "lm_head.weight",
            "d2t", "t2d"} <= keys
    config = json.load(open(DEFAULT_HEAD / "config.json"))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    head = load_draft_head(DEFAULT_HEAD, load_target(default_model_dir()))
    assert bool(head.t2d[tokenizer.convert_tokens_to_ids("<|im_end|>")])
    assert int(head.t2d.sum()) == config["draft_vocab_size"]


def test_regenerate_replaces_assistant_turns_with_the_targets_replies(tokenizer):
    from eagle_kernels.runtime.generation import Engine
    from eagle_kernels.train import regenerate

    target = tiny_target(seed=2, vocab=len(tokenizer))
    chats = [[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "old"},
              {"role": "user", "content": "More"}, {"role": "assistant", "content": "old"}],
             [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "x"}]]
    config = train_config("unused", max_length=100, regenerate_batch=2, regenerate_max_new=8)
    new = regenerate(target, tokenizer, chats, config, progress=False)
    assert [m["role"] for m in new[0]] == ["user", "assistant", "user", "assistant"]
    assert new[0][2] == chats[0][2] and len(new[1]) == 2
    # The first reply is exactly the target's greedy continuation of the first user turn.
    prompt = tokenizer.apply_chat_template(chats[0][:1], add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    want = Engine(target).generate([prompt], 8, speculative=False,
                                   eos_token_ids=[tokenizer.eos_token_id]).tokens[0]
    want = tokenizer.decode([t for t in want if t != tokenizer.eos_token_id])
    assert new[0][1]["content"] == want and want != "old"


def test_code_prompts_join_the_chats_answered_by_the_target(tokenizer):
    """--code-prompts N: N stdlib stubs after the ShareGPT conversations, each a user turn and
    the target's reply (they come without one, so regenerate is required)."""
    from eagle_kernels.data import code_prompts
    from eagle_kernels.train import build_dataset, dataset_key, selected_code_prompts

    target = tiny_target(seed=2, vocab=len(tokenizer))
    with pytest.raises(ValueError, match="regenerate"):
        build_dataset(tokenizer, train_config("unused", code_prompts=2), progress=False)
    with pytest.raises(ValueError, match="both 0"):
        build_dataset(tokenizer, train_config("unused", conversations=0), progress=False)
    config = train_config("unused", conversations=0, code_prompts=2, regenerate=True,
                          max_length=400, regenerate_max_new=4, regenerate_batch=2)
    examples, counts = build_dataset(tokenizer, config, progress=False, target=target)
    assert len(examples) == 2 and int(counts.sum()) > 0
    fresh = train_config("unused", code_prompts=2, skip_code_prompts=1, regenerate=True)
    assert selected_code_prompts(fresh) == code_prompts(3)[1:]  # a warm start's next prompts
    assert dataset_key(fresh, tokenizer, target) != dataset_key(
        train_config("unused", code_prompts=2, regenerate=True), tokenizer, target)
    for (ids, mask), prompt in zip(examples, code_prompts(2)):
        text = tokenizer.decode(ids[~mask])
        assert prompt.strip().splitlines()[0] in text  # the stub is the user turn
        assert 0 < int(mask.sum()) <= 4 + 2  # the reply: at most 4 tokens + end of turn


# ------------------------------------------------------------------------------ faster training


@needs_cpu_backend
def test_target_cache_changes_the_speed_not_the_training(tokenizer, tmp_path):
    """Two epochs with the target's outputs cached end bit for bit where recomputing them every
    step ends (the cpu backend is row-invariant: an example's outputs do not depend on the
    batch it is padded into), and the second run reads the cache instead of refilling it."""
    from eagle_kernels.train import CACHE_DIR, train

    target = tiny_target(seed=4, vocab=len(tokenizer))
    target.requires_grad_(False)
    runs = {}
    for name, cache in (("recompute", False), ("cached", True)):
        config = train_config(tmp_path / name, epochs=2, cache_target=cache)
        assert train(config, target, tokenizer, progress=False)["finished"]
        runs[name] = load_draft_head(tmp_path / name, target).state_dict()
    for key, value in runs["recompute"].items():
        torch.testing.assert_close(runs["cached"][key], value, rtol=0, atol=0, msg=key)
    files = sorted((tmp_path / "cached" / CACHE_DIR).glob("*.safetensors"))
    assert len(files) == 6
    stamps = [f.stat().st_mtime_ns for f in files]
    train(train_config(tmp_path / "again", epochs=2, cache_target=True,
                       data_dir=str(tmp_path / "cached")), target, tokenizer, progress=False)
    assert [f.stat().st_mtime_ns for f in files] == stamps  # reused, not recomputed


def test_target_cache_is_rebuilt_for_another_target(tokenizer, tmp_path):
    from eagle_kernels.train import CACHE_DIR, train

    runs = []
    for seed in (5, 6):
        target = tiny_target(seed=seed, vocab=len(tokenizer))
        target.requires_grad_(False)
        train(train_config(tmp_path / f"out{seed}", data_dir=str(tmp_path / "data"),
                           cache_target=True, prepare_only=True), target, tokenizer,
              progress=False)
        from safetensors.torch import load_file
        runs.append(load_file(str(tmp_path / "data" / CACHE_DIR / "000000.safetensors")))
    assert not torch.equal(runs[0]["features"], runs[1]["features"])


def test_warm_start_trains_on_from_the_given_head(tokenizer, tmp_path):
    """--init-from: step 1 starts from that head's weights and draft vocabulary, not a new one;
    --skip-conversations gives it conversations the first run did not see."""
    from eagle_kernels.train import build_dataset, init_head, train

    target = tiny_target(seed=7, vocab=len(tokenizer))
    target.requires_grad_(False)
    train(train_config(tmp_path / "first"), target, tokenizer, progress=False)
    first = load_draft_head(tmp_path / "first", target)
    warm = init_head(EAGLE3, target, torch.zeros(len(tokenizer)), 4096, [], 0,
                     init_from=str(tmp_path / "first"))
    for key, value in first.float().state_dict().items():
        torch.testing.assert_close(warm.state_dict()[key], value, rtol=0, atol=0, msg=key)
    assert warm.training and next(warm.parameters()).dtype == torch.float32
    more = train(train_config(tmp_path / "second", init_from=str(tmp_path / "first"),
                              skip_conversations=6), target, tokenizer, progress=False)
    assert more["finished"]
    assert torch.equal(load_draft_head(tmp_path / "second", target).t2d, first.t2d)
    seen, _ = build_dataset(tokenizer, train_config("unused", conversations=8), progress=False)
    fresh, _ = build_dataset(tokenizer, train_config("unused", conversations=2,
                                                     skip_conversations=6), progress=False)
    assert [e[0].tolist() for e in fresh] == [e[0].tolist() for e in seen[6:]]


def test_warm_start_rejects_an_eagle1_head(tmp_path, target):
    from eagle_kernels.runtime.draft_heads import save_draft_head
    from eagle_kernels.train import warm_start_head

    save_draft_head(new_draft_head(EAGLE1, target), tmp_path)
    with pytest.raises(ValueError, match="init_from: expected an EAGLE-3 head"):
        warm_start_head(str(tmp_path), target)


def test_ttt_steps_follow_the_depth_the_device_drafts(tokenizer, tmp_path):
    from eagle_kernels.train import CPU_TTT_STEPS, default_ttt_steps, train
    from eagle_kernels.runtime.tree_budget import CANDIDATE_TREES

    assert default_ttt_steps("cuda") == training.TTT_STEPS == 7
    assert default_ttt_steps("cpu") == CPU_TTT_STEPS
    # The CPU's small trees (<= 12 nodes, the ones a compute-bound verify affords) are drafted
    # within CPU_TTT_STEPS steps.
    assert max(t.depth for t in CANDIDATE_TREES if t.total_tokens <= 12) + 1 <= CPU_TTT_STEPS
    target = tiny_target(seed=8, vocab=len(tokenizer))
    target.requires_grad_(False)
    train(train_config(tmp_path, ttt_steps=0), target, tokenizer, progress=False)
    record = json.loads(open(tmp_path / "train_log.jsonl").readline())
    assert len(record["step_loss"]) == CPU_TTT_STEPS and record["seconds"] > 0


@pytest.mark.parametrize("steps", [1, 3])
def test_ttt_attention_gradients_equal_sdpa_under_the_dense_mask(steps):
    """The mask-free attention must train like the dense-mask one: same gradients in q, every
    step's keys and values (an error in the causal bias or the merged softmax shows here)."""
    gen = torch.Generator().manual_seed(10 + steps)
    batch, heads, length, dim = 2, 3, 9, 8
    def leaves():
        g = torch.Generator().manual_seed(20 + steps)
        make = lambda: torch.randn(batch, heads, length, dim, generator=g, dtype=torch.float64,
                                   requires_grad=True)
        return make(), [make() for _ in range(steps)], [make() for _ in range(steps)]
    weight = torch.randn(batch, heads, length, dim, generator=gen, dtype=torch.float64)
    rows = training.ttt_dense_mask(length, steps)[(steps - 1) * length:]
    grads = []
    for dense in (True, False):
        q, keys, values = leaves()
        out = (F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                              attn_mask=rows)
               if dense else training.ttt_attention(q, keys, values))
        (out * weight).sum().backward()
        grads.append([q.grad, *(k.grad for k in keys), *(v.grad for v in values)])
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_turns_keeps_the_first_exchanges():
    from eagle_kernels.train import first_exchanges

    chat = [{"role": r, "content": str(i)} for i, r in
            enumerate(["user", "assistant", "user", "assistant", "user"])]
    assert first_exchanges(chat, 1) == chat[:2]
    assert first_exchanges(chat, 2) == chat[:4]
    assert first_exchanges(chat, 5) == chat


def test_a_step_with_no_trainable_position_logs_null_not_nan(target):
    """The training log is strict JSON: a TTT step whose batch has no trainable position has no
    loss (NaN inside), logged as null; json.dumps(..., allow_nan=False) refuses NaN."""
    from eagle_kernels.train import TrainConfig, batch_loss, logged

    head = new_draft_head(EAGLE3, target, seed=4).float()
    ids, _ = random_batch(target, batch=2, length=12, seed=9)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, :4] = True  # positions 0..3: steps whose predicted token lies past them see none
    _, metrics = batch_loss(head, target, ids, mask, TrainConfig(out="unused", ttt_steps=6))
    assert None in metrics["step_loss"] and None in metrics["step_acc"]
    json.loads(json.dumps(metrics, allow_nan=False))
    assert logged(float("nan")) is None and logged(1.23456) == 1.2346
    assert logged(1.23456, None) == 1.23456
