"""The command line reports user errors as one ``error: ...`` line on stderr, status 2.

Every case here fails before any model loads (``from_pretrained`` is replaced by a function
that fails the test), so they run in milliseconds in-process; one subprocess run checks the
real ``python -m eagle_kernels`` entry point prints no traceback.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from eagle_kernels import cli

from cpu_support import needs_cpu_backend, q4_exact_layers


@pytest.fixture
def no_model(monkeypatch):
    def load(*args, **kwargs):
        raise AssertionError("a model was loaded: the error should have been caught before")

    monkeypatch.setattr("eagle_kernels.runtime.api.from_pretrained", load)


def run_cli(argv, capsys) -> str:
    """stderr of ``main(argv)``, which must exit with status 2."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("argv, expected", [
    (["--draft", "/nonexistent/head"], r"--draft: .*config\.json.*/nonexistent/head"),
    (["--temperature", "-1"], r"--temperature: expected a finite float >= 0, got -1"),
    (["--temperature", "nan"], r"--temperature: expected a finite float >= 0"),
    (["--temperature", "inf"], r"--temperature: expected a finite float >= 0, got inf"),
    (["--top-p", "0"], r"--top-p: expected a finite float > 0, got 0"),
    (["--top-p", "1.5"], r"--top-p: expected 0 < top-p <= 1, got 1.5"),
    (["--top-k", "-2"], r"--top-k: expected an int in \[0, 2147483647\], got -2"),
    (["--top-k", "99999999999"], r"--top-k: expected an int in \[0, 2147483647\]"),
    (["--seed", str(10 ** 23)], r"--seed: expected an int in"),
    (["--max-new-tokens", "0"], r"--max-new-tokens: expected >= 1, got 0"),
    (["--target", "/nonexistent/model"], r"--target: .*config\.json.*/nonexistent/model"),
    (["--target", "/nonexistent/model.gguf"], r"--target: no such GGUF file"),
    (["--tree", "4,3"], r"argument --tree: expected 'auto' or TOP_K,DEPTH,TOTAL_TOKENS"),
    (["--tree", "a,b,c"], r"argument --tree: expected 'auto' or TOP_K,DEPTH,TOTAL_TOKENS"),
    (["--tree", "2,1,50"], r"argument --tree: total_tokens: expected <= 7"),
    (["--stream", "--compare"], r"--stream takes one prompt"),
    (["--dtype", "int8"], r"argument --dtype: invalid choice"),
    (["--tree", "1000000,1000000,1000000"], r"argument --tree: top_k: expected an int in \[1, "),
    (["--tree", "4,2000,8"], r"argument --tree: depth: expected an int in \[0, 1024\]"),
    (["--device", "meta"], r"--device: expected cpu, cuda or cuda:N, got 'meta'"),
    (["--activations", "int4"], r"argument --activations: invalid choice"),
    (["--draft", "none", "--tree", "2,1,3"], r"--tree: shapes drafting, and --draft none"),
    (["--draft", "none", "--draft-weights", "q8_0"], r"--draft-weights: shapes drafting"),
])
def test_generate_user_errors_are_one_line_and_status_2(argv, expected, capsys, no_model):
    err = run_cli(["generate", *argv], capsys)
    assert re.search(expected, err), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cuda_device_without_a_gpu_is_a_user_error(capsys, no_model):
    assert "--device: cuda" in run_cli(["generate", "--device", "cuda"], capsys)


def test_train_user_errors_are_one_line_and_status_2(capsys, no_model, tmp_path):
    run_cli(["train"], capsys)  # --out is required
    err = run_cli(["train", "--out", str(tmp_path), "--target", str(tmp_path / "absent")],
                  capsys)
    assert "--target" in err
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for argv, expected in ((["--out", str(a_file)], r"--out: expected a directory"),
                           (["--data-dir", str(a_file)], r"--data-dir: expected a directory"),
                           (["--threads", "-1"], r"--threads: expected an int >= 0, got -1"),
                           (["--save-every", "0"], r"--save-every: expected an int >= 1"),
                           (["--epochs", "0"], r"--epochs: expected an int >= 1"),
                           (["--regenerate-batch", "0"], r"--regenerate-batch: expected"),
                           (["--lr", "nan"], r"--lr: expected a finite float > 0"),
                           (["--target-temperature", "0"],
                            r"--target-temperature: expected a finite float > 0"),
                           (["--max-minutes", "-1"], r"--max-minutes: expected a finite"),
                           (["--init-from", str(tmp_path / "none")], r"--init-from: expected"),
                           (["--device", "meta"], r"--device: expected cpu")):
        argv = argv if argv[0] == "--out" else ["--out", str(tmp_path / "run"), *argv]
        err = run_cli(["train", *argv], capsys)
        assert re.search(expected, err), err


def test_train_folders_that_cannot_be_made_are_one_line_naming_the_option(capsys, no_model,
                                                                           tmp_path):
    """--data-dir / --out that cannot be created (under a file, an OS-refused place): one line
    naming the option, before the model loads (they raised OSError tracebacks from inside the
    trainer), and the folders made for the other option removed again."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    err = run_cli(["train", "--out", str(tmp_path / "run" / "deep"), "--data-dir",
                   str(a_file / "x")], capsys)
    assert re.search(r"--data-dir: cannot create the directory .*a_file/x", err), err
    err = run_cli(["train", "--out", str(a_file / "y"), "--data-dir",
                   str(tmp_path / "data" / "deep")], capsys)
    assert re.search(r"--out: cannot create the directory .*a_file/y", err), err
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


def test_errors_raised_after_loading_are_one_line_too(capsys, monkeypatch):
    """A checkpoint that does not fit the target is only found while loading: ValueError."""
    def load(*args, **kwargs):
        raise ValueError("draft config.vocab_size: expected the target's 49152,\ngot 32000")

    monkeypatch.setattr("eagle_kernels.runtime.api.from_pretrained", load)
    err = run_cli(["generate", "--draft", "random-eagle3"], capsys)
    assert err == "error: draft config.vocab_size: expected the target's 49152, got 32000\n"
    # a directory without a tokenizer (transformers: OSError), a file it may not read: one
    # line too, not a traceback
    for error in (OSError("Can't load tokenizer for '/models/x'"),
                  PermissionError(13, "Permission denied", "/models/x/config.json")):
        monkeypatch.setattr("eagle_kernels.runtime.api.from_pretrained",
                            lambda *args, error=error, **kwargs: (_ for _ in ()).throw(error))
        assert run_cli(["generate"], capsys) == f"error: {error}\n"


def test_module_entry_point_prints_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "eagle_kernels", "generate", "--draft",
                             str(tmp_path / "missing")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: --draft")


@needs_cpu_backend
def test_activations_warning_names_targets_the_mode_leaves_alone(gen):
    """--activations int16 / int8 over a target whose layers are not GGUF blocks in fp32 on the
    CPU changes nothing: the CLI says so in one line; over 4-bit block layers (and for fp32)
    it says nothing."""
    from runtime_helpers import tiny_target

    target = tiny_target(seed=int(torch.randint(1000, (1,), generator=gen)))
    assert cli.activations_warning(target, "fp32") is None
    warning = cli.activations_warning(target, "int8")
    assert warning.startswith("--activations int8 changes nothing here") and "\n" not in warning
    assert "(float32 on cpu)" in warning
    q4_exact_layers(target)
    assert cli.activations_warning(target, "int16") is None


def test_compare_alternates_the_modes_and_reports_each_rounds_speedup():
    """--compare runs COMPARE_ROUNDS rounds of one call per mode, alternating which goes first
    (the call already printed, a process's first, is not timed again), and reports each
    round's speedup within the round; one call whose tokens differ makes the outputs not
    identical."""
    from types import SimpleNamespace

    calls = []
    speed = {True: [110.0, 200.0, 150.0], False: [100.0, 120.0, 90.0]}  # tokens/s, call order

    class Generator:
        engine = SimpleNamespace(head=object())

        def generate(self, prompts, speculative, **options):
            calls.append(speculative)
            tokens = [[1, 2, 3]] if len(calls) != 5 else [[1, 2, 4]]
            return SimpleNamespace(tokens=tokens, stats=SimpleNamespace(
                tokens_per_second=speed[speculative].pop(0)))

    first = SimpleNamespace(tokens=[[1, 2, 3]], stats=SimpleNamespace(tokens_per_second=50.0))
    assert cli.COMPARE_ROUNDS == 3
    base, speedups, same = cli.compare(Generator(), ["hi"], {}, first)
    assert calls == [True, False, False, True, True, False]
    assert speedups == [110 / 100, 200 / 120, 150 / 90] and base.stats.tokens_per_second == 100
    assert not same  # the fifth call's tokens differ


def test_stream_without_a_head_decodes_plainly(monkeypatch, capsys):
    """--draft none --stream asked the API for speculative decoding (its default) and failed
    with "no draft head loaded" after loading the model: a valid pair of options."""
    from types import SimpleNamespace

    asked = []

    class Stream:
        output = SimpleNamespace(stats=SimpleNamespace(summary=lambda: {}))

        def __iter__(self):
            return iter(["a reply"])

    class Generator:
        engine = SimpleNamespace(head=None, prompt_lookup=True)

        def stream(self, prompt, speculative, **options):
            asked.append(speculative)
            return Stream()

    monkeypatch.setattr("eagle_kernels.runtime.api.from_pretrained",
                        lambda *args, **kwargs: Generator())
    assert cli.main(["generate", "--draft", "none", "--stream"]) == 0
    assert asked == [False] and "a reply" in capsys.readouterr().out
