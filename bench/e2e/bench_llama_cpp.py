"""Ours beside llama.cpp on this CPU: the same GGUF weights, the same prompts, one run.

llama.cpp is what a CPU user runs a GGUF model with, so it is the peer of this project's CPU
path. Both run the default target from the same file (SmolLM2-135M-Instruct.Q4_1.gguf: ours
packs its blocks unchanged, llama.cpp reads them as they are), batch 1, greedy, the same
threads, stopping at EOS or ``--max-new-tokens``. Per held-out prompt each method answers once,
in an order that rotates from prompt to prompt (this VM's speed drifts over minutes):

* ``ours-ar``           this runtime's plain decoding (fp32 activations);
* ``ours-eagle``        its speculative decoding as ``from_pretrained()`` runs it (the tree
                        budget's tree, context and reply-store drafts, plain steps where no tree
                        pays);
* ``llama.cpp``         ``llama-completion`` (plain decoding; its Q4_1 dot products round the
                        activations to 8 bits, as llama.cpp does on every CPU);
* ``llama.cpp-lookup-N``  ``llama-lookup --spec-draft-n-max N`` for each N of ``--lookup-drafts``:
                        llama.cpp's prompt-lookup speculative decoding (n-gram drafts from the
                        context, up to N tokens a pass), the speculative peer that needs no
                        draft model (16, its default, and a short one: 4); with
                        ``--lookup-static CACHE`` also from a static n-gram cache
                        (``llama-lookup-create``), its analog of our reply store.

llama.cpp gets the exact text of the chat-templated prompt; the token ids it reads
(``--verbose-prompt``) are checked against ours, and where its tokenizer split the text otherwise
(a few HumanEval prompts: ``prompt_ids_equal``), the two codes' replies are not compared. Time is
each method's own: ours the call's prefill + decode wall time (token ids to token ids);
llama-completion its perf "total time" (from its perf reset after loading, so its thread pools,
tokenizing and --verbose-prompt logging, ~2 ms a call, count against it); llama-lookup its
encode + decode times (process start and model load are left out of every method). Tokens:
ours and llama-completion count the reply with its EOS; llama-lookup's own count, which may run
past the budget (it stops once it passed it) and include tokens drafted after an EOS: a slight
advantage to it. Decode-only milliseconds per
token are compared with the memory floor of the bytes each reads per token (ours: its packs;
llama.cpp: the GGUF's tensors) over the read bandwidth measured in the same run (bench_cpu.py's
measurement, before and after the calls).

Outputs: ours-eagle must equal ours-ar token for token, and llama-lookup llama-completion's
text. Across the two codes the texts are compared (they need not match: llama.cpp rounds its
activations, ours does not). Writes ``llama_cpp.csv`` / ``.json`` / ``.png`` under ``--out``.

Build llama.cpp for this CPU first (no network needed; how it was built from a source archive,
and the commit: bench/results/2026-11-29b_cpu-2core/README.md):

    cmake -S llama.cpp -B llama.cpp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \\
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \\
        -DGGML_OPENMP=ON
    cmake --build llama.cpp/build -j2 --target llama-completion llama-lookup
    python bench/e2e/bench_llama_cpp.py --llama-cpp llama.cpp/build --llama-cpp-commit SHA
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import InARow, bandwidth_calls, step_bytes  # noqa: E402
from common import append_rows, environment, plot_bars  # noqa: E402

from eagle_kernels.runtime.tree_budget import interleaved_medians  # noqa: E402

PLAIN_METHODS = ("ours-ar", "ours-eagle", "llama.cpp")
LOOKUP = "llama.cpp-lookup"  # a method "llama.cpp-lookup-N" drafts up to N tokens a pass
BINARIES = {"llama.cpp": "llama-completion", LOOKUP: "llama-lookup"}
LOOKUP_DRAFTS = (16, 4)  # llama-lookup's default draft length, and a short one
CONTEXT = 2048          # llama.cpp's context (prompt + reply; the longest held-out prompt fits)
BANDWIDTH_MB = 1024     # buffer streamed to measure the read bandwidth (bench_cpu's size)
BANDWIDTH_ROUNDS = 5
# what every call reports and a set's totals add up (lookup's draft counts: 0 for the others)
TALLIED = ("tokens", "seconds", "decode_seconds", "decode_steps", "drafted", "accepted")

_PERF = re.compile(r"(prompt eval|eval|total) time =\s*([\d.]+) ms /\s*(\d+) (?:tokens|runs)")
# What the binaries print around a reply on stdout: llama-completion the reply, " [end of
# text]\n" at EOS, then "\n\n"; llama-lookup "\n\n", the prompt's pieces, the reply's, then
# "\n\n" twice.
END_OF_TEXT = " [end of text]\n"
COMPLETION_TAIL = "\n\n"
LOOKUP_HEAD, LOOKUP_TAIL = "\n\n", "\n\n\n\n"
_LOOKUP_TIME = re.compile(r"(encoded|decoded)\s+(\d+) tokens in\s+([\d.]+) seconds")
_LOOKUP_COUNT = re.compile(r"(n_drafted|n_accept)\s*=\s*(\d+)")
_PROMPT_ID = re.compile(r" I\s+(\d+) -> '")  # --verbose-prompt: "<time> I <id> -> '<piece>'"
_PROMPT_COUNT = re.compile(r"number of tokens in prompt = (\d+)")
_VERSION = re.compile(r"version: (\d+) \(([0-9a-f]+)\)")


def method_names(lookup_drafts) -> tuple[str, ...]:
    return PLAIN_METHODS + tuple(f"{LOOKUP}-{n}" for n in lookup_drafts)


def lookup_draft(method: str) -> int | None:
    """N of a ``llama.cpp-lookup-N`` method, else None."""
    return int(method[len(LOOKUP) + 1:]) if method.startswith(LOOKUP + "-") else None


def reference(method: str) -> str:
    """The method whose output ``method``'s is compared with (ours-ar's is its own)."""
    return "llama.cpp" if lookup_draft(method) is not None else "ours-ar"


def find_binaries(build: Path) -> dict[str, Path]:
    """llama-completion and llama-lookup under ``build`` (or its bin/)."""
    found = {}
    for method, name in BINARIES.items():
        candidates = [build / "bin" / name, build / name]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            raise SystemExit(f"--llama-cpp: no {name} under {build} (build it: see this file's "
                             f"docstring)")
        found[method] = path
    return found


def llama_cpp_version(binary: Path) -> str:
    """``build N (commit)`` as the binary reports it."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    match = _VERSION.search(out.stdout + out.stderr)
    return f"build {match.group(1)} ({match.group(2)})" if match else "unknown"


def _common_flags(gguf: Path, text: str, args) -> list[str]:
    return ["-m", str(gguf), "-p", text, "-n", str(args.max_new_tokens), "-t", str(args.threads),
            "-tb", str(args.threads), "-c", str(CONTEXT), "--temp", "0", "-s", "0"]


def run_completion(binary: Path, gguf: Path, text: str, args, extra: tuple = ()) -> dict:
    """llama-completion's reply text, its prompt ids and its own timings (``extra``: more
    flags)."""
    cmd = [str(binary), *_common_flags(gguf, text, args), "-no-cnv", "--no-display-prompt",
           "--verbose-prompt", "--simple-io", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"llama-completion failed ({out.returncode}): {out.stderr[-2000:]}")
    return parse_completion(out.stdout, out.stderr)


def parse_completion(stdout: str, stderr: str) -> dict:
    """What llama-completion printed: the reply on stdout (" [end of text]" at EOS), the prompt's
    ids (--verbose-prompt) and its perf lines on stderr."""
    perf = {name: (float(ms), int(count)) for name, ms, count in _PERF.findall(stderr)}
    if set(perf) != {"prompt eval", "eval", "total"}:
        raise RuntimeError(f"llama-completion printed no timings: {stderr[-2000:]}")
    eval_ms, runs = perf["eval"]
    count = _PROMPT_COUNT.search(stderr)
    head = stderr.split("number of tokens in prompt", 1)[-1].split("sampler seed", 1)[0]
    prompt_ids = [int(i) for i in _PROMPT_ID.findall(head)]
    if count is None or len(prompt_ids) != int(count.group(1)):
        raise RuntimeError("llama-completion's --verbose-prompt listing was not read (a log "
                           "format without the ' I ' level prefix?)")
    text = stdout.removesuffix(COMPLETION_TAIL).removesuffix(END_OF_TEXT)
    return {"text": text, "tokens": runs + 1,  # the first token comes from the prompt's pass
            # from llama.cpp's perf reset to its perf print: prompt eval, eval, sampling and
            # what it does between them
            "seconds": perf["total"][0] / 1e3,
            "decode_seconds": eval_ms / 1e3, "decode_steps": runs,
            "prompt_ids": prompt_ids}


def run_lookup(binary: Path, gguf: Path, text: str, draft: int, args) -> dict:
    """llama-lookup's reply text (its stdout after the prompt it echoes), tokens and times."""
    cmd = [str(binary), *_common_flags(gguf, text, args), "--spec-draft-n-max", str(draft)]
    if getattr(args, "lookup_static", None):
        cmd += ["-lcs", str(args.lookup_static)]
    out = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"llama-lookup failed ({out.returncode}): {out.stderr[-2000:]}")
    return parse_lookup(out.stdout, out.stderr, text)


def parse_lookup(stdout: str, stderr: str, prompt: str) -> dict:
    """What llama-lookup printed: the pieces of ``prompt`` (as it read it), then the reply's on
    stdout, its encode / decode times and draft counts on stderr."""
    times = {kind: (int(n), float(s)) for kind, n, s in _LOOKUP_TIME.findall(stderr)}
    counts = {name: int(value) for name, value in _LOOKUP_COUNT.findall(stderr)}
    if set(times) != {"encoded", "decoded"}:
        raise RuntimeError(f"llama-lookup printed no timings: {stderr[-2000:]}")
    reply = stdout.removeprefix(LOOKUP_HEAD).removesuffix(LOOKUP_TAIL)
    if not reply.startswith(prompt):
        raise RuntimeError("llama-lookup echoed a prompt other than the one it was given")
    return {"text": reply[len(prompt):], "tokens": times["decoded"][0],
            "seconds": times["encoded"][1] + times["decoded"][1],
            "drafted": counts.get("n_drafted", 0), "accepted": counts.get("n_accept", 0)}


def without_end_marks(text: str, marks: list[str]) -> str:
    """``text`` up to the first end-of-turn mark (llama-lookup prints special tokens)."""
    for mark in marks:
        if mark and mark in text:
            text = text[:text.index(mark)]
    return text


def common_prefix(a: str, b: str) -> int:
    """Characters ``a`` and ``b`` share from their start."""
    return len(os.path.commonprefix([a, b]))


def run_ours(generator, ids: list[int], speculative: bool, args, eos) -> dict:
    out = generator.engine.generate([ids], args.max_new_tokens, eos_token_ids=eos,
                                    speculative=speculative)
    stats, tokens = out.stats, out.tokens[0]
    return {"ids": tokens, "tokens": len(tokens),
            "seconds": stats.prefill_seconds + stats.decode_seconds,
            "decode_seconds": stats.decode_seconds, "decode_steps": max(len(tokens) - 1, 0),
            "text": generator.tokenizer.decode(tokens, skip_special_tokens=True)}


def run_set(generator, binaries: dict, gguf: Path, prompts: list[str], args, turn: int) -> dict:
    methods = method_names(args.lookup_drafts)
    tokenizer = generator.tokenizer
    eos = generator.eos_token_ids()
    marks = [tokenizer.decode([t]) for t in eos]
    totals = {m: dict.fromkeys(TALLIED + ("same", "compared", "prompt_ids_equal",
                                          "prefix_chars", "chars"), 0) for m in methods}
    for prompt in tqdm(prompts, desc="prompts"):
        ids = generator.encode(prompt)
        text = tokenizer.decode(ids)  # the chat-templated prompt, special tokens as text
        order = methods[turn % len(methods):] + methods[:turn % len(methods)]
        turn += 1
        results = {}
        for method in order:
            if method == "llama.cpp":
                results[method] = run_completion(binaries[method], gguf, text, args)
            elif lookup_draft(method) is not None:
                results[method] = run_lookup(binaries[LOOKUP], gguf, text, lookup_draft(method),
                                             args)
                results[method]["text"] = without_end_marks(results[method]["text"], marks)
            else:
                results[method] = run_ours(generator, ids, method == "ours-eagle", args, eos)
        tally(totals, results, ids)
    return totals


def tally(totals: dict, results: dict, ids: list[int]) -> None:
    """Add one prompt's ``results`` (per method) to ``totals``. llama.cpp's tokenizer splits a
    few prompts otherwise (HumanEval's "\\n    0": "\\n   ", " ", "0" in transformers, "\\n    ",
    "0" in llama.cpp): both codes then answered prompts one split apart, which costs the same
    time, so such a call counts in the times but its reply is not compared with ours."""
    same = same_outputs(results)
    same_prompt = results["llama.cpp"]["prompt_ids"] == ids
    totals["llama.cpp"]["prompt_ids_equal"] += same_prompt
    for method, result in results.items():
        row = totals[method]
        for key in TALLIED:
            row[key] += result.get(key, 0)
        if method == "llama.cpp" and not same_prompt:
            continue
        row["compared"] += 1
        row["same"] += same[method]
        base = results[reference(method)]["text"]
        row["prefix_chars"] += common_prefix(result["text"], base)
        row["chars"] += len(base)


def same_outputs(results: dict) -> dict[str, bool]:
    """Per method, whether its reply equals its reference's: ours-eagle's tokens ours-ar's,
    llama.cpp's text ours-ar's, llama-lookup's text llama-completion's (lookup may run a few
    tokens past the budget, so its text need only start with the plain one)."""
    same = {"ours-ar": True,
            "ours-eagle": results["ours-eagle"]["ids"] == results["ours-ar"]["ids"],
            "llama.cpp": results["llama.cpp"]["text"] == results["ours-ar"]["text"]}
    for method, result in results.items():
        if lookup_draft(method) is not None:
            same[method] = result["text"].startswith(results["llama.cpp"]["text"])
    return same


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), "" where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def read_bandwidths(step_megabytes: int) -> tuple[float, float]:
    """Bytes / s over DRAM (the faster of bench_cpu's two streams over BANDWIDTH_MB) and over a
    buffer of a step's bytes re-read in a row, as decoding re-reads its weights (a last-level
    cache that holds them serves them faster: see bench_cpu); medians of rounds. The floor
    takes the faster of the two."""
    moved, calls = bandwidth_calls(BANDWIDTH_MB)
    dram = moved / min(interleaved_medians(calls, BANDWIDTH_ROUNDS, torch.device("cpu")))
    moved, calls = bandwidth_calls(step_megabytes)
    in_a_row = [InARow(call) for call in calls]
    interleaved_medians(in_a_row, BANDWIDTH_ROUNDS, torch.device("cpu"))
    return dram, moved / min(call.median() for call in in_a_row)


def gguf_step_bytes(gguf: Path) -> int:
    """Bytes of the GGUF's tensors llama.cpp reads per token: all of them but an embedding table
    that is not also the output matrix (a step reads one row of it; SmolLM2 ties them: all)."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    total = sum(tensors.values())
    if "output.weight" in tensors and "token_embd.weight" in tensors:
        total -= tensors["token_embd.weight"]
    return total


def table(results: dict, counts: dict, floors: dict) -> list[dict]:
    rows = []
    for set_name, totals in results.items():
        rate = {m: t["tokens"] / t["seconds"] for m, t in totals.items()}
        for method, t in totals.items():
            decode_ms = t["decode_seconds"] / t["decode_steps"] * 1e3 if t["decode_steps"] else None
            plain = method in ("ours-ar", "llama.cpp")
            floor = floors["ours_ms"] if method.startswith("ours") else floors["llama_cpp_ms"]
            rows.append({
                "set": set_name, "method": method, "tokens": t["tokens"],
                "tokens_per_s": round(rate[method], 2),
                "x_ours_ar": round(rate[method] / rate["ours-ar"], 3),
                "x_llama_cpp": round(rate[method] / rate["llama.cpp"], 3),
                "decode_ms_per_token": round(decode_ms, 3) if plain and decode_ms else "",
                "floor_ms": round(floor, 3) if plain else "",
                "x_floor": round(decode_ms / floor, 3) if plain and decode_ms else "",
                "same_as": reference(method) if method != "ours-ar" else "",
                "same_outputs": f"{t['same']}/{t['compared']}",
                "prompt_ids_equal": (f"{t['prompt_ids_equal']}/{counts[set_name]}"
                                     if method == "llama.cpp" else ""),
                "common_prefix": round(t["prefix_chars"] / max(t["chars"], 1), 3),
                "drafted": t["drafted"] if lookup_draft(method) is not None else "",
                "accepted": t["accepted"] if lookup_draft(method) is not None else ""})
    return rows


def main(argv=None) -> int:
    from eagle_kernels.data import humaneval_prompts, sharegpt_prompts
    from eagle_kernels.runtime.api import from_pretrained
    from eagle_kernels.runtime.default_model import find_smollm2_gguf

    parse = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parse.add_argument("--llama-cpp", required=True, help="llama.cpp build directory")
    parse.add_argument("--llama-cpp-commit", default="",
                       help="the llama.cpp commit built (recorded; a build from an archive, "
                            "without git, reports none itself)")
    parse.add_argument("--prompts", type=int, default=16, help="per set")
    parse.add_argument("--max-new-tokens", type=int, default=128)
    parse.add_argument("--lookup-drafts", type=lambda text: [int(n) for n in text.split(",")],
                       default=list(LOOKUP_DRAFTS),
                       help="llama-lookup's --spec-draft-n-max values, comma-separated")
    parse.add_argument("--lookup-static", type=Path,
                       help="a static n-gram cache (llama-lookup-create -lcs) llama-lookup also "
                            "drafts from")
    parse.add_argument("--threads", type=int, default=torch.get_num_threads())
    parse.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"
                                            / "local"))
    args = parse.parse_args(argv)
    if args.prompts < 1 or args.max_new_tokens < 1 or args.threads < 1:
        parse.error(f"--prompts, --max-new-tokens and --threads: expected >= 1, got "
                    f"{args.prompts}, {args.max_new_tokens}, {args.threads}")
    if min(args.lookup_drafts) < 1 or len(set(args.lookup_drafts)) != len(args.lookup_drafts):
        parse.error(f"--lookup-drafts: expected distinct draft lengths >= 1, got "
                    f"{args.lookup_drafts}")
    if args.lookup_static is not None and not args.lookup_static.is_file():
        parse.error(f"--lookup-static: no such file {args.lookup_static}")
    started = time.perf_counter()
    binaries = find_binaries(Path(args.llama_cpp))
    gguf = find_smollm2_gguf()
    torch.set_num_threads(args.threads)
    generator = from_pretrained()
    sets = {"sharegpt": sharegpt_prompts(args.prompts, split="heldout"),
            "humaneval": humaneval_prompts(args.prompts)}
    warm = generator.encode(sets["sharegpt"][0])  # untimed: first calls pay one-off costs
    for speculative in (False, True):
        generator.engine.generate([warm], 8, speculative=speculative)
    target = generator.engine.target
    ours_bytes, gguf_bytes = step_bytes(target, packed=True), gguf_step_bytes(gguf)
    step_megabytes = -(-max(ours_bytes, gguf_bytes) >> 20)  # rounded up
    measured = [read_bandwidths(step_megabytes)]
    results = {}
    for index, (name, prompts) in enumerate(sets.items()):
        results[name] = run_set(generator, binaries, gguf, prompts, args, turn=index)
    measured.append(read_bandwidths(step_megabytes))
    bandwidths = [max(pair) for pair in measured]  # before and after the calls
    bandwidth = statistics.mean(bandwidths)
    floors = {"ours_ms": ours_bytes / bandwidth * 1e3, "llama_cpp_ms": gguf_bytes / bandwidth * 1e3}
    rows = table(results, {name: len(p) for name, p in sets.items()}, floors)
    env = environment()
    env["llama_cpp"] = llama_cpp_version(binaries["llama.cpp"])
    env["llama_cpp_commit"] = args.llama_cpp_commit
    env["cpu_model"] = cpu_model()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    append_rows(out / "llama_cpp.csv", [{**row, **env} for row in rows])
    report = {"environment": env, "command": "python " + " ".join(sys.argv), "rows": rows,
              "threads": args.threads,
              "lookup_static": (f"{args.lookup_static.name}, "
                                f"{args.lookup_static.stat().st_size} bytes"
                                if args.lookup_static else None),
              "read_bandwidth_gb_s": [round(b / 1e9, 2) for b in bandwidths],
              "dram_bandwidth_gb_s": [round(dram / 1e9, 2) for dram, _ in measured],
              "step_sized_bandwidth_gb_s": [round(sized / 1e9, 2) for _, sized in measured],
              "ours_step_bytes": ours_bytes, "gguf_step_bytes": gguf_bytes,
              "floors_ms": {k: round(v, 3) for k, v in floors.items()},
              "seconds": round(time.perf_counter() - started, 1)}
    (out / "llama_cpp.json").write_text(json.dumps(report, indent=1))
    plot_bars(rows, "set", "method", "tokens_per_s", out / "llama_cpp.png",
              "tokens / s (batch 1, greedy)")
    for row in rows:
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
