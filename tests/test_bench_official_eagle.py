"""bench/e2e/bench_official_eagle.py and its loader official_eagle.py: the parts that run without
a checkout of the official EAGLE code (output comparison, the method rotation and counting,
the bridges' config and staging, clear refusals)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from bench_support import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/e2e/bench_official_eagle.py", "bench_official_eagle")


@pytest.fixture(scope="module")
def loader():
    return load_script("bench/e2e/official_eagle.py", "official_eagle")


def test_outputs_are_cut_at_eos_and_the_limit_then_compared(bench):
    eos = [2]
    assert bench.cut([5, 6, 2, 7], eos, 10) == [5, 6, 2]
    assert bench.cut([5, 6, 7, 8], eos, 3) == [5, 6, 7]
    # the official code returns a few tokens past the limit: the cut drops them
    assert bench.same_output([5, 6, 7], bench.cut([5, 6, 7, 8, 9], eos, 3))
    # one output ended at EOS where the other went on: different
    assert not bench.same_output([5, 2], [5, 6, 7])
    assert not bench.same_output([5, 6, 7], [5, 6, 8])
    assert not bench.same_output([5, 6], [5, 6, 7])  # stopped short without EOS


def test_every_method_answers_every_prompt_in_a_rotating_order_and_is_counted(bench):
    calls = []

    def method(name, tokens, cycles=0, tree_tokens=0):
        def call(ids, max_new_tokens):
            calls.append((ids[0], name))
            return tokens, cycles, tree_tokens, 0.0
        return call

    table = {"ours-ar": (method("ours-ar", [1, 2, 3]), "ours-ar"),
             "ours-eagle": (method("ours-eagle", [1, 2, 3], 1, 3), "ours-ar"),
             "official-naive": (method("official-naive", [1, 2, 4]), "official-naive"),
             "official-eagle-1/1/2": (method("official-eagle-1/1/2", [1, 2, 4, 5], 2, 4),
                                      "official-naive")}
    totals = bench.run_set(table, [[10], [11], [12], [13]], eos=[0], max_new_tokens=3)
    for prompt in (10, 11, 12, 13):  # each prompt: every method once, first one rotating
        order = [name for first, name in calls if first == prompt]
        assert sorted(order) == sorted(table)
    firsts = [next(name for first, name in calls if first == prompt) for prompt in
              (10, 11, 12, 13)]
    assert firsts == list(table)
    assert totals["official-eagle-1/1/2"]["tokens"] == 16  # what it returned, past the limit
    assert totals["official-eagle-1/1/2"]["same_as_own_plain"] == 4
    assert totals["official-naive"]["same_as_ours_ar"] == 0  # [1, 2, 4] vs [1, 2, 3]
    assert totals["ours-eagle"]["same_as_ours_ar"] == 4
    assert (totals["ours-eagle"]["cycles"], totals["ours-eagle"]["tree_tokens"]) == (4, 12)

    args = types.SimpleNamespace(max_new_tokens=3, draft=None, official_commit="abc",
                                 target_weights="packs")
    rows = {row["method"]: row for row in bench.rows_of("set", totals, 4, args)}
    assert rows["official-eagle-1/1/2"]["tau"] == 2.0
    assert rows["ours-ar"]["tau"] == ""  # no cycles of a tree
    assert rows["official-naive"]["identical_to_ours_ar"] == "0/4"


def test_a_fixed_tree_is_set_for_the_block_and_the_budget_restored_after_it(bench):
    from eagle_kernels.runtime.drafting import TreeConfig

    budget, loaded = object(), TreeConfig(1, 1, 2)
    engine = types.SimpleNamespace(tree=loaded, tree_policy=budget, prompt_lookup=True)
    generator = types.SimpleNamespace(engine=engine)
    settings = (loaded, budget, True)
    with pytest.raises(RuntimeError):
        with bench.fixed_tree(generator, TreeConfig(10, 6, 60)):
            # every cycle the head's tree, as the official code runs: no context drafts
            assert (engine.tree, engine.tree_policy, engine.prompt_lookup) == (
                TreeConfig(10, 6, 60), None, False)
            raise RuntimeError("a call failed")
    assert (engine.tree, engine.tree_policy, engine.prompt_lookup) == settings
    with bench.fixed_tree(generator, None):  # None: as loaded
        assert (engine.tree, engine.tree_policy, engine.prompt_lookup) == settings


def test_the_command_line_refuses_auto_among_the_fixed_trees(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args(["--official-eagle", str(tmp_path), "--trees", "auto"])
    assert exit_info.value.code == 2
    assert "--trees" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(["--official-eagle", str(tmp_path), "--target-weights", "fp32",
                          "--device", "cuda"])
    assert "--target-weights fp32" in capsys.readouterr().err
    args = bench.parse_args(["--official-eagle", str(tmp_path), "--official-commit", "abc"])
    assert [bench.tree_name(tree) for tree in args.trees] == ["10/6/60", "1/1/2"]
    # a folder that is not the top of a checkout: its commit is unknown, not the repository's
    # around it (this test's checkout)
    assert bench.checkout_commit(Path(__file__).parent) == "unknown"
    assert bench.checkout_commit(tmp_path) == "unknown"


def test_a_folder_that_is_not_the_official_checkout_is_refused_by_name(loader, tmp_path):
    with pytest.raises(ValueError, match="--official-eagle: expected a checkout"):
        loader._import_official(tmp_path)


def test_rope_settings_are_bridged_and_only_plain_rope_is(loader):
    config = types.SimpleNamespace(rope_parameters={"rope_type": "default",
                                                    "rope_theta": 100000.0})
    bridged = loader._with_rope_attributes(config)
    assert (bridged.rope_theta, bridged.rope_scaling) == (100000.0, None)
    scaled = types.SimpleNamespace(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5})
    with pytest.raises(ValueError, match="llama3"):
        loader._with_rope_attributes(scaled)


def test_staging_drops_target_hidden_size_and_indexes_a_single_file_target(loader, tmp_path):
    target, head = tmp_path / "target", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"")
    (head / "config.json").write_text(json.dumps({"hidden_size": 8, "target_hidden_size": 8}))
    (head / "model.safetensors").write_bytes(b"")
    target_stage, head_stage = loader._staging(target, head)
    index = json.loads((target_stage / "model.safetensors.index.json").read_text())
    assert index["weight_map"]["model.embed_tokens.weight"] == "model.safetensors"
    assert (target_stage / "config.json").resolve() == (target / "config.json").resolve()
    assert json.loads((head_stage / "config.json").read_text()) == {"hidden_size": 8}
    assert (head_stage / "model.safetensors").resolve() == (head / "model.safetensors").resolve()
    assert json.loads((head / "config.json").read_text())["target_hidden_size"] == 8  # untouched
    (head / "config.json").write_text(json.dumps({"hidden_size": 8, "target_hidden_size": 16}))
    with pytest.raises(ValueError, match="target_hidden_size"):
        loader._staging(target, head)


def test_each_method_is_measured_against_its_own_plain_decoding_and_ours_eagle(bench):
    def total(own_plain, tokens, seconds, cycles=0, tree_tokens=0):
        return {"own_plain": own_plain, "tokens": tokens, "seconds": seconds, "cycles": cycles,
                "tree_tokens": tree_tokens, "capture_seconds": 0.0, "same_as_ours_ar": 1,
                "same_as_own_plain": 1}

    totals = {"ours-ar": total("ours-ar", 100, 1.0),
              "ours-eagle": total("ours-ar", 120, 1.0, 40, 80),
              "official-naive": total("official-naive", 100, 10.0),
              "official-eagle-1/1/2": total("official-naive", 100, 12.5, 50, 100)}
    args = types.SimpleNamespace(max_new_tokens=100, draft=None, official_commit="abc",
                                 target_weights="packs")
    rows = {row["method"]: row for row in bench.rows_of("set", totals, 1, args)}
    assert rows["official-eagle-1/1/2"]["speedup_over_own_plain"] == 0.8  # 8 / 10 tokens/s
    assert rows["ours-eagle"]["speedup_over_own_plain"] == 1.2  # 120 / 100
    assert rows["official-eagle-1/1/2"]["ours_eagle_speedup_over_this"] == 15.0  # 120 / 8
    assert (rows["ours-eagle"]["tau"], rows["official-eagle-1/1/2"]["tau"]) == (2.0, 2.0)


def test_results_md_renders_the_comparison_once(tmp_path):
    make_results = load_script("bench/make_results.py", "make_results")
    run = tmp_path / "2026-01-01_cpu"
    run.mkdir()
    row = {"set": "humaneval", "method": "official-eagle-1/1/2", "tokens_per_second": 12.0,
           "speedup_over_own_plain": 0.8, "ours_eagle_speedup_over_this": 14.5, "tau": 1.42,
           "identical_to_ours_ar": "8/8", "identical_to_own_plain": "8/8",
           "official_commit": "cb7e0841fe0c206c"}
    environment = {"device": "CPU", "torch": "2.13", "date": "2026-01-01", "commit": "abc"}
    (run / "official_eagle.json").write_text(json.dumps(
        {"environment": environment, "command": "python bench/e2e/bench_official_eagle.py",
         "rows": [row]}))
    (run / "official_eagle.csv").write_text("set,method\nhumaneval,official-eagle-1/1/2\n")
    text = make_results.build(tmp_path)
    assert "official EAGLE code — `2026-01-01_cpu`" in text
    assert "official EAGLE cb7e0841fe0c" in text
    assert "| humaneval | official-eagle-1/1/2 | 12.0 | 0.8 | 14.5 | 1.42 |  | 8/8 | 8/8 |" in text
    assert text.count("official-eagle-1/1/2") == 1  # the CSV is not rendered a second time


def test_the_official_calls_report_their_cycles_and_the_tokens_those_appended(bench):
    """eagenerate(log=True) returns (ids, new_token, idx): new_token the tokens its cycles
    appended, idx the last cycle's index (idx + 1 verify passes after the prefill)."""
    import torch

    class Official:
        ea_layer = types.SimpleNamespace(init_tree=lambda: None)

        def eagenerate(self, ids, temperature, max_new_tokens, log):
            assert log and temperature == 0.0
            return torch.cat([ids, torch.tensor([[7, 8, 9, 2]])], dim=1), 4, 1

        def naivegenerate(self, ids, temperature, max_new_tokens):
            return torch.cat([ids, torch.tensor([[7, 8, 9, 2]])], dim=1)

    model = Official()
    eagle = bench.official(model, bench.TreeConfig(2, 1, 3), "cpu")
    assert eagle([1, 1], 8) == ([7, 8, 9, 2], 2, 4, 0.0)
    assert (model.ea_layer.top_k, model.ea_layer.depth, model.ea_layer.total_tokens) == (2, 1, 2)
    assert bench.official(model, None, "cpu")([1, 1], 8) == ([7, 8, 9, 2], 0, 0, 0.0)


def test_ours_counts_the_cycles_of_a_tree_and_their_tokens_not_plain_steps(bench):
    def generator(mode, histogram):
        stats = types.SimpleNamespace(mode=mode, accepted_histogram=histogram,
                                      capture_seconds=0.25)
        engine = types.SimpleNamespace(
            tree=None, tree_policy=None, prompt_lookup=True,
            generate=lambda prompts, n, eos_token_ids, speculative: types.SimpleNamespace(
                tokens=[[4, 5, 6]], stats=stats))
        return types.SimpleNamespace(engine=engine, eos_token_ids=lambda: [2])

    # 3 cycles: one accepted nothing, two accepted 2 drafts each: 1 + 3 + 3 tokens
    speculative = bench.ours(generator("speculative", [1, 0, 2]), None, True)
    assert speculative([1], 8) == ([4, 5, 6], 3, 7, 0.25)
    plain = bench.ours(generator("autoregressive", [5]), None, False)
    assert plain([1], 8) == ([4, 5, 6], 0, 0, 0.25)


def test_each_method_names_its_own_plain_decoding(bench):
    table = bench.methods(object(), object(), [bench.TreeConfig(1, 1, 2)])
    assert {name: own for name, (_, own) in table.items()} == {
        "ours-ar": "ours-ar", "ours-eagle": "ours-ar", "ours-eagle-1/1/2": "ours-ar",
        "official-naive": "official-naive", "official-eagle-1/1/2": "official-naive"}
