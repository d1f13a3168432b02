"""Write bench/results/RESULTS.md from the committed result files (never hand-typed numbers).

    python bench/make_results.py            # rewrites bench/results/RESULTS.md

Each run lives in its own directory under bench/results/ (``<date>_<machine>/``), written there
by the benchmark scripts' ``--out``: ``tau.json`` (bench/e2e/bench_tau.py), ``agreement.json``
(bench/e2e/bench_agreement.py), ``e2e.json``
(bench/e2e/bench_e2e.py), ``official_eagle.json`` (bench/e2e/bench_official_eagle.py),
``llama_cpp.json`` (bench/e2e/bench_llama_cpp.py),
``cycle*.json`` / kernel CSVs (GPU suite). This script only reads
them and lays the numbers out as tables, with the device, versions, date and command of each.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
# Columns shown for kernel CSVs, when present (every row keeps its full record in the CSV):
# first every column that tells rows apart (a Llama row from a SmolLM2 one: shape; a weight,
# a row count, an accepted length, a tree), then the numbers, then what qualifies them (graph
# capture, floor notes, a variant's note, an error: an errored row has blank timings).
KERNEL_COLUMNS = ("op", "shape", "model", "method", "weight", "backend", "dtype", "batch",
                  "rows", "context", "nodes", "num_nodes", "accepted", "vocab", "total_tokens",
                  "depth", "top_k", "tree", "median_us", "speedup_vs_torch", "x_floor",
                  "launch_us", "x_launch_floor", "ratio_to_causal", "bw_fraction", "cycle_ms",
                  "step_ms", "cycle_over_step", "roofline_cycle_over_step", "draft_ms",
                  "verify_ms", "rest_ms", "graph_cycle",
                  "graph_step", "floor_note", "note", "error")


def sweep_lines(report: dict) -> list[str]:
    """A τ-by-tree-size table for the sets measured with --sweep (empty without)."""
    sets = {n: e["sweep"] for n, e in report["sets"].items() if e.get("sweep")}
    if not sets:
        return []
    sizes = list(next(iter(sets.values())))
    lines = ["", "| set | " + " | ".join(
        f"τ @ {n} ({'/'.join(map(str, s[n]['tree']))})"
        for s in list(sets.values())[:1] for n in sizes) + " |",
        "|---|" + "---|" * len(sizes)]
    for name, sweep in sets.items():
        lines.append(f"| {name} | " + " | ".join(f"{sweep[n]['tau']:.2f}" for n in sizes) + " |")
    return lines


def provenance(env: dict) -> str:
    """Where and from what a run came: device, torch, date, commit."""
    return f"{env['device']}, torch {env['torch']}, {env['date']}, commit {env['commit']}"


def tau_section(run: Path, report: dict) -> list[str]:
    env = report["environment"]
    label = f" — {report['label']}" if report.get("label") else ""
    lines = [f"### Draft acceptance — `{run.name}`{label}", "",
             f"draft `{report.get('draft', '?')}`; "
             f"{env['device']}, torch {env['torch']}, {env['date']}, commit {env['commit']}; "
             f"greedy, {report['max_new_tokens']} new tokens per prompt, tree "
             f"{'/'.join(map(str, report['tree']))}; command `{report['command']}`", "",
             "| set | prompts | τ (tree) | τ (chain) | " + " | ".join(
                 f"{n}-α" for n in range(1, 8)) + " | identical to AR |",
             "|---|---|---|---|" + "---|" * 8]
    for name, entry in report["sets"].items():
        alphas = [f"{a:.3f}" if a is not None else "–" for a in entry.get("n_alpha") or []]
        alphas = (alphas + ["–"] * 7)[:7]
        chain = f"{entry['chain']['tau']:.2f}" if "chain" in entry else "–"
        lines.append(f"| {name} | {entry['prompts']} | {entry['tree']['tau']:.2f} | {chain} | "
                     + " | ".join(alphas) + f" | {entry['identical_to_autoregressive']} |")
    return lines + sweep_lines(report) + [""]


def e2e_section(run: Path, report: dict) -> list[str]:
    env = report["environment"]
    lines = [f"### End to end — `{run.name}`", "",
             f"{env['device']}, torch {env['torch']}, {env['date']}, commit {env['commit']}; "
             "batch 1, greedy", "",
             "| set | method | tokens/s | EAGLE speedup over it | τ | efficiency | tree | "
             "plain decoding chosen | context drafts: steps / tokens accepted | cycle / AR step | "
             "head's tree: cycles / tokens | tokens / target pass | EAGLE == ours-ar |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        # since 2026-11-28: what made ours-eagle's tokens, and efficiency per target pass
        # (before: per cycle of the tree, > 1 where context drafts made the tokens)
        tree_made = (f"{row['tree_cycles']} / {row['tree_tokens']} of {row['tokens']}"
                     if row.get("tree_cycles", "") != "" else "")
        cycle = row.get("cycle_x_ar_step", "")
        if cycle != "":
            cycle = f"{cycle} ({row['speculated_prompts']} prompts)"
        context = (f"{row['context_draft_steps']} / {row['context_tokens_accepted']}"
                   if row.get("context_draft_steps", "") != "" else "")
        lines.append(f"| {Path(str(row['set'])).name} | {row['method']} | "
                     f"{row['tokens_per_second']} | {row['eagle_speedup_over_this']} | "
                     f"{row['tau']} | {row['efficiency']} | {row['tree']} | "
                     f"{row.get('plain_fallback_prompts', '')} | {context} | {cycle} | "
                     f"{tree_made} | {row.get('tokens_per_pass', '')} | "
                     f"{row['identical_to_ours_ar']} |")
    if report.get("tree_budget"):
        lines += ["", f"Tree budget after the run: {report['tree_budget']}"]
    return lines + [""]


# (header, key) of the columns of the peers' tables
OFFICIAL_COLUMNS = (("set", "set"), ("method", "method"), ("tokens/s", "tokens_per_second"),
                    ("x its own plain decoding", "speedup_over_own_plain"),
                    ("ours-eagle x it", "ours_eagle_speedup_over_this"), ("τ", "tau"),
                    ("capture_s", "capture_seconds"), ("== ours-ar", "identical_to_ours_ar"),
                    ("== own plain", "identical_to_own_plain"))
LLAMA_CPP_COLUMNS = (("set", "set"), ("method", "method"), ("tokens/s", "tokens_per_s"),
                     ("x ours-ar", "x_ours_ar"), ("x llama.cpp", "x_llama_cpp"),
                     ("decode ms / token", "decode_ms_per_token"), ("x memory floor", "x_floor"),
                     ("same outputs as", "same_as"), ("same", "same_outputs"),
                     ("common prefix", "common_prefix"), ("prompt ids equal", "prompt_ids_equal"),
                     ("drafted", "drafted"), ("accepted", "accepted"))


def markdown_table(columns, rows: list[dict]) -> list[str]:
    """A markdown table of ``rows`` under ``columns`` ((header, key) pairs); a key a row lacks
    (a column newer than its run) is left empty."""
    return (["| " + " | ".join(header for header, _ in columns) + " |",
             "|" + "---|" * len(columns)]
            + ["| " + " | ".join(str(row.get(key, "")) for _, key in columns) + " |"
               for row in rows])


def official_section(run: Path, path: Path, report: dict) -> list[str]:
    """bench/e2e/bench_official_eagle.py's ``path`` in ``run``: ours beside the official EAGLE
    code (on a GPU, ours' seconds include capturing each call's CUDA graph: capture_s)."""
    env, rows = report["environment"], report["rows"]
    where = path.parent.relative_to(run.parent).as_posix()  # a GPU run's: <run>/stage4/...
    lines = [f"### Ours vs the official EAGLE code — `{where}`", "",
             provenance(env) + f", official EAGLE {rows[0]['official_commit'][:12]}; batch 1, "
             f"greedy; ours' target weights: {rows[0].get('target_weights', 'packs')}; "
             f"`{report['command']}`", ""]
    return lines + markdown_table(OFFICIAL_COLUMNS, rows) + [""]


def llama_cpp_section(run: Path, report: dict) -> list[str]:
    """bench/e2e/bench_llama_cpp.py: ours beside llama.cpp on the same GGUF and prompts (a field
    a run's JSON lacks is left out, never a reason to stop the page)."""
    env, rows = report.get("environment", {}), report.get("rows", [])
    bandwidth = " / ".join(map(str, report.get("read_bandwidth_gb_s", [])))
    commit = env.get("llama_cpp_commit") or env.get("llama_cpp", "?")
    lines = [f"### Ours vs llama.cpp — `{run.name}`", "",
             f"{env.get('device', '?')} ({env.get('cpu_model') or 'model not recorded'}), torch "
             f"{env.get('torch', '?')}, {env.get('date', '?')}, commit {env.get('commit', '?')}, "
             f"llama.cpp {commit}; {report.get('threads', '?')} threads, batch 1, greedy; read "
             f"bandwidth {bandwidth or '?'} GB/s (before / after the calls); "
             + (f"llama-lookup's static n-gram cache: {report['lookup_static']}; "
                if report.get("lookup_static") else "")
             + f"`{report.get('command', '?')}`", ""]
    return lines + markdown_table(LLAMA_CPP_COLUMNS, rows) + [""]


def _gemv_sentence(floors: dict) -> str:
    """Our in-cache one-row GEMV time: runs before 2026-11-28 called it a floor (and their
    floor column left the K / V out); later ones report it as our kernels' speed."""
    if floors.get("in_cache_gemv_ms"):
        return (f" Our one-row GEMVs over in-cache weights take {floors['in_cache_gemv_ms']} ms "
                f"a step (our kernels' speed, not a floor): the AR step is "
                f"{floors['ar_x_in_cache_gemv']}x that.")
    if floors.get("one_row_floor_ms"):
        return (f" A decode step's one-row GEMVs over in-cache weights take "
                f"{floors['one_row_floor_ms']} ms (then called the one-row compute floor; "
                f"our kernels' speed, not a physical floor): the AR step is "
                f"{floors['ar_x_one_row_floor']}x max(memory floor, that). This run's floors "
                f"leave the K / V the step reads out.")
    return ""


def cpu_section(run: Path, report: dict) -> list[str]:
    """bench/e2e/bench_cpu.py: floors, AR step, verify(N), drafting, each with its ratios."""
    env, floors = report["environment"], report["floors"]
    lines = [f"### CPU fast path — `{run.name}`", "",
             provenance(env) + f"; {floors['cpu_isa']}, {floors['threads']} threads, context "
             f"{floors['context']}, {floors.get('activations', 'fp32')} activations; "
             f"command `{report['command']}`", "",
             f"Measured in the same run: read bandwidth {floors['read_bandwidth_gb_s']} GB/s"
             + (f" (DRAM {floors['dram_bandwidth_gb_s']}, a buffer of the step's bytes re-read "
                f"{floors['step_sized_bandwidth_gb_s']}; the faster counts)"
                if "dram_bandwidth_gb_s" in floors else "") + ", "
             f"in-cache GEMM {floors['gemm_gflop_s']} GFLOP/s; a decode step reads "
             f"{floors['weight_bytes'] / 1e6:.0f} MB of weights"
             + (f" + {floors['kv_bytes'] / 1e6:.1f} MB of K / V" if "kv_bytes" in floors else "")
             + f" -> memory floor {floors['memory_floor_ms']} ms"
             + (f" (as packed; in fp32 {floors['fp32_weight_bytes'] / 1e6:.0f} MB -> "
                f"{floors['fp32_memory_floor_ms']} ms)" if "fp32_weight_bytes" in floors else "")
             + f"; one token is {floors['token_gflop']} GFLOP"
             + (f" -> compute floor {floors['compute_floor_ms']} ms"
                if "compute_floor_ms" in floors else "") + "."
             + _gemv_sentence(floors)
             + (f" Timing: {floors['timing']}, floors included." if "timing" in floors else ""),
             "", "| what | tree | nodes | context | ms | floor ms | x floor | x AR step | "
             "ms / draft step | cycle x AR step |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        lines.append("| " + " | ".join(str(row.get(key, "")) for key in (
            "what", "tree", "nodes", "context", "ms", "floor_ms", "x_floor", "x_ar_step",
            "step_ms", "cycle_x_ar_step")) + " |")
    return lines + [""]


def _cell(value) -> str:
    """A CSV value as a table cell: one line, pipes escaped (as an error message may hold)."""
    return " ".join(str(value or "").split()).replace("|", "\\|")


def csv_section(path: Path, run: Path) -> list[str]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return []
    columns = [c for c in KERNEL_COLUMNS if c in rows[0]]
    if len(columns) < 2:  # not a kernel benchmark's CSV (one shared name, e.g. "method")
        columns = list(rows[0])[:8]
    env = rows[0]
    # the rate the floors used (bench/kernels/common.py floor_us); older CSVs lack the columns:
    # their floors were over the copy bandwidth alone
    rates = (f"; floors over {env['floor_gbps']} GB/s, the fastest of read {env.get('read_gbps')}"
             f", write {env.get('write_gbps')} and copy {env.get('copy_gbps')} GB/s measured in "
             f"the run" if all(env.get(f"{kind}_gbps") for kind in ("floor", "read", "write",
                                                                      "copy")) else "")
    lines = [f"### `{run.name}/{path.relative_to(run)}`", "",
             f"{env.get('device', '?')}, torch {env.get('torch', '?')}, triton "
             f"{env.get('triton', '?')}, {env.get('date', '?')}{rates}", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines + [""]


def agreement_lines(report: dict) -> list[str]:
    """bench_agreement's table: n-α ± one standard error per head and prompt set."""
    steps = max(len(rows) for sets in report["heads"].values() for rows in sets.values())
    lines = ["| head | set | " + " | ".join(f"{n}-α" for n in range(1, steps + 1))
             + " | positions |", "|---|---|" + "---|" * (steps + 1)]
    for head, sets in report["heads"].items():
        for name, rows in sets.items():
            cells = [f"{r['alpha']:.3f} ± {r['stderr']:.3f}" for r in rows]
            lines.append(f"| {head} | {name} | " + " | ".join(cells)
                         + f" | {rows[0]['positions']} |")
    return lines


def agreement_section(run: Path, report: dict) -> list[str]:
    env = report["environment"]
    return [f"### Teacher-forced acceptance — `{run.name}`", "",
            f"{env['device']}, torch {env['torch']}, {env['date']}, commit {env['commit']}; "
            f"{report['max_new_tokens']} greedy reply tokens per prompt, draft weights "
            f"{report['draft_weights']}; command `{report['command']}`", "",
            *agreement_lines(report), ""]


def train_section(run: Path, report: dict) -> list[str]:
    env = report["environment"]
    lines = [f"### Head training throughput — `{run.name}`", "",
             f"{env['device']}, torch {env['torch']}, {env['date']}, commit {env['commit']}; "
             f"GEMM rate {report['gemm_gflops']} GFLOP/s; package `{report.get('package', '?')}`; "
             f"command `{report['command']}`", "",
             "| configuration | TTT steps | target cached | tokens/s | × baseline | floor tokens/s "
             "| floor / measured | target s | head s |", "|---|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        lines.append(f"| {row['config']} | {row['ttt_steps']} | {row['cached']} | "
                     f"{row['tokens_per_s']} | {row['x_baseline']} | {row['floor_tokens_per_s']} | "
                     f"{row['x_floor']} | {row['target_s']} | {row['head_s']} |")
    return lines + [""]


# The τ a projection multiplies by: the bundled head's, exact weights, at the default tree
# (top_k / depth / total_tokens), the tree closest to the cycle benchmark's 10 / 7 / 60.
PROJECTION_TREE = [10, 6, 60]
PROJECTION_SHAPE = "smollm2-135m"  # the shape whose model the τ was measured on


def newest_tau(runs: list[Path]) -> tuple[Path, dict] | None:
    """The newest bench_tau report of the bundled head (exact weights) at PROJECTION_TREE."""
    found = None
    for run in runs:  # sorted by name: dated, so the last match is the newest
        for path in sorted(run.glob("tau*.json")):
            report = json.loads(path.read_text())
            if (report.get("draft") == "bundled" and report.get("draft_weights") == "exact"
                    and report.get("tree") == PROJECTION_TREE):
                found = (path, report)
    return found


def projection_section(run: Path, cycle_csv: Path, tau: tuple[Path, dict] | None) -> list[str]:
    """Projected speedup over the same runtime's autoregressive decoding on this GPU:
    τ (measured on CPU) x AR step / cycle, for the cycle rows at the τ's model shape, batch 1,
    the fixed tree, both replayed from CUDA graphs (an eager row's host overheads swamp both
    times alike). A projection, not a measurement, off in both directions: τ comes from fp32
    CPU generation (bf16 GPU kernels can round some verifications otherwise); the cycle is
    timed with random weights, which accept one token a cycle (a real cycle also commits and
    compacts the accepted ones: dearer) and at depth 7 where the τ tree drafts 6 (cheaper)."""
    with open(cycle_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("shape") == PROJECTION_SHAPE
                and r.get("batch") == "1" and r.get("tree", "fixed") == "fixed"
                and not r.get("error") and r.get("cycle_ms")
                and r.get("graph_cycle") == r.get("graph_step") == "captured"]
    if not rows or tau is None:
        return []
    path, report = tau
    sets = {name: entry["tree"]["tau"] for name, entry in report["sets"].items()}
    lines = [f"### Projected speedup — `{run.name}` x `{path.parent.name}/{path.name}`", "",
             "τ x AR step / cycle: τ of the bundled head at tree "
             f"{'/'.join(map(str, PROJECTION_TREE))} (CPU, commit "
             f"{report['environment']['commit']}), cycle and step of "
             f"`{cycle_csv.relative_to(run)}` ({PROJECTION_SHAPE}, batch 1, random weights, "
             "CUDA graphs); a projection, not a measured generation", "",
             "| backend | context | tree (tokens/depth/top-k) | step_ms | cycle_ms | " + " | ".join(
                 f"× AR on {name} (τ {tau_value:.2f})" for name, tau_value in sets.items())
             + " |", "|---|---|---|---|---|" + "---|" * len(sets)]
    for row in rows:
        ratio = float(row["step_ms"]) / float(row["cycle_ms"])
        tree = "/".join(row.get(c) or "?" for c in ("total_tokens", "depth", "top_k"))
        lines.append(f"| {row['backend']} | {row['context']} | {tree} | {row['step_ms']} | "
                     f"{row['cycle_ms']} | " + " | ".join(f"{t * ratio:.2f}" for t in sets.values())
                     + " |")
    return lines + [""]


# CSVs left out of the tables: training logs (their own section), Nsight Compute's raw exports
# (one row per metric; the profile stage's profile.csv is their table) and trace_cycle's rows
# (every kernel of a phase; its trace.txt beside them is their summary).
UNRENDERED_CSV_PREFIXES = ("train", "ncu-", "trace")


def build(results: Path = RESULTS) -> str:
    lines = ["# Results", "",
             "Generated by `python bench/make_results.py` from the files in this directory; "
             "each section names its run directory, device, versions, date and command.", ""]
    runs = sorted(p for p in results.iterdir() if p.is_dir() and p.name != "local")
    tau = newest_tau(runs)  # the τ every GPU run's projection multiplies by
    if not runs:
        lines.append("No committed runs yet.")
    for run in runs:
        for path in sorted(run.glob("tau*.json")):
            lines += tau_section(run, json.loads(path.read_text()))
        for path in sorted(run.glob("agreement*.json")):
            lines += agreement_section(run, json.loads(path.read_text()))
        for path in sorted(run.glob("train*.json")):
            lines += train_section(run, json.loads(path.read_text()))
        if (run / "cpu.json").is_file():
            lines += cpu_section(run, json.loads((run / "cpu.json").read_text()))
        if (run / "e2e.json").is_file():
            lines += e2e_section(run, json.loads((run / "e2e.json").read_text()))
        for path in sorted(run.rglob("official_eagle.json")):  # a GPU run: in stage4/
            lines += official_section(run, path, json.loads(path.read_text()))
        if (run / "llama_cpp.json").is_file():
            lines += llama_cpp_section(run, json.loads((run / "llama_cpp.json").read_text()))
        if (run / "verdict.txt").is_file():
            lines += [f"### Kernel verdict — `{run.name}`", "", "```",
                      (run / "verdict.txt").read_text().rstrip(), "```", ""]
        for path in sorted(run.rglob("*.csv")):
            if path.name not in ("e2e.csv", "cpu.csv", "official_eagle.csv",
                                 "llama_cpp.csv") and not (
                    path.name.startswith(UNRENDERED_CSV_PREFIXES)):
                lines += csv_section(path, run)
        for path in sorted(run.rglob("cycle.csv")):
            lines += projection_section(run, path, tau)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "RESULTS.md").write_text(build())
    print(f"wrote {RESULTS / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
