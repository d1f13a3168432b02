"""bench/e2e/bench_llama_cpp.py without llama.cpp: what it reads from llama-completion's and
llama-lookup's output (in the formats they print), how it compares replies, and its table."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench():
    for folder in ("kernels", "e2e"):
        sys.path.insert(0, str(ROOT / "bench" / folder))
    spec = importlib.util.spec_from_file_location("bench_llama_cpp",
                                                  ROOT / "bench/e2e/bench_llama_cpp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Lines as llama-completion prints them (--verbose-prompt, perf at the end); a newline piece
# spans two lines.
COMPLETION_STDERR = """\
0.00.483.911 I main: number of tokens in prompt = 4
0.00.483.914 I      1 -> '<|im_start|>'
0.00.483.916 I   9690 -> 'system'
0.00.483.916 I    198 -> '
'
0.00.483.918 I   2683 -> 'You'
0.00.483.941 I 
0.00.483.952 I sampler seed: 0
0.00.483.968 I sampler params: repeat_last_n = 64
0.00.746.263 I common_perf_print:    sampling time =       2.03 ms
0.00.746.265 I common_perf_print:    samplers time =       0.60 ms /    53 tokens
0.00.746.271 I common_perf_print:        load time =     282.60 ms
0.00.746.272 I common_perf_print: prompt eval time =     129.87 ms /    38 tokens (    3.42 ms per token,   292.61 tokens per second)
0.00.746.275 I common_perf_print:        eval time =     129.18 ms /    14 runs   (    9.23 ms per token,   108.38 tokens per second)
0.00.746.276 I common_perf_print:       total time =     263.09 ms /    52 tokens
"""

LOOKUP_STDERR = """\
0.01.000.000 I encoded   38 tokens in    0.130 seconds, speed:  292.000 t/s
0.01.000.001 I decoded  130 tokens in    1.250 seconds, speed:  104.000 t/s
0.01.000.002 I 
0.01.000.003 I n_draft      = 16
0.01.000.004 I n_predict    = 130
0.01.000.005 I n_drafted    = 48
0.01.000.006 I t_draft_flat = 0.01 ms
0.01.000.007 I n_accept     = 21
"""


def test_completion_output_gives_reply_ids_and_times():
    bench = load_bench()
    got = bench.parse_completion("Hello there. [end of text]\n\n\n", COMPLETION_STDERR)
    assert got["text"] == "Hello there."  # EOS
    assert got["prompt_ids"] == [1, 9690, 198, 2683]
    assert got["tokens"] == 15 and got["decode_steps"] == 14  # the first from the prompt's pass
    assert got["seconds"] == pytest.approx(0.26309)  # total: prompt eval + eval + sampling
    assert got["decode_seconds"] == pytest.approx(0.12918)
    # a reply cut by the budget keeps its own text, its closing newlines included (code often
    # ends a line there, and ours keeps them)
    assert bench.parse_completion("def f():\n    return 1\n\n\n", COMPLETION_STDERR)["text"] == \
        "def f():\n    return 1\n"
    assert bench.parse_completion("a [end of text] b\n\n", COMPLETION_STDERR)["text"] == \
        "a [end of text] b"


def test_completion_without_timings_or_prompt_ids_is_refused():
    bench = load_bench()
    no_perf = COMPLETION_STDERR.split("common_perf_print")[0]
    with pytest.raises(RuntimeError, match="no timings"):
        bench.parse_completion("x", no_perf)
    # a log without the level prefix (--no-log-prefix) lists ids the parser cannot read: said,
    # not taken for a prompt llama.cpp tokenized otherwise
    unprefixed = COMPLETION_STDERR.replace(" I    ", " ").replace(" I  ", " ")
    with pytest.raises(RuntimeError, match="verbose-prompt"):
        bench.parse_completion("x", unprefixed)


def test_lookup_output_gives_reply_after_the_echoed_prompt():
    bench = load_bench()
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    got = bench.parse_lookup("\n\n" + prompt + "Hi!<|im_end|>\n\n\n\n", LOOKUP_STDERR, prompt)
    assert got["text"] == "Hi!<|im_end|>"
    cut = bench.parse_lookup("\n\n" + prompt + "x = 1\n\n\n\n\n", LOOKUP_STDERR, prompt)
    assert cut["text"] == "x = 1\n"  # its own closing newline kept
    assert bench.without_end_marks(got["text"], ["<|im_end|>"]) == "Hi!"
    assert (got["tokens"], got["drafted"], got["accepted"]) == (130, 48, 21)
    assert got["seconds"] == pytest.approx(1.38)
    with pytest.raises(RuntimeError, match="other than"):
        bench.parse_lookup("\n\nanother prompt\n\n", LOOKUP_STDERR, prompt)
    with pytest.raises(RuntimeError, match="no timings"):
        bench.parse_lookup("\n\n" + prompt, "nothing", prompt)


def test_replies_compare_with_their_reference():
    bench = load_bench()
    results = {"ours-ar": {"ids": [1, 2], "text": "ab"}, "ours-eagle": {"ids": [1, 2]},
               "llama.cpp": {"text": "ab"}, "llama.cpp-lookup-16": {"text": "abc"},
               "llama.cpp-lookup-4": {"text": "ab"}}
    same = bench.same_outputs(results)
    assert all(same.values()) and len(same) == 5  # lookup-16 ran one token past the budget
    results["ours-eagle"]["ids"] = [1, 3]
    results["llama.cpp"]["text"] = "ax"
    same = bench.same_outputs(results)
    assert not any(same[m] for m in ("ours-eagle", "llama.cpp", "llama.cpp-lookup-16",
                                     "llama.cpp-lookup-4"))
    assert [bench.reference(m) for m in bench.method_names([16, 4])] == \
        ["ours-ar"] * 3 + ["llama.cpp"] * 2
    assert [bench.lookup_draft(m) for m in bench.method_names([16, 4])] == [None] * 3 + [16, 4]
    assert bench.common_prefix("abcd", "abxd") == 2


def test_table_ratios_and_floors():
    bench = load_bench()
    row = dict(tokens=100, seconds=1.0, decode_seconds=0.9, decode_steps=90, same=3, compared=4,
               prompt_ids_equal=0, drafted=0, accepted=0, prefix_chars=50, chars=100)
    totals = {"ours-ar": row, "ours-eagle": {**row, "seconds": 0.8},
              "llama.cpp": {**row, "seconds": 2.0, "decode_seconds": 1.8, "compared": 3,
                            "prompt_ids_equal": 3},
              "llama.cpp-lookup-4": {**row, "seconds": 2.5, "drafted": 40, "accepted": 10}}
    rows = {r["method"]: r for r in bench.table({"s": totals}, {"s": 4},
                                                 {"ours_ms": 2.0, "llama_cpp_ms": 1.0})}
    assert rows["ours-eagle"]["x_ours_ar"] == 1.25 and rows["ours-ar"]["x_llama_cpp"] == 2.0
    assert rows["llama.cpp-lookup-4"]["x_llama_cpp"] == 0.8
    # decode ms / token over the floor of the bytes each code reads; plain methods only
    assert (rows["ours-ar"]["decode_ms_per_token"], rows["ours-ar"]["x_floor"]) == (10.0, 5.0)
    assert (rows["llama.cpp"]["decode_ms_per_token"], rows["llama.cpp"]["x_floor"]) == (20.0, 20.0)
    assert rows["ours-eagle"]["x_floor"] == "" and rows["llama.cpp-lookup-4"]["floor_ms"] == ""
    assert rows["llama.cpp-lookup-4"]["same_as"] == "llama.cpp"
    # replies compared only where llama.cpp read our prompt ids (3 of the 4 prompts)
    assert rows["llama.cpp"]["same_outputs"] == "3/3"
    assert (rows["llama.cpp"]["prompt_ids_equal"], rows["ours-ar"]["prompt_ids_equal"]) == ("3/4", "")
    assert (rows["llama.cpp-lookup-4"]["drafted"], rows["ours-ar"]["drafted"]) == (40, "")


def test_gguf_bytes_leave_out_an_untied_embedding_table(monkeypatch):
    bench = load_bench()
    import gguf

    tensors = [SimpleNamespace(name="token_embd.weight", n_bytes=1000),
               SimpleNamespace(name="blk.0.attn_q.weight", n_bytes=30)]
    monkeypatch.setattr(gguf, "GGUFReader", lambda path: SimpleNamespace(tensors=tensors))
    assert bench.gguf_step_bytes(Path("x.gguf")) == 1030  # tied: it is the output matrix
    tensors.append(SimpleNamespace(name="output.weight", n_bytes=1000))
    assert bench.gguf_step_bytes(Path("x.gguf")) == 1030


def test_missing_binaries_are_named(tmp_path):
    bench = load_bench()
    with pytest.raises(SystemExit, match="llama-completion"):
        bench.find_binaries(tmp_path)
    (tmp_path / "bin").mkdir()
    for name in bench.BINARIES.values():
        (tmp_path / "bin" / name).write_text("")
    assert set(bench.find_binaries(tmp_path)) == set(bench.BINARIES)


def test_results_page_renders_the_run_from_its_json(tmp_path):
    """bench/make_results.py lays llama_cpp.json out as its own table (with the llama.cpp commit
    and the bandwidth), not the CSV by its first columns."""
    import json

    spec = importlib.util.spec_from_file_location("make_results",
                                                  ROOT / "bench" / "make_results.py")
    results = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(results)
    run = tmp_path / "2026-01-06_cpu"
    run.mkdir()
    row = {"set": "sharegpt", "method": "llama.cpp", "tokens_per_s": 90.6, "x_ours_ar": 0.588,
           "x_llama_cpp": 1.0, "decode_ms_per_token": 8.735, "x_floor": 2.95,
           "same_as": "ours-ar", "same_outputs": "2/24", "prompt_ids_equal": "24/24"}
    env = {"device": "CPU", "torch": "2.13", "date": "2026-01-06", "commit": "abc",
           "llama_cpp": "unknown", "llama_cpp_commit": "0253fb21f"}
    (run / "llama_cpp.json").write_text(json.dumps(
        {"environment": env, "rows": [row], "threads": 2, "read_bandwidth_gb_s": [32.3, 33.0],
         "command": "python bench/e2e/bench_llama_cpp.py"}))
    (run / "llama_cpp.csv").write_text("set,method,tokens_per_s\nsharegpt,llama.cpp,90.6\n")
    text = results.build(tmp_path)
    assert "### Ours vs llama.cpp — `2026-01-06_cpu`" in text and "llama.cpp 0253fb21f" in text
    assert ("| sharegpt | llama.cpp | 90.6 | 0.588 | 1.0 | 8.735 | 2.95 | ours-ar | 2/24 |  | "
            "24/24 |  |  |") in text  # columns a run lacks (common prefix, drafts) stay empty
    assert "32.3 / 33.0 GB/s" in text
    assert "static n-gram cache" not in text  # none given to that run
    assert "llama_cpp.csv" not in text


def test_lookup_runs_with_its_draft_size(monkeypatch):
    bench = load_bench()
    seen = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        return SimpleNamespace(returncode=0, stdout="\n\npromptHi\n\n\n\n", stderr=LOOKUP_STDERR)

    monkeypatch.setattr(bench.subprocess, "run", run)
    args = SimpleNamespace(max_new_tokens=8, threads=2)
    assert bench.run_lookup(Path("llama-lookup"), Path("m.gguf"), "prompt", 4, args)["text"] == "Hi"
    assert seen[0][-2:] == ["--spec-draft-n-max", "4"] and "--temp" in seen[0]
    args.lookup_static = Path("replies.bin")  # its static n-gram cache, when given
    bench.run_lookup(Path("llama-lookup"), Path("m.gguf"), "prompt", 4, args)
    assert seen[1][-4:] == ["--spec-draft-n-max", "4", "-lcs", "replies.bin"]


def test_tally_compares_llama_cpp_only_where_it_read_our_ids():
    bench = load_bench()
    methods = bench.method_names([4])
    totals = {m: dict.fromkeys(bench.TALLIED + ("same", "compared", "prompt_ids_equal",
                                               "prefix_chars", "chars"), 0) for m in methods}
    timing = {"tokens": 3, "seconds": 1.0, "decode_seconds": 0.5, "decode_steps": 2}
    results = {"ours-ar": {**timing, "ids": [5, 6], "text": "ab"},
               "ours-eagle": {**timing, "ids": [5, 6], "text": "ab"},
               "llama.cpp": {**timing, "text": "ab", "prompt_ids": [1, 2]},
               "llama.cpp-lookup-4": {**timing, "text": "ab", "drafted": 4, "accepted": 2}}
    bench.tally(totals, results, [1, 2])
    results["llama.cpp"] = {**timing, "text": "zz", "prompt_ids": [1, 3]}
    results["llama.cpp-lookup-4"]["text"] = "zz"
    bench.tally(totals, results, [1, 2])  # llama.cpp read other ids for this prompt
    plain = totals["llama.cpp"]
    assert (plain["tokens"], plain["seconds"]) == (6, 2.0)  # timed both times
    assert (plain["compared"], plain["same"], plain["prompt_ids_equal"]) == (1, 1, 1)
    lookup = totals["llama.cpp-lookup-4"]  # compared with llama.cpp's reply either way
    assert (lookup["compared"], lookup["same"], lookup["drafted"]) == (2, 2, 8)
    assert (totals["ours-eagle"]["compared"], totals["ours-eagle"]["same"]) == (2, 2)
