"""The training pipeline's guards (train.py): what the shared dataset is keyed on, what a resume
may change, reproducible resumes (EAGLE-1's noise, the log), a target whose embedding pads the
tokenizer's vocabulary, the settings TrainConfig refuses, and dataset.pt loaded as data only.

Tiny random targets with the default model's tokenizer, a few ShareGPT conversations.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from eagle_kernels.data import draft_vocabulary
from eagle_kernels.runtime import training
from eagle_kernels.runtime.draft_heads import load_draft_head
from runtime_helpers import tiny_target
from test_training import default_tokenizer, train_config


@pytest.fixture(scope="module")
def tokenizer():
    return default_tokenizer()


def frozen_target(tokenizer, seed, extra_rows=0):
    target = tiny_target(seed=seed, vocab=len(tokenizer) + extra_rows)
    target.requires_grad_(False)
    return target


def other_template(tokenizer):
    """The same vocabulary, another chat template (ids of the rendered text differ)."""
    changed = copy.deepcopy(tokenizer)
    changed.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ")
    return changed


# ------------------------------------------------------------------------------ dataset key


def test_dataset_key_names_the_tokenizer_the_sharegpt_file_and_the_replying_target(
        tokenizer, tmp_path, monkeypatch):
    from eagle_kernels import data
    from eagle_kernels.train import dataset_key

    a, b = frozen_target(tokenizer, 11), frozen_target(tokenizer, 12)
    plain, regenerated = train_config(tmp_path), train_config(tmp_path, regenerate=True)
    assert dataset_key(plain, tokenizer, a) == dataset_key(plain, tokenizer, b)
    assert dataset_key(regenerated, tokenizer, a) != dataset_key(regenerated, tokenizer, b)
    assert dataset_key(plain, tokenizer, a) != dataset_key(plain, other_template(tokenizer), a)
    key = dataset_key(plain, tokenizer, a)
    assert json.loads(json.dumps(key)) == key  # JSON-comparable (the target cache stores it)
    other = tmp_path / "other_sharegpt.json"
    other.write_text("[]")
    monkeypatch.setattr(data, "sharegpt_path", lambda: other)
    assert dataset_key(plain, tokenizer, a) != key


def test_a_shared_dataset_of_regenerated_replies_is_rebuilt_for_another_target(tokenizer,
                                                                              tmp_path):
    """Regression: dataset.pt in a shared data_dir was keyed on the settings only, so target B
    trained on target A's greedy replies."""
    from eagle_kernels.train import DATA_FILE, build_dataset, train

    settings = dict(conversations=2, turns=1, regenerate=True, regenerate_max_new=4,
                    regenerate_batch=2, data_dir=str(tmp_path / "data"), prepare_only=True)
    for seed in (13, 14):
        target = frozen_target(tokenizer, seed)
        train(train_config(tmp_path / f"out{seed}", **settings), target, tokenizer,
              progress=False)
    stored = torch.load(tmp_path / "data" / DATA_FILE, weights_only=True)["examples"]
    own, _ = build_dataset(tokenizer, train_config("unused", **settings), progress=False,
                           target=target)
    assert [e[0].tolist() for e in stored] == [e[0].tolist() for e in own]
    assert not list((tmp_path / "data").glob("*.tmp"))  # written atomically


def test_dataset_file_loads_as_data_only(tokenizer, tmp_path):
    """dataset.pt may sit in a directory other runs share: it is loaded with weights_only, so
    a pickled object in it is refused, never run."""
    from eagle_kernels.train import DATA_FILE, train

    (tmp_path / "data").mkdir()
    torch.save({"key": [], "examples": [], "counts": torch.zeros(1), "x": Runs()},
               tmp_path / "data" / DATA_FILE)
    target = frozen_target(tokenizer, 15)
    with pytest.raises(Exception, match="(?i)weights.only"):
        train(train_config(tmp_path / "out", data_dir=str(tmp_path / "data"), prepare_only=True),
              target, tokenizer, progress=False)
    assert UNPICKLED == []


UNPICKLED: list = []


def _record(value):
    UNPICKLED.append(value)


class Runs:
    """Unpickling it calls :func:`_record` (what a weights_only load must not do)."""

    def __reduce__(self):
        return (_record, ("unpickled",))


# ------------------------------------------------------------------------------ resume


def test_resume_refuses_other_run_defining_settings_data_or_target(tokenizer, tmp_path):
    from eagle_kernels.train import train

    target = frozen_target(tokenizer, 16)
    first = train(train_config(tmp_path, max_minutes=1e-9), target, tokenizer, progress=False)
    assert first["steps_done"] == 1
    for overrides, message in (({"seed": 1}, r"seed: .* started with 0, got 1"),
                               ({"lr": 2e-3}, r"lr: .* started with 0\.001, got 0\.002"),
                               ({"batch_tokens": 200}, r"batch_tokens: .*100, got 200"),
                               ({"ttt_steps": 3}, r"ttt_steps: .*2, got 3"),
                               ({"conversations": 7}, r"conversations: .*6, got 7"),
                               ({"target_temperature": 0.5}, r"target_temperature: .*1\.0")):
        with pytest.raises(ValueError, match=message):
            train(train_config(tmp_path, **overrides), target, tokenizer, progress=False)
    with pytest.raises(ValueError, match="dataset_key: .* other data"):
        train(train_config(tmp_path), target, other_template(tokenizer), progress=False)
    with pytest.raises(ValueError, match="target_digest: .* other target weights"):
        train(train_config(tmp_path), frozen_target(tokenizer, 17), tokenizer, progress=False)
    # how the run is carried out may change
    done = train(train_config(tmp_path, save_every=7, export_dtype="float16", threads=1,
                              loss_backend="torch"), target, tokenizer, progress=False)
    assert done["finished"]


def test_resume_compares_the_ttt_steps_the_device_resolved_not_the_configured_zero(
        tokenizer, tmp_path, monkeypatch):
    """Regression: ``ttt_steps=0`` (the drafting depth of the device) was compared as
    configured, so a run started on a CPU (4 steps) and resumed on a GPU silently trained 7.
    The state records the resolved steps; a resume that resolves to others is refused, naming
    the flag that continues the run, and that flag does (the GPU is default_ttt_steps')."""
    import shlex

    from eagle_kernels import train as train_module
    from eagle_kernels.cli import parser
    from eagle_kernels.train import CPU_TTT_STEPS, STATE_FILE, train

    target = frozen_target(tokenizer, 22)
    assert train(train_config(tmp_path, ttt_steps=0, max_minutes=1e-9), target, tokenizer,
                 progress=False)["steps_done"] == 1
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    assert state["config"]["ttt_steps"] == 0 and state["resolved"] == {"ttt_steps": CPU_TTT_STEPS}
    monkeypatch.setattr(train_module, "default_ttt_steps", lambda device: training.TTT_STEPS)
    for ttt_steps, now in ((0, training.TTT_STEPS), (3, 3)):  # the "GPU" default, another one
        with pytest.raises(ValueError, match=rf"ttt_steps: .* started with {CPU_TTT_STEPS}, got "
                                             rf"{now} .*: pass --ttt-steps {CPU_TTT_STEPS} to "
                                             rf"continue it") as refused:
            train(train_config(tmp_path, ttt_steps=ttt_steps), target, tokenizer, progress=False)
    # the advice is the train command's own flag, and with it the run continues on the "GPU"
    flag = shlex.split(str(refused.value).split("pass ")[1].split(" to continue")[0])
    args = parser().parse_args(["train", "--out", str(tmp_path), *flag])
    done = train(train_config(tmp_path, ttt_steps=args.ttt_steps), target, tokenizer,
                 progress=False)
    assert done["finished"] and done["steps_total"] >= 2
    log = [json.loads(line) for line in open(tmp_path / "train_log.jsonl")]
    assert [len(r["step_loss"]) for r in log] == [CPU_TTT_STEPS] * done["steps_total"]
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    assert state["resolved"] == {"ttt_steps": CPU_TTT_STEPS}
    # EAGLE-1 trains no TTT steps: nothing resolved, nothing refused on another device
    eagle1 = train_config(tmp_path, kind="eagle1", ttt_steps=0, draft_vocab=8192)
    assert train_module.resolved_settings(eagle1, "cuda") == {}


def test_resume_of_a_state_saved_before_the_resolved_settings_compares_them_as_configured(
        tokenizer, tmp_path):
    """Old trainer states (no "resolved") still resume: their ttt_steps compared as configured
    (the steps they trained are not known), a configured change still refused."""
    from eagle_kernels.train import STATE_FILE, train

    target = frozen_target(tokenizer, 23)
    train(train_config(tmp_path, ttt_steps=0, max_minutes=1e-9), target, tokenizer,
          progress=False)
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    del state["resolved"]
    torch.save(state, tmp_path / STATE_FILE)
    with pytest.raises(ValueError, match=r"ttt_steps: .* started with 0, got 4 \(resume with"):
        train(train_config(tmp_path, ttt_steps=4), target, tokenizer, progress=False)
    assert train(train_config(tmp_path, ttt_steps=0), target, tokenizer,
                 progress=False)["finished"]


def test_resume_builds_the_target_cache_for_the_saved_heads_vocabulary(tokenizer, tmp_path,
                                                                     monkeypatch):
    """Regression: the cache was built from the freshly initialised head's draft vocabulary,
    before the saved head (whose vocabulary is the one trained) was loaded."""
    from eagle_kernels import target_cache
    from eagle_kernels.train import STATE_FILE, train

    target = frozen_target(tokenizer, 18)
    train(train_config(tmp_path, cache_target=True, max_minutes=1e-9), target, tokenizer,
          progress=False)
    state = torch.load(tmp_path / STATE_FILE, weights_only=True)
    counts = torch.rand(target.vocab_size, generator=torch.Generator().manual_seed(0))
    d2t, t2d = draft_vocabulary(counts, 4096)
    state["head"]["d2t"], state["head"]["t2d"] = d2t, t2d
    torch.save(state, tmp_path / STATE_FILE)
    built = []

    class Recording(target_cache.TargetCache):
        def __init__(self, *args):
            super().__init__(*args)
            built.append(self.draft_ids.clone())

    monkeypatch.setattr(target_cache, "TargetCache", Recording)
    train(train_config(tmp_path, cache_target=True), target, tokenizer, progress=False)
    assert len(built) == 1 and torch.equal(built[0], torch.arange(4096) + d2t)


def test_an_eagle1_run_resumed_ends_where_an_uninterrupted_one_does(tokenizer, tmp_path):
    """EAGLE-1 draws input noise every step: each step's seed is a function of the run's seed
    and the step, so an interrupted run resumed draws what an uninterrupted one drew. Log
    lines written after the last save (a crash) are cut on resume."""
    from eagle_kernels.train import train

    target = frozen_target(tokenizer, 19)
    settings = dict(kind="eagle1", ttt_steps=0, draft_vocab=8192)
    whole = train(train_config(tmp_path / "whole", **settings), target, tokenizer,
                  progress=False)
    assert whole["finished"] and whole["steps_total"] >= 3
    first = train(train_config(tmp_path / "split", max_minutes=1e-9, **settings), target,
                  tokenizer, progress=False)
    assert first["steps_done"] == 1
    with open(tmp_path / "split" / "train_log.jsonl", "a") as log:  # a step never saved
        log.write(json.dumps({"step": 2, "loss": 0.0}) + "\n" + '{"step": 3, "lo')
    assert train(train_config(tmp_path / "split", **settings), target, tokenizer,
                 progress=False)["finished"]
    logs = [[json.loads(line) for line in open(tmp_path / name / "train_log.jsonl")]
            for name in ("whole", "split")]
    assert [r["step"] for r in logs[1]] == list(range(1, whole["steps_total"] + 1))
    assert [r["loss"] for r in logs[1]] == [r["loss"] for r in logs[0]]
    heads = [load_draft_head(tmp_path / name, target) for name in ("whole", "split")]
    for (name, a), b in zip(heads[0].state_dict().items(), heads[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


# ------------------------------------------------------------------------------ vocabulary


def test_a_target_vocabulary_padded_past_the_tokenizer_trains(tokenizer, tmp_path):
    """Qwen2.5 has 151665 tokens and 151936 embedding rows: the counts follow the target's
    rows (the padded ones never drafted), not the tokenizer's length."""
    from eagle_kernels.train import train

    target = frozen_target(tokenizer, 20, extra_rows=11)
    assert train(train_config(tmp_path), target, tokenizer, progress=False)["finished"]
    head = load_draft_head(tmp_path, target)
    assert head.t2d.numel() == len(tokenizer) + 11 and not head.t2d[len(tokenizer):].any()
    assert bool(head.t2d[training.draft_vocab_ids(head)].all())


def test_a_tokenizer_with_ids_past_the_targets_vocabulary_is_refused(tokenizer, tmp_path):
    from eagle_kernels.train import train

    target = tiny_target(seed=21, vocab=300)
    target.requires_grad_(False)
    with pytest.raises(ValueError, match="tokenizer: expected token ids below the target's "
                                         "vocabulary size 300, got"):
        train(train_config(tmp_path, draft_vocab=64), target, tokenizer, progress=False)


# ------------------------------------------------------------------------------ config


def test_train_config_refuses_unknown_dtypes_backends_and_eagle3_settings_for_eagle1(tmp_path):
    from eagle_kernels.train import TrainConfig

    for overrides, message in (
            ({"export_dtype": "bf16"}, r"export_dtype: expected one of \[.*'bfloat16'.*\], "
                                       r"got 'bf16'"),
            ({"loss_backend": "nonsense"}, r"loss_backend: expected one of \('auto', .*'torch'"
                                           r".*\), got 'nonsense'"),
            ({"kind": "eagle1", "ttt_steps": 3}, r"ttt_steps: an EAGLE-3 setting, expected 0"),
            ({"kind": "eagle1", "target_temperature": 0.5}, r"target_temperature: an EAGLE-3"),
            ({"kind": "eagle1", "cache_target": True}, r"cache_target: an EAGLE-3"),
            ({"kind": "eagle1", "draft_vocab": 4096}, r"draft_vocab: an EAGLE-3"),
            ({"kind": "eagle1", "loss_backend": "torch"}, r"loss_backend: an EAGLE-3")):
        with pytest.raises(ValueError, match=message):
            TrainConfig(out=str(tmp_path), **overrides)
    TrainConfig(out=str(tmp_path), loss_backend="triton", export_dtype="float16")


def test_the_cli_trains_eagle1_heads_with_its_defaults(tmp_path):
    from eagle_kernels.cli import _check_train, parser

    args = parser().parse_args(["train", "--out", str(tmp_path), "--kind", "eagle1"])
    assert _check_train(args).kind == "eagle1"
