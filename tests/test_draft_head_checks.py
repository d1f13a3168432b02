"""Draft head checkpoints that do not fit their target or are malformed: each refused at load
time with an error naming the key, file or setting (they used to load, then fail or draft
wrong tokens in the first generate). Checkpoints written as tests/test_draft_heads.py writes
them, in the official formats."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_kernels.runtime.draft_heads import load_draft_head, save_draft_head
from test_draft_heads import (DRAFT_VOCAB, EAGLE1, EAGLE1_CONFIG, EAGLE3, HEADS, HIDDEN, INTER,
                              VOCAB, _random, draft_vocab_map, eagle1_state, eagle3_config,
                              eagle3_state, tiny_target, write_eagle1, write_eagle3)


def test_missing_key_raises_naming_it(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle3_state(gen)
    del state["midlayer.mlp.up_proj.weight"]
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=r"missing.*midlayer\.mlp\.up_proj\.weight"):
        load_draft_head(path, target)
    state = eagle1_state(gen)
    del state["layers.0.post_attention_layernorm.weight"]
    path = write_eagle1(tmp_path / "e1", state)
    with pytest.raises(ValueError, match=r"missing.*layers\.0\.post_attention_layernorm"):
        load_draft_head(path, target)


@pytest.mark.parametrize("dropped", [("d2t",), ("t2d",), ("d2t", "t2d")])
def test_eagle3_draft_vocabulary_without_its_mapping_raises_naming_the_keys(dropped, gen,
                                                                            tmp_path):
    """Regression: a draft vocabulary smaller than the target's without d2t/t2d used to load
    with zero offsets, reading draft id i as target id i."""
    target = tiny_target(gen)
    state = eagle3_state(gen)  # DRAFT_VOCAB < VOCAB
    for key in dropped:
        del state[key]
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=rf"missing {' and '.join(dropped)}:.*{DRAFT_VOCAB}"
                                         rf".*{VOCAB}"):
        load_draft_head(path, target)


def test_eagle3_full_vocabulary_without_its_mapping_loads_as_identity(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle3_state(gen, VOCAB)
    del state["d2t"], state["t2d"]
    head = load_draft_head(write_eagle3(tmp_path / "e3", state, eagle3_config(VOCAB)), target)
    assert head.d2t_offsets() is None and bool(head.t2d.all())


def test_unexpected_key_raises_naming_it(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle1_state(gen)
    state["layers.0.input_layernorm.weight"] = torch.ones(HIDDEN)  # EAGLE-1 has none
    path = write_eagle1(tmp_path / "e1", state)
    with pytest.raises(ValueError, match=r"unexpected.*layers\.0\.input_layernorm\.weight"):
        load_draft_head(path, target)


def test_wrong_shape_raises_naming_it(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle3_state(gen)
    state["midlayer.self_attn.q_proj.weight"] = torch.zeros(HIDDEN, HIDDEN)  # not 2H wide
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=r"midlayer\.self_attn\.q_proj\.weight.*shape"):
        load_draft_head(path, target)


def test_d2t_leaving_the_target_vocabulary_raises_naming_it(gen, tmp_path):
    """An offset that maps a draft id outside the target's vocabulary loaded, then failed
    inside an embedding lookup at the first generate."""
    target = tiny_target(gen)
    state = eagle3_state(gen)
    state["d2t"][3] = VOCAB  # draft id 3 -> target id 3 + VOCAB
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=rf"d2t: draft id 3 .* outside .*\[0, {VOCAB}\)"):
        load_draft_head(path, target)


def test_d2t_mapping_two_draft_ids_to_one_target_id_raises_naming_them(gen, tmp_path):
    """A repeated target id loaded silently: the same token drafted on two branches."""
    target = tiny_target(gen)
    state = eagle3_state(gen)
    ids = torch.arange(DRAFT_VOCAB) + state["d2t"]
    state["d2t"][5] = ids[2] - 5  # draft id 5 -> draft id 2's target id
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=rf"d2t: draft ids 2 and 5 both map to target id "
                                         rf"{int(ids[2])}"):
        load_draft_head(path, target)


@pytest.mark.parametrize("change", ["unmark one", "mark one more", "float", "2-D"])
def test_t2d_disagreeing_with_d2t_raises_naming_it(change, gen, tmp_path):
    """t2d masks the training loss of a warm-started run: one that disagreed with d2t loaded
    silently (a float one was cast to bool)."""
    target = tiny_target(gen)
    state = eagle3_state(gen)
    ids = torch.arange(DRAFT_VOCAB) + state["d2t"]
    t2d = state["t2d"]
    if change == "unmark one":
        t2d[ids[3]] = False
        match = rf"t2d: expected True at exactly the {DRAFT_VOCAB} .* got {DRAFT_VOCAB - 1} marked, 1"
    elif change == "mark one more":
        t2d[int(torch.nonzero(~t2d)[0])] = True
        match = rf"t2d: expected True at exactly .* got {DRAFT_VOCAB + 1} marked, 0"
    elif change == "float":
        state["t2d"], match = t2d.float() * 0.5, r"t2d: expected a 1-D bool .* got torch.float32"
    else:
        state["t2d"], match = t2d.reshape(1, -1), r"t2d: expected a 1-D bool .* of shape \(1, "
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=match):
        load_draft_head(path, target)


def test_eagle3_draft_vocabulary_beyond_the_targets_raises(gen, tmp_path):
    """A draft vocabulary larger than the target's, no mapping: it loaded (the identity default),
    then the first generate failed inside an embedding lookup."""
    target = tiny_target(gen)
    state = eagle3_state(gen, VOCAB)
    del state["d2t"], state["t2d"]
    state["lm_head.weight"] = _random(gen, (VOCAB + 5, HIDDEN)).to(state["lm_head.weight"].dtype)
    path = write_eagle3(tmp_path / "e3", state, eagle3_config(VOCAB + 5))
    with pytest.raises(ValueError, match=rf"draft_vocab_size: expected 1 .. the target's {VOCAB}"
                                         rf" tokens, got {VOCAB + 5}"):
        load_draft_head(path, target)


@pytest.mark.parametrize("d2t", [torch.zeros(4, DRAFT_VOCAB // 4, dtype=torch.int64),
                                 torch.zeros(DRAFT_VOCAB, dtype=torch.float32)],
                         ids=["2-D", "float"])
def test_d2t_of_the_wrong_kind_raises_naming_it(d2t, gen, tmp_path):
    """A 2-D d2t failed with a broadcasting RuntimeError; a float one was truncated silently."""
    target = tiny_target(gen)
    state = eagle3_state(gen)
    state["d2t"] = d2t
    path = write_eagle3(tmp_path / "e3", state, eagle3_config())
    with pytest.raises(ValueError, match=r"d2t: expected a 1-D integer tensor"):
        load_draft_head(path, target)


def test_eagle3_feature_layers_from_the_config_are_used_and_kept(gen, tmp_path):
    """Heads name the layers they fuse in two formats: vLLM's top-level
    eagle_aux_hidden_state_layer_ids (the layers whose inputs it captures) and SpecForge /
    SGLang's eagle_config one (the layers whose outputs it takes: the inputs of id + 1). Both
    are used, a saved head keeps them, and ids the target cannot give are refused by name.
    (They were ignored: such a head drafted from the wrong layers and accepted almost nothing.)"""
    target = tiny_target(gen)  # 7 layers: the default is (2, 3, 4)

    def head_with(tag, **config):
        path = write_eagle3(tmp_path / tag, eagle3_state(gen), eagle3_config(**config))
        return load_draft_head(path, target)

    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [4, 0, 5]}}
    assert head_with("sglang", **nested).feature_layers == (1, 5, 6)
    assert head_with("vllm", eagle_aux_hidden_state_layer_ids=[1, 5, 6]).feature_layers == \
        (1, 5, 6)
    assert head_with("both", eagle_aux_hidden_state_layer_ids=[6, 5, 1], **nested) \
        .feature_layers == (1, 5, 6)
    assert head_with("plain").feature_layers == target.eagle3_feature_layers() == (2, 3, 4)
    save_draft_head(head_with("input0", eagle_aux_hidden_state_layer_ids=[0, 3, 6]),
                    tmp_path / "saved")
    assert load_draft_head(tmp_path / "saved", target).feature_layers == (0, 3, 6)
    save_draft_head(head_with("plain2"), tmp_path / "saved_plain")
    saved = json.loads((tmp_path / "saved_plain" / "config.json").read_text())
    assert "eagle_aux_hidden_state_layer_ids" not in saved and "eagle_config" not in saved
    with pytest.raises(ValueError, match=r"name different layers"):
        head_with("clash", eagle_aux_hidden_state_layer_ids=[1, 5, 6], **{
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}})
    for ids in ([1, 3, 6], [1, 1, 3], [1, 3], [1.0, 2, 3], "1,2,3", [-1, 2, 3]):
        with pytest.raises(ValueError, match=r"eagle_config\.eagle_aux_hidden_state_layer_ids: "
                                             r"expected 3 distinct layer ids in \[0, 5\] "
                                             r"\(the target has 7 layers\)"):
            head_with("bad", eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    with pytest.raises(ValueError, match=r"^draft config\.json: eagle_aux_hidden_state_layer_ids:"
                                         r" expected 3 distinct layer ids in \[0, 6\]"):
        head_with("bad_top", eagle_aux_hidden_state_layer_ids=[1, 3, 7])


def test_a_small_target_head_with_its_own_feature_layers_saves(gen, tmp_path):
    """Under 7 layers there is no default to compare with: the head's own ids are written."""
    target = tiny_target(gen, layers=4)
    path = write_eagle3(tmp_path / "e3", eagle3_state(gen), eagle3_config(
        eagle_aux_hidden_state_layer_ids=[0, 1, 3]))
    save_draft_head(load_draft_head(path, target), tmp_path / "saved")
    assert load_draft_head(tmp_path / "saved", target).feature_layers == (0, 1, 3)


def test_config_without_vocab_or_hidden_size_raises_naming_the_key(gen, tmp_path):
    """LlamaConfig's defaults (vocab 32000, hidden 4096) were reported as the file's values."""
    target = tiny_target(gen)
    for key in ("vocab_size", "hidden_size"):
        config = {k: v for k, v in eagle3_config().items() if k != key}
        path = write_eagle3(tmp_path / key, eagle3_state(gen), config)
        with pytest.raises(ValueError, match=rf"config\.json: expected a {key}"):
            load_draft_head(path, target)


@pytest.mark.parametrize("change,match", [({"rms_norm_eps": -1.0}, "rms_norm_eps"),
                                          ({"rms_norm_eps": "tiny"}, ".*rms_norm_eps"),
                                          ({"hidden_act": "no_such_act"}, "hidden_act")])
def test_config_the_head_cannot_run_raises_naming_the_file(change, match, gen, tmp_path):
    """A negative eps failed at generate naming an internal argument; an unknown activation
    failed with a bare KeyError."""
    target = tiny_target(gen)
    path = write_eagle3(tmp_path / "e3", eagle3_state(gen), eagle3_config(**change))
    with pytest.raises(ValueError, match=rf"config\.json: {match}"):
        load_draft_head(path, target)


def test_unreadable_files_and_non_finite_weights_raise_naming_the_file(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle3_state(gen)
    state["norm.weight"] = torch.full_like(state["norm.weight"], float("nan"))
    path = write_eagle3(tmp_path / "nan", state, eagle3_config())
    with pytest.raises(ValueError, match=r"norm\.weight holds NaN or inf"):
        load_draft_head(path, target)
    path = write_eagle3(tmp_path / "json", eagle3_state(gen), eagle3_config())
    (path / "config.json").write_text("{'not': json}")
    with pytest.raises(ValueError, match=r"config\.json: not valid JSON"):
        load_draft_head(path, target)
    path = write_eagle3(tmp_path / "bytes", eagle3_state(gen), eagle3_config())
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match=r"model\.safetensors: not a readable safetensors"):
        load_draft_head(path, target)
    path = write_eagle1(tmp_path / "bin", eagle1_state(gen))
    (path / "pytorch_model.bin").write_bytes(b"\x80\x04not a pickle" * 8)
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: not a readable weights file"):
        load_draft_head(path, target)
    torch.save([torch.zeros(2)], path / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"pytorch_model\.bin: expected a dict of named tensors"):
        load_draft_head(path, target)


@pytest.mark.parametrize("kind", [EAGLE1, EAGLE3])
def test_vocab_size_differing_from_target_raises(kind, gen, tmp_path):
    target = tiny_target(gen)
    if kind == EAGLE1:
        path = write_eagle1(tmp_path / "h", eagle1_state(gen),
                            {**EAGLE1_CONFIG, "vocab_size": VOCAB + 1})
    else:
        path = write_eagle3(tmp_path / "h", eagle3_state(gen),
                            eagle3_config(vocab_size=VOCAB + 1))
    with pytest.raises(ValueError, match=rf"vocab_size.*{VOCAB}.*{VOCAB + 1}"):
        load_draft_head(path, target)


def test_eagle1_hidden_size_differing_from_target_raises(gen, tmp_path):
    target = tiny_target(gen)
    path = write_eagle1(tmp_path / "h", eagle1_state(gen, hidden=48),
                        {**EAGLE1_CONFIG, "hidden_size": 48})
    with pytest.raises(ValueError, match=r"hidden_size.*64.*48"):
        load_draft_head(path, target)


def test_eagle3_fc_width_differing_from_three_target_layers_raises(gen, tmp_path):
    target = tiny_target(gen)
    path = write_eagle3(tmp_path / "h", eagle3_state(gen, target_hidden=48),
                        eagle3_config(target_hidden_size=48))
    with pytest.raises(ValueError, match=r"fc\.weight.*192.*144"):
        load_draft_head(path, target)


def test_eagle3_hidden_size_differing_from_target_raises(gen, tmp_path):
    target = tiny_target(gen)
    hidden, heads, head_dim = 48, HEADS, 48 // HEADS
    state = {"fc.weight": _random(gen, (hidden, 3 * HIDDEN))}
    for name, rows in (("q_proj", heads * head_dim), ("k_proj", 2 * head_dim),
                       ("v_proj", 2 * head_dim)):
        state[f"midlayer.self_attn.{name}.weight"] = _random(gen, (rows, 2 * hidden))
    state["midlayer.self_attn.o_proj.weight"] = _random(gen, (hidden, heads * head_dim))
    state["midlayer.mlp.gate_proj.weight"] = _random(gen, (INTER, hidden))
    state["midlayer.mlp.up_proj.weight"] = _random(gen, (INTER, hidden))
    state["midlayer.mlp.down_proj.weight"] = _random(gen, (hidden, INTER))
    for norm in ("midlayer.input_layernorm", "midlayer.hidden_norm",
                 "midlayer.post_attention_layernorm", "norm"):
        state[f"{norm}.weight"] = _random(gen, (hidden,), "norm")
    state["lm_head.weight"] = _random(gen, (DRAFT_VOCAB, hidden))
    state["d2t"], state["t2d"] = draft_vocab_map(gen, DRAFT_VOCAB)
    path = write_eagle3(tmp_path / "h", state, eagle3_config(hidden_size=hidden))
    with pytest.raises(ValueError, match="hidden_size"):
        load_draft_head(path, target)


def test_embed_tokens_of_the_wrong_shape_raises(gen, tmp_path):
    target = tiny_target(gen)
    state = eagle1_state(gen)
    state["embed_tokens.weight"] = torch.zeros(VOCAB, 48)
    path = write_eagle1(tmp_path / "h", state)
    with pytest.raises(ValueError, match="embed_tokens"):
        load_draft_head(path, target)


def test_directory_without_weights_or_config_raises(gen, tmp_path):
    target = tiny_target(gen)
    path = tmp_path / "h"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(EAGLE1_CONFIG))
    with pytest.raises(ValueError, match="model.safetensors or pytorch_model.bin"):
        load_draft_head(path, target)
    (path / "config.json").unlink()
    torch.save(eagle1_state(gen), path / "pytorch_model.bin")
    with pytest.raises(ValueError, match="config.json"):
        load_draft_head(path, target)


@pytest.mark.parametrize("value", [str(HIDDEN), float(HIDDEN), -1, HIDDEN // 2, True])
def test_eagle3_target_hidden_size_other_than_the_targets_raises(value, gen, tmp_path):
    """config.target_hidden_size is no LlamaConfig field, so transformers checks nothing of it:
    "64" or 64.0 reached nn.Linear as a size (a TypeError, a traceback in the CLI), -1
    torch.empty; one that differs from the target's hidden size cannot be this target's."""
    target = tiny_target(gen)
    config = eagle3_config(target_hidden=False, target_hidden_size=value)
    path = write_eagle3(tmp_path / "h", eagle3_state(gen), config)
    with pytest.raises(ValueError, match=rf"config\.target_hidden_size: expected the target's "
                                         rf"hidden size {HIDDEN} \(an int\) or none"):
        load_draft_head(path, target)
