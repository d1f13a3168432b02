"""eagle_kernels.from_hf: wrap an already-loaded transformers model, sharing its weights.

Tiny random Llama and Qwen2 ``*ForCausalLM`` models with a byte-level tokenizer (built in
memory, python/tiny_models.py): ``from_hf(model)`` and ``from_pretrained(saved checkpoint)``
give the same greedy tokens, equal to transformers' own greedy ``generate``; every weight of the
runtime's target shares storage with the HF model (same ``data_ptr``).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

import eagle_kernels
from eagle_kernels.runtime import TreeConfig
from eagle_kernels.runtime.hf import target_from_hf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from tiny_models import byte_tokenizer, tiny_hf_model  # noqa: E402

PROMPTS = ["Why is the sky blue?", "Name three colours."]
NEW_TOKENS = 8
TREE = TreeConfig(top_k=2, depth=2, total_tokens=5)


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


def _shared(hf_model, target) -> None:
    ours = target.state_dict()
    for name, tensor in hf_model.state_dict().items():
        if "rotary_emb" in name:
            continue
        assert ours[name].data_ptr() == tensor.data_ptr(), name
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name


@pytest.mark.parametrize("kind, tied", [("llama", False), ("qwen2", True)])
def test_from_hf_shares_weights_and_equals_from_pretrained(tokenizer, tmp_path, kind, tied):
    model = tiny_hf_model(tokenizer, kind, layers=2, seed=1)
    if tied:
        model.config.tie_word_embeddings = True  # as small Qwen2 checkpoints ship
        model.lm_head.weight = model.model.embed_tokens.weight
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = eagle_kernels.from_hf(model, tokenizer, draft="random-eagle1", tree=TREE)
    target = wrapped.engine.target
    _shared(model, target)
    if tied:
        assert target.lm_head.weight is target.model.embed_tokens.weight
    assert not any(p.requires_grad for p in target.parameters())
    assert all(p.requires_grad for p in model.parameters())  # the user's model is untouched

    model.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    loaded = eagle_kernels.from_pretrained(str(tmp_path), draft="random-eagle1", tree=TREE)
    out_hf = wrapped.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    out_dir = loaded.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    assert out_hf.tokens == out_dir.tokens and out_hf.texts == out_dir.texts
    assert out_hf.tokens == wrapped.generate(PROMPTS, NEW_TOKENS, speculative=False).tokens

    # transformers' own greedy decoding of the same weights agrees
    for prompt, ours in zip(PROMPTS, out_hf.tokens):
        ids = torch.tensor([wrapped.encode(prompt)])
        with torch.no_grad():
            reference = model.generate(ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=len(ours), do_sample=False,
                                       eos_token_id=wrapped.eos_token_ids(),
                                       pad_token_id=tokenizer.pad_token_id)
        assert reference[0, ids.shape[1]:].tolist()[:len(ours)] == ours


def test_weights_stay_shared_after_in_place_updates(tokenizer):
    model = tiny_hf_model(tokenizer, "llama", layers=2, seed=2)
    target = target_from_hf(model)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.add_(1.0)
    torch.testing.assert_close(target.model.layers[1].mlp.down_proj.weight,
                               model.model.layers[1].mlp.down_proj.weight, rtol=0, atol=0)


def test_from_hf_rejects_what_it_cannot_share(tokenizer):
    model = tiny_hf_model(tokenizer, "llama", layers=2, seed=3)
    with pytest.raises(ValueError, match="dtype"):
        eagle_kernels.from_hf(model, tokenizer, draft="none", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="missing"):
        target_from_hf(model.model)  # the bare LlamaModel: no lm_head, no "model." prefix
    with pytest.raises(TypeError, match="model"):
        target_from_hf(object())
    # float64 weights were taken, then failed mid-generation in an op naming an inner tensor
    with pytest.raises(ValueError, match=r"model: expected one dtype of torch.float32, "
                                         r"torch.bfloat16, torch.float16 .*torch.float64"):
        target_from_hf(tiny_hf_model(tokenizer, "llama", layers=2, seed=3).double())
    assert eagle_kernels.from_hf(model, tokenizer, draft="none", dtype=torch.float32,
                                 device="cpu").engine.head is None


def test_the_tree_is_measured_here_unless_one_is_given(tokenizer):
    """By default (from_hf, as from_pretrained) on a CPU the tree budget measures this device
    and its policy drives the tree (EAGLE-2's fixed 10/6/60 runs ~6x slower than plain decoding
    on a 2-core CPU); set_tree(None) goes back to TreeConfig's default, a TreeConfig to itself,
    and neither keeps the budget."""
    model = tiny_hf_model(tokenizer, "llama", layers=2, seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the random head's warning
        generator = eagle_kernels.from_hf(model, tokenizer, draft="random-eagle1")
    engine = generator.engine
    assert engine.tree_policy is generator.budget and engine.tree == generator.budget.current
    generator.set_tree(None)
    assert engine.tree_policy is None and engine.tree == TreeConfig() and generator.budget is None
    generator.set_tree(TREE)
    assert engine.tree_policy is None and engine.tree == TREE
    generator.set_tree("default")
    assert engine.tree_policy is generator.budget is not None
    policy, budget, tree = engine.tree_policy, generator.budget, engine.tree
    with pytest.raises(ValueError, match="tree"):
        generator.set_tree("big")
    # a refused tree changes nothing (it used to drop the measured budget first)
    assert (engine.tree_policy, generator.budget, engine.tree) == (policy, budget, tree)


def test_bad_arguments_raise_naming_them_before_anything_loads(tokenizer, monkeypatch,
                                                              tmp_path):
    """draft / tree are checked before the target is wrapped or loaded; speculative / chat are
    bools ("no" read as True); cuda:N beyond the GPUs seen is refused by name."""
    model = tiny_hf_model(tokenizer, "llama", layers=2, seed=5)
    with pytest.raises(TypeError, match="draft: expected an EAGLE head directory"):
        eagle_kernels.from_hf(model, tokenizer, draft=5)
    with pytest.raises(ValueError, match="draft: expected an EAGLE head directory"):
        eagle_kernels.from_hf(model, tokenizer, draft="/nonexistent/head")
    with pytest.raises(ValueError, match="tree: expected a TreeConfig"):
        eagle_kernels.from_hf(model, tokenizer, draft="none", tree="big")

    def no_load(*args, **kwargs):
        raise AssertionError("the target was loaded before the arguments were checked")

    monkeypatch.setattr("eagle_kernels.runtime.api.load_target_and_tokenizer", no_load)
    with pytest.raises(TypeError, match="tree: expected a TreeConfig, 'auto', 'default' or "
                                        "None, got int"):
        eagle_kernels.from_pretrained(draft="none", tree=7)
    with pytest.raises(TypeError, match="draft_weights: expected one of auto, exact, q8_0, "
                                        "got int"):
        eagle_kernels.from_pretrained(draft_weights=5)
    # an empty path is the current directory to pathlib: refused, whatever it holds
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="draft: expected an EAGLE head directory .* got ''"):
        eagle_kernels.from_pretrained(draft="")
    monkeypatch.undo()
    with monkeypatch.context() as patch:  # the target's check runs as it loads
        patch.chdir(tmp_path)
        with pytest.raises(ValueError, match="target: expected a checkpoint directory .* got ''$"):
            eagle_kernels.from_pretrained(target="", draft="none")
    generator = eagle_kernels.from_hf(model, tokenizer, draft="none", tree=TREE)
    with pytest.raises(TypeError, match="speculative: expected a bool, got str"):
        generator.generate("hi", 2, speculative="no")
    with pytest.raises(TypeError, match="chat: expected a bool, got str"):
        generator.generate("hi", 2, chat="no", speculative=False)
    generator.tokenizer = byte_tokenizer()
    generator.tokenizer.chat_template = None
    with pytest.warns(UserWarning, match="chat: the tokenizer has no chat template"):
        generator.generate("hi", 2, speculative=False)  # chat=True, the default
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ValueError, match=r"device: expected cuda:0 \.\. cuda:1 .*got 'cuda:2'"):
        eagle_kernels.from_hf(model, tokenizer, draft="none", device="cuda:2")
