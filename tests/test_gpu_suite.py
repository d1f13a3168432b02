"""The staged GPU suite rehearsed on CPU, the device limits it is checked against, and the
verdict that lets a GPU kernel into ``auto``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import device_limits  # noqa: E402
import verdict  # noqa: E402

from eagle_kernels.ops import _backend  # noqa: E402


def test_rehearsal_runs_every_stage_within_the_device_limits():
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("TRITON_INTERPRET", None)  # the stages set it themselves in a dry run
    result = subprocess.run(["bash", "bench/gpu_suite.sh", "rehearse"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    for stage in ("stage1", "stage2", "stage3", "stage4", "stage5"):
        assert f"{stage}: " in result.stdout and "PROBLEMS" not in result.stdout, result.stdout


def test_check_out_names_every_broken_limit(tmp_path):
    for index in range(device_limits.MAX_FILES_BACK + 1):
        (tmp_path / f"f{index}.txt").write_text("x")
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "bad name.txt").write_text("x")
    with open(tmp_path / "big.bin", "wb") as handle:
        handle.truncate(device_limits.MAX_FILE_BYTES + 1)
    problems = "\n".join(device_limits.check_out(tmp_path))
    for expected in ("files >", "folders down", "name outside", "MiB >"):
        assert expected in problems, problems


def test_send_size_counts_the_tree_and_carried_paths(tmp_path):
    assert device_limits.check_send([]) == []  # the tree alone fits
    too_many = [f"p{index}" for index in range(device_limits.MAX_CARRY_PATHS + 1)]
    assert "carried paths" in "".join(device_limits.check_send(too_many))
    assert "sends" in "".join(device_limits.check_send([], device_limits.MAX_SEND_BYTES))


def _verdict(folder: Path, gpu: str, date: str, **entry) -> None:
    kernel = dict(op="build_tree", backend="triton", dtype="int32", proven=True,
                  speedup_vs_torch=3.0, **entry)
    (folder / f"{date}_x").mkdir(parents=True)
    (folder / f"{date}_x" / "verdict.json").write_text(json.dumps(
        {"schema": _backend.VERDICT_SCHEMA, "gpu": gpu, "date": date, "kernels": [kernel]}))


def _resolve_on_fake_gpu(monkeypatch, folder: Path, gpu: str) -> str:
    """What auto picks for build_tree on a CUDA device called ``gpu`` (no GPU needed)."""
    monkeypatch.setenv(_backend.VERDICT_ENV, str(folder))
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    monkeypatch.setattr(_backend, "backend_status",
                        lambda name: _backend.BackendStatus(name != "cuda", "test"))
    _backend.gpu_verdict.cache_clear()
    try:
        return _backend.resolve("build_tree", "auto", torch.device("cuda"), num_nodes=4)[0]
    finally:
        _backend.gpu_verdict.cache_clear()


def test_a_proven_faster_kernel_joins_auto_on_its_gpu_only(monkeypatch, tmp_path):
    _verdict(tmp_path, "GPU A", "2026-01-01")
    assert _resolve_on_fake_gpu(monkeypatch, tmp_path, "GPU A") == "triton"
    assert _resolve_on_fake_gpu(monkeypatch, tmp_path, "GPU B") == "torch"


def test_the_newest_verdict_counts_and_unproven_or_slower_stays_torch(monkeypatch, tmp_path):
    _verdict(tmp_path, "GPU A", "2026-01-01")
    _verdict(tmp_path, "GPU A", "2026-02-01", memcheck="failed")
    data = json.loads((tmp_path / "2026-02-01_x" / "verdict.json").read_text())
    data["kernels"][0]["proven"] = False
    (tmp_path / "2026-02-01_x" / "verdict.json").write_text(json.dumps(data))
    assert _resolve_on_fake_gpu(monkeypatch, tmp_path, "GPU A") == "torch"
    assert not _backend.verdict_allows({"proven": True, "speedup_vs_torch": 0.9})
    assert not _backend.verdict_allows({"proven": True, "speedup_vs_torch": None})


def test_a_rewritten_kernel_leaves_auto_until_a_run_proves_its_revision(monkeypatch):
    """A verdict proves the code it ran: an entry without a revision (read as 1) or of an older
    one does not let a kernel rewritten since into auto; the current revision does."""
    allows = _backend.verdict_allows
    entry = {"op": "tree_attention", "backend": "triton", "proven": True,
             "source_digest": _backend.source_digest("tree_attention", "triton")}
    monkeypatch.setitem(_backend.KERNEL_REVISIONS, ("tree_attention", "triton"), 3)
    assert not allows(entry) and not allows({**entry, "revision": 2})
    assert allows({**entry, "revision": 3})
    monkeypatch.delitem(_backend.KERNEL_REVISIONS, ("tree_attention", "triton"))
    assert allows(entry)


def test_row_invariant_ops_join_auto_by_invariance_not_speed():
    """linear / rms_norm / tree_attention: the proven triton kernel joins auto even when slower
    than torch (lossless by construction), a faster kernel that is not row-invariant never."""
    allows = _backend.verdict_allows
    for op in ("linear", "rms_norm", "tree_attention"):
        revision = _backend.kernel_revision(op, "triton")
        assert allows({"op": op, "backend": "triton", "proven": True, "speedup_vs_torch": 0.7,
                       "revision": revision,
                       "source_digest": _backend.source_digest(op, "triton")})
        assert not allows({"op": op, "backend": "triton", "proven": False,
                           "speedup_vs_torch": 3.0})
        assert not allows({"op": op, "backend": "cuda", "proven": True, "speedup_vs_torch": 3.0})
    assert allows({"op": "build_tree", "backend": "cuda", "proven": True, "speedup_vs_torch": 3.0})
    assert not allows({"op": "build_tree", "backend": "triton", "proven": True,
                       "speedup_vs_torch": 0.7})


def test_row_invariant_ops_join_auto_together_or_not_at_all(monkeypatch, tmp_path):
    """With linear and tree_attention proven but rms_norm not, none of the three leaves torch:
    one on cuBLAS would round a verify pass differently from a decode step."""
    def write(proven_norm: bool, date: str):
        kernels = [dict(op=op, backend="triton", dtype="bfloat16", speedup_vs_torch=0.8,
                        proven=proven_norm or op != "rms_norm",
                        revision=_backend.kernel_revision(op, "triton"),
                        source_digest=_backend.source_digest(op, "triton"))
                   for op in ("linear", "rms_norm", "tree_attention")]
        (tmp_path / f"{date}_x").mkdir()
        (tmp_path / f"{date}_x" / "verdict.json").write_text(json.dumps(
            {"schema": _backend.VERDICT_SCHEMA, "gpu": "GPU A", "date": date,
             "kernels": kernels}))

    monkeypatch.setenv(_backend.VERDICT_ENV, str(tmp_path))
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "GPU A")
    monkeypatch.setattr(_backend, "backend_status",
                        lambda name: _backend.BackendStatus(name != "cuda", "test"))
    for proven_norm, date, want in ((False, "2026-01-01", "torch"),
                                    (True, "2026-02-01", "triton")):
        write(proven_norm, date)
        _backend.gpu_verdict.cache_clear()
        try:
            for op in ("linear", "rms_norm", "tree_attention"):
                chosen = _backend.resolve(op, "auto", torch.device("cuda"),
                                          dtype=torch.bfloat16, head_dim=64)[0]
                assert chosen == want, (op, proven_norm, chosen)
        finally:
            _backend.gpu_verdict.cache_clear()


def test_the_interpreter_is_never_chosen_by_auto(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(_backend.VERDICT_ENV, str(tmp_path))
    _verdict(tmp_path, "GPU A", "2026-01-01")
    # never the interpreter: the cpu kernels where they are built, else the reference
    assert _backend.resolve("build_tree", "auto", torch.device("cpu"), num_nodes=4)[0] in (
        "cpu", "torch")


def _stage(folder: Path, cases: dict[tuple[str, str], bool], memcheck: dict[str, str]) -> None:
    """A stage's evidence: gpu-tests.xml ((file, case name) -> passed) and memcheck.tsv."""
    folder.mkdir(parents=True)
    rows = "".join(f'<testcase file="tests/{file}.py" name="{name}">'
                   + ("" if passed else "<failure/>") + "</testcase>"
                   for (file, name), passed in cases.items())
    (folder / "gpu-tests.xml").write_text(f"<testsuites><testsuite>{rows}</testsuite></testsuites>")
    (folder / "memcheck.tsv").write_text("".join(f"{op}\t{s}\n" for op, s in memcheck.items()))


def test_a_verdict_proves_the_revision_its_gpu_check_ran_not_the_checkout_s(tmp_path):
    """The revision comes from the kernel check's rows (written on the GPU by the code that
    ran), never from the checkout collecting the results: evidence of revision-1 code
    collected after a rewrite does not put the rewrite into auto."""
    _stage(tmp_path / "stage1", {("test_attention_kernels", "t[triton-1]"): True},
           {"tree_attention": "clean"})
    row = dict(op="tree_attention", backend="triton", dtype="bfloat16", status="correct",
               max_error=0.0, detail="",
               source_digest=_backend.source_digest("tree_attention", "triton"))
    current = _backend.kernel_revision("tree_attention", "triton")
    for recorded, joins in ((None, current == 1), (current, True)):
        rows = [row if recorded is None else {**row, "revision": recorded}]
        (tmp_path / "stage1" / "kernel-check.json").write_text(
            json.dumps({"device": "cuda:0", "rows": rows}))
        entry = verdict.build([tmp_path / "stage1"], "GPU A")["kernels"][0]
        assert entry["revision"] == (1 if recorded is None else recorded)
        assert entry["proven"] and entry["auto"] == joins, entry


def test_a_rerun_stage_replaces_only_what_it_reran(tmp_path):
    _stage(tmp_path / "stage1", {("test_a", "t[triton-1]"): False, ("test_a", "t[cuda-2]"): True,
                                 ("test_b", "t[triton-3]"): False},
           {"linear": "failed", "rms_norm": "clean"})
    # test_a rerun after a harness fix, its case ids changed; test_b not rerun
    _stage(tmp_path / "stage1b", {("test_a", "t[triton-1-x]"): True}, {"linear": "clean"})
    folders = [tmp_path / "stage1", tmp_path / "stage1b"]  # stage order
    outcomes = sorted(outcome for _, _, outcome in verdict.test_tally(folders))
    assert outcomes == ["failed", "passed"]  # test_a: the rerun's one case; test_b still failed
    assert verdict.memcheck_statuses(folders) == {"linear": "clean", "rms_norm": "clean"}
    # a rerun cut short replaces only the cases it ran: test_a's other case still counts
    _stage(tmp_path / "stage1c", {("test_a", "t[triton-1-x]"): False}, {})
    (tmp_path / "stage1c" / "steps.tsv").write_text(
        "step\tstatus\tseconds\tlimit_s\ngpu-tests\ttimed out after 9s\t9\t9\n")
    _stage(tmp_path / "stage1d", {("test_a", "t[cuda-2]"): True}, {})
    (tmp_path / "stage1d" / "steps.tsv").write_text(
        "step\tstatus\tseconds\tlimit_s\ngpu-tests\ttimed out after 9s\t9\t9\n")
    cut = verdict.test_tally([tmp_path / "stage1b", tmp_path / "stage1d"])
    assert sorted(outcome for _, _, outcome in cut) == ["passed", "passed"]


def _checked(folder: Path, rows: list[tuple[str, str, str]], csv_rows: list[str]) -> None:
    """A kernel check passed by every (op, backend, dtype) and a benchmark CSV of ``csv_rows``
    ("op,backend,dtype,speedup")."""
    (folder / "kernel-check.json").write_text(json.dumps({"device": "cuda:0", "rows": [
        dict(op=op, backend=backend, dtype=dtype, status="correct", max_error=0.0)
        for op, backend, dtype in rows]}))
    (folder / "bench.csv").write_text("op,backend,dtype,speedup_vs_torch\n"
                                      + "".join(f"{row}\n" for row in csv_rows))


def test_an_entry_needs_benchmark_rows_of_its_own_dtype_to_join_auto(tmp_path):
    """Only bf16 logits are timed: the fp32 entry has no speedup (not bf16's) and stays out of
    auto, saying why; compact_kv's 'mixed' entry (one check over every cache dtype) takes the
    rows of every dtype."""
    _stage(tmp_path / "stage1", {("test_acceptance_cuda", "t[1]"): True,
                                 ("test_kv_kernels", "t[cuda]"): True},
           {"greedy_accept_tree": "clean", "compact_kv": "clean"})
    _checked(tmp_path / "stage1", [("greedy_accept_tree", "cuda", "bfloat16"),
                                   ("greedy_accept_tree", "cuda", "float32"),
                                   ("compact_kv", "cuda", "mixed")],
             ["greedy_accept_tree,cuda,bfloat16,20", "greedy_accept_tree,cuda,bfloat16,30",
              "compact_kv,cuda,bfloat16,400", "compact_kv,cuda,float32,600",
              "compact_kv,cuda,float16,450"])
    report = verdict.build([tmp_path / "stage1"], "GPU A")
    entries = {(e["op"], e["dtype"]): e for e in report["kernels"]}
    assert all(e["proven"] for e in entries.values())
    assert entries["greedy_accept_tree", "bfloat16"]["speedup_vs_torch"] == 25
    assert entries["greedy_accept_tree", "bfloat16"]["auto"]
    key = ("greedy_accept_tree", "float32")
    assert entries[key]["speedup_vs_torch"] is None and not entries[key]["auto"]
    assert entries[key]["speedup_note"] == "no benchmark rows at float32 (timed: bfloat16)"
    assert entries["compact_kv", "mixed"]["speedup_vs_torch"] == 450  # median of all three
    assert entries["compact_kv", "mixed"]["auto"]
    text = verdict.table(report)
    assert "greedy_accept_tree cuda float32: no benchmark rows at float32" in text


def test_a_test_proves_the_backend_its_parameters_or_file_name_name():
    for source, name, backends in (
            ("tests/test_kv_kernels.py", "test_gpu_in_cuda_graph[triton]", ("triton",)),
            ("tests/test_generation_cuda", "t[triton-dtype0-16]", ("triton",)),  # params first
            ("tests/test_acceptance_cuda", "test_gpu_greedy[1-5-dtype0]", ("cuda",)),
            ("tests/test_decoder_triton.py", "test_linear", ("triton",)),
            ("tests/test_sampling_cuda.py", "t[in_cuda_graph]", ("cuda",)),  # by its file
            ("tests/test_acceptance_kernels.py", "t[in_cuda_graph]", ()),
            ("tests/test_loss.py", "test_gpu_bf16_large[32000]", ())):
        assert verdict._backends_of(source, name) == backends, (source, name)


def test_a_case_naming_no_backend_proves_neither_but_its_failure_counts_against_both(tmp_path):
    """tests/test_acceptance_cuda.py passing proves the cuda kernels, not the triton ones; a case
    naming no backend proves nothing, and when it fails it counts against both."""
    _stage(tmp_path / "stage1", {("test_acceptance_cuda", "t[1-dtype0]"): True,
                                 ("test_acceptance_kernels", "t"): True},
           {"greedy_accept_tree": "clean"})
    gpu = verdict.GPU_BACKENDS
    _checked(tmp_path / "stage1", [("greedy_accept_tree", b, "bfloat16") for b in gpu],
             [f"greedy_accept_tree,{b},bfloat16,20" for b in gpu])
    entries = {e["backend"]: e for e in verdict.build([tmp_path / "stage1"], "GPU A")["kernels"]}
    assert entries["cuda"]["proven"] and entries["cuda"]["gpu_tests"] == "1 passed, 0 failed"
    assert not entries["triton"]["proven"] and not entries["triton"]["auto"]
    assert entries["triton"]["gpu_tests"] == "0 passed, 0 failed"
    _stage(tmp_path / "stage1b", {("test_acceptance_kernels", "t"): False,
                                  ("test_acceptance_kernels", "u[triton]"): True}, {})
    entries = {e["backend"]: e for e in verdict.build(
        [tmp_path / "stage1", tmp_path / "stage1b"], "GPU A")["kernels"]}
    assert entries["triton"]["gpu_tests"] == "1 passed, 1 failed"
    assert entries["cuda"]["gpu_tests"] == "1 passed, 1 failed"
    assert not entries["triton"]["proven"] and not entries["cuda"]["proven"]


def test_proof_from_an_earlier_run_needs_the_same_kernels_gpu_and_versions(tmp_path):
    """A benchmark-only lease may lean on an earlier run's stage 1 only while no kernel source
    changed since the commit that stage ran, on the same GPU and versions."""
    import collect_results

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.split()

    def stage(path, commit, gpu="GPU A", versions="python 3.12 torch 2.11 triton 3.6"):
        path.mkdir(parents=True, exist_ok=True)
        (path / "gpu-tests.xml").write_text("<testsuites/>")
        lines = [versions, f"gpu: {gpu}"] + ([f"commit {commit} (sent by the caller)"]
                                             if commit else [])
        (path / "environment.txt").write_text("\n".join(lines) + "\n")
        return path

    head = git("rev-parse", "HEAD")[0]
    new = [stage(tmp_path / "new" / "stage2", head)]
    old = tmp_path / "old"
    stage(old / "stage1", head)
    assert collect_results.proof_stages(old, new) == [(old / "stage1").resolve()]
    for wrong, match in ((dict(gpu="GPU B"), "ran on GPU B"),
                         (dict(versions="python 3.12 torch 2.12 triton 3.7"), "ran 'python"),
                         (dict(commit=None), "records no commit")):
        arguments = dict(commit=head) | wrong
        stage(old / "stage1", arguments.pop("commit"), **arguments)
        with pytest.raises(ValueError, match=match):
            collect_results.proof_stages(old, new)
    first = git("rev-list", "--max-parents=0", "HEAD")[0]
    if first == head:
        pytest.skip("a shallow clone: no older commit to compare with")
    stage(old / "stage1", first)  # the kernels were written since
    with pytest.raises(ValueError, match="kernel sources changed"):
        collect_results.proof_stages(old, new)


def _kernel_check(stage: Path, digests: dict) -> None:
    """A stage's kernel-check.json with GPU rows of these (op, backend, dtype): digest, and a
    cpu row (never a GPU proof: its digest is unknown)."""
    rows = [dict(op=op, backend=backend, dtype=dtype, status="correct", revision=1,
                 source_digest=digest) for (op, backend, dtype), digest in digests.items()]
    rows.append(dict(op="linear", backend="cpu", dtype="float32", status="not run", revision=1,
                     source_digest="unknown"))
    (stage / "kernel-check.json").write_text(json.dumps({"device": "cuda", "rows": rows}))


def test_proof_from_holds_where_the_device_recorded_the_proven_digests(tmp_path):
    """Files of eagle_kernels/ changed since the proof (the dispatch, the runtime), yet the new
    run's kernel check recorded every GPU kernel's digest and revision as the proof's did: the
    proof stands (the registry's own rule for an entry at another commit). One digest apart, a
    revision apart, or no kernel check in the new run: refused, naming the changed files."""
    import collect_results

    def git(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True,
                              text=True).stdout.split()

    head, first = git("rev-parse", "HEAD")[0], git("rev-list", "--max-parents=0", "HEAD")[0]
    if first == head:
        pytest.skip("a shallow clone: no older commit to compare with")

    def stage(path, commit):
        path.mkdir(parents=True, exist_ok=True)
        (path / "gpu-tests.xml").write_text("<testsuites/>")
        (path / "environment.txt").write_text(
            f"python 3.12 torch 2.11 triton 3.6\ngpu: GPU A\ncommit {commit} (sent by the "
            "caller)\n")
        return path

    digests = {("linear", "triton", "bfloat16"): "a" * 16,
               ("build_tree", "cuda", "int32"): "b" * 16}
    proof = stage(tmp_path / "old" / "stage1", first)  # eagle_kernels/ changed since
    _kernel_check(proof, digests)
    new = stage(tmp_path / "new" / "stage2", head)
    _kernel_check(new, digests)
    assert collect_results.proof_stages(tmp_path / "old", [new]) == [proof.resolve()]
    _kernel_check(new, digests | {("linear", "triton", "bfloat16"): "c" * 16})
    with pytest.raises(ValueError, match="kernel sources changed .* no kernel check"):
        collect_results.proof_stages(tmp_path / "old", [new])
    revised = json.loads((proof / "kernel-check.json").read_text())  # a launcher change
    revised["rows"][0]["revision"] = 2
    (new / "kernel-check.json").write_text(json.dumps(revised))
    with pytest.raises(ValueError, match="kernel sources changed"):
        collect_results.proof_stages(tmp_path / "old", [new])
    (new / "kernel-check.json").unlink()  # a stage-3-only run: nothing recorded its kernels
    with pytest.raises(ValueError, match="kernel sources changed"):
        collect_results.proof_stages(tmp_path / "old", [new])


def _tarball(folder: Path, stage: Path) -> None:
    """``stage`` packed as a GPU stage returns it: ``folder/<name>.tar.gz``."""
    import tarfile

    folder.mkdir(parents=True, exist_ok=True)
    (stage / "environment.txt").write_text("gpu: GPU A\n")
    with tarfile.open(folder / f"{stage.name}.tar.gz", "w:gz") as tar:
        tar.add(stage, arcname=stage.name)


def test_one_stage_from_two_calls_is_refused_not_overwritten(tmp_path):
    """Two calls that each brought back a stage3 (a second call of a stage without
    EAGLE_STAGE_TAG): collected together, the second's files would replace the first's unseen
    (its cycle.csv holding only the steps it ran). Refused, naming both, nothing written."""
    import collect_results

    built, results = tmp_path / "built", tmp_path / "results"
    (built / "stage3").mkdir(parents=True)
    _tarball(tmp_path / "call1", built / "stage3")
    _tarball(tmp_path / "call2", built / "stage3")
    with pytest.raises(ValueError, match=r"call2/stage3.tar.gz holds stage3, as .*call1"):
        collect_results.collect([tmp_path / "call1", tmp_path / "call2"], results,
                                name="2026-01-03_gpu-a")
    assert not (results / "2026-01-03_gpu-a").exists()
    assert not (results / "local" / "collect").exists()


def test_a_second_collect_never_replaces_a_stage_and_the_verdict_reads_every_stage(tmp_path):
    """The same stage name collected twice on one day is refused (naming the folder and
    --run), and a stage added beside earlier ones joins the verdict rebuilt over all of them:
    a verdict never stands beside data it did not read."""
    import collect_results

    built, results = tmp_path / "built", tmp_path / "results"
    _stage(built / "stage1", {("test_acceptance_cuda", "t[1]"): True},
           {"greedy_accept_tree": "clean"})
    _checked(built / "stage1", [("greedy_accept_tree", "cuda", "bfloat16")],
             ["greedy_accept_tree,cuda,bfloat16,0.5"])
    _tarball(tmp_path / "lease1", built / "stage1")
    run = collect_results.collect([tmp_path / "lease1"], results, name="2026-01-01_gpu-a")
    entry = json.loads((run / "verdict.json").read_text())["kernels"][0]
    assert entry["proven"] and not entry["auto"]  # slower than torch
    with pytest.raises(ValueError, match=r"already holds stage1: .*--run 2026-01-01b_gpu-a"):
        collect_results.collect([tmp_path / "lease1"], results, name="2026-01-01_gpu-a")
    assert not (results / "local" / "collect").exists()
    (built / "stage2b").mkdir()
    (built / "stage2b" / "bench.csv").write_text(
        "op,backend,dtype,speedup_vs_torch\ngreedy_accept_tree,cuda,bfloat16,3.5\n"
        "greedy_accept_tree,cuda,bfloat16,4.5\n")
    _tarball(tmp_path / "lease2", built / "stage2b")
    collect_results.collect([tmp_path / "lease2"], results, name="2026-01-01_gpu-a")
    entry = json.loads((run / "verdict.json").read_text())["kernels"][0]
    assert entry["speedup_vs_torch"] == 3.5 and entry["auto"]  # median of 0.5, 3.5, 4.5
    assert "greedy_accept_tree" in (run / "verdict.txt").read_text()
    assert collect_results._next_name("2026-01-01b_gpu-a") == "2026-01-01c_gpu-a"
    # a run whose verdict read another run's stage 1 (--proof-from) takes no stage without it
    (results / "2026-01-02_gpu-a").mkdir()
    (results / "2026-01-02_gpu-a" / "verdict.json").write_text("{}")
    (built / "stage3").mkdir()
    _tarball(tmp_path / "lease3", built / "stage3")
    with pytest.raises(ValueError, match="--proof-from"):
        collect_results.collect([tmp_path / "lease3"], results, name="2026-01-02_gpu-a")


def _tree(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")) \
        if folder.is_dir() else []


@pytest.fixture
def collect_main(monkeypatch, tmp_path):
    """collect_results.main writing into tmp_path/results, never bench/results (checked)."""
    import collect_results
    import make_results

    real = make_results.RESULTS
    before = _tree(real)
    monkeypatch.setattr(make_results, "RESULTS", tmp_path / "results")

    def status(argv):  # main's return value, or the status argparse exits with
        try:
            return collect_results.main(argv)
        except SystemExit as done:
            return done.code
    yield status
    assert _tree(real) == before, "collect_results.main wrote into bench/results"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_collect_help_prints_the_usage_and_writes_nothing(collect_main, tmp_path, capsys, flag):
    assert collect_main([flag]) == 0
    out = capsys.readouterr().out
    assert "collect_results.py --run NAME FOLDER" in out
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("argv, named", [
    (["--bogus", "{lease}"], "unrecognized arguments: --bogus"),
    (["{lease}", "--proof-from"], "--proof-from: expected one argument"),
    (["--run", "../escape", "{lease}"], "--run '../escape'"),
    (["{tmp}/missing"], "FOLDER '{tmp}/missing' does not exist"),
    (["{lease}", "{lease}/stage1.tar.gz"], "FOLDER '{lease}/stage1.tar.gz' is not a directory"),
    (["--proof-from", "{tmp}/gone", "{lease}"], "--proof-from '{tmp}/gone' does not exist"),
    (["{tmp}/empty"], "no stage tarball"),
    (["{lease}", "{tmp}/empty"], "no stage tarball (stage*.tar.gz, profile*.tar.gz) in "
                                 "'{tmp}/empty'"),
    (["--run", "local", "{lease}"], "other than local"),
])
def test_collect_refuses_a_bad_argument_before_writing(collect_main, tmp_path, capsys, argv,
                                                        named):
    """--help read as a stage folder once wrote a bogus <date>_no-gpu-dry-run run and
    RESULTS.md: an unknown option or a folder that is no directory is refused (usage, a line
    naming it, status 2) before anything is written."""
    (tmp_path / "stage1").mkdir()
    _tarball(tmp_path / "lease", tmp_path / "stage1")
    (tmp_path / "empty").mkdir()
    fill = dict(lease=tmp_path / "lease", tmp=tmp_path)
    assert collect_main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: collect_results.py")
    assert named.format(**fill) in err.splitlines()[-1] and "Traceback" not in err
    assert not (tmp_path / "results").exists()


def test_collect_of_no_stage_writes_no_run(tmp_path):
    """A folder holding no stage tarball is no dry run: collect() refuses it, writing no run."""
    import collect_results

    (tmp_path / "lease").mkdir()
    with pytest.raises(ValueError, match="no stage in"):
        collect_results.collect([tmp_path / "lease"], tmp_path / "results")
    assert [p.name for p in (tmp_path / "results").iterdir()] == ["local"]
    assert not (tmp_path / "results" / "local" / "collect").exists()


def test_collect_main_takes_options_around_the_folders(collect_main, tmp_path, monkeypatch):
    """Valid arguments still collect (here into tmp_path/results/NAME) and rewrite RESULTS.md."""
    import make_results

    written = []
    monkeypatch.setattr(make_results, "main", lambda: written.append("RESULTS.md") or 0)
    (tmp_path / "stage2").mkdir()
    _tarball(tmp_path / "lease", tmp_path / "stage2")
    assert collect_main([str(tmp_path / "lease"), "--run", "2026-01-01_gpu-a"]) == 0
    assert (tmp_path / "results" / "2026-01-01_gpu-a" / "stage2").is_dir()
    assert written == ["RESULTS.md"]


NCU_CSV = '''==PROF== Connected to process 4242
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","GPU Speed Of Light Throughput","Duration","usecond","189.12"
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","21.5"
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","GPU Speed Of Light Throughput","DRAM Throughput","%","3.1"
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","GPU Speed Of Light Throughput","L2 Cache Throughput","%","44.0"
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","Launch Statistics","Registers Per Thread","register/thread","1,024"
==WARNING== a note among the rows
"0","4242","python3","127.0.0.1","_tree_attention_kernel","1","7","(128, 1, 1)","(120, 1, 17)","0","9.0","Memory Workload Analysis","Memory Throughput","Gbyte/second","99.0"
"1","4242","python3","127.0.0.1","void merge<float>(int)","1","7","(128, 1, 1)","(1920, 1, 1)","0","9.0","GPU Speed Of Light Throughput","Duration","nsecond","4,800"
'''


def test_the_ncu_table_names_each_kernel_and_its_limiter():
    import profile_kernels

    rows = profile_kernels.parse_ncu_csv(NCU_CSV, "attention_triton")
    assert [r["kernel"] for r in rows] == ["_tree_attention_kernel", "void merge"]
    assert rows[0]["duration_us"] == 189.12 and rows[0]["registers"] == 1024.0
    assert rows[0]["limiter"] == "l2" and rows[0]["grid"] == "(120, 1, 17)"
    assert "memory_pct" not in rows[0]  # the Gbyte/second row of another section is no percent
    assert rows[1]["duration_us"] == 4.8 and rows[1]["limiter"] == ""


def test_the_verdict_table_says_which_of_a_proven_pair_auto_tries_first():
    def entry(op, backend, dtype, speedup, auto=True):
        return dict(op=op, backend=backend, dtype=dtype, auto=auto, check="correct",
                    max_error=0.0, gpu_tests="1 passed, 0 failed", memcheck="clean",
                    speedup_vs_torch=speedup, speedup_note="")

    report = {"gpu": "GPU A", "device": "cuda", "kernels": [
        entry("topk_log_softmax", "cuda", "bfloat16", 4.4),     # triton 5x faster: triton
        entry("topk_log_softmax", "triton", "bfloat16", 21.9),
        entry("build_tree", "cuda", "int32", 6200.0),           # within 10 %: cuda stays
        entry("build_tree", "triton", "int32", 6600.0),
        entry("compact_kv", "cuda", "mixed", 10.0),             # the other not auto: alone
        entry("compact_kv", "triton", "mixed", 50.0, auto=False),
        # resolved without a dtype: ranked once over every dtype, at each one's lowest
        # speedup (cuda 10, triton 20: triton, though cuda is faster at float32)
        entry("stochastic_accept_chain", "cuda", "bfloat16", 10.0),
        entry("stochastic_accept_chain", "cuda", "float32", 30.0),
        entry("stochastic_accept_chain", "triton", "bfloat16", 40.0),
        entry("stochastic_accept_chain", "triton", "float32", 20.0),
        # ... and a backend counts only where every dtype of it may run
        entry("target_probs", "cuda", "bfloat16", 10.0),
        entry("target_probs", "triton", "bfloat16", 40.0),
        entry("target_probs", "triton", "float32", 40.0, auto=False),
        # resolved by dtype: ranked per dtype
        entry("apply_rope", "cuda", "float16", 1.5),
        entry("apply_rope", "triton", "float16", 3.0),
        entry("apply_rope", "cuda", "bfloat16", 3.0),
        entry("apply_rope", "triton", "bfloat16", 2.0)]}
    rows = {tuple(line.split()[:3]): line for line in verdict.table(report).splitlines()[2:]}
    assert rows["topk_log_softmax", "triton", "bfloat16"].endswith("yes, first")
    assert rows["topk_log_softmax", "cuda", "bfloat16"].endswith("yes, second")
    assert rows["build_tree", "cuda", "int32"].endswith("yes, first")
    assert rows["build_tree", "triton", "int32"].endswith("yes, second")
    assert rows["compact_kv", "cuda", "mixed"].endswith(" yes")
    assert rows["compact_kv", "triton", "mixed"].endswith(" no")
    for dtype in ("bfloat16", "float32"):
        assert rows["stochastic_accept_chain", "triton", dtype].endswith("yes, first")
        assert rows["stochastic_accept_chain", "cuda", dtype].endswith("yes, second")
    assert rows["target_probs", "cuda", "bfloat16"].endswith(" yes")
    assert rows["target_probs", "triton", "bfloat16"].endswith(" yes")
    assert rows["apply_rope", "triton", "float16"].endswith("yes, first")
    assert rows["apply_rope", "cuda", "bfloat16"].endswith("yes, first")
