"""Source digests tie a GPU verdict entry to the kernel code it proved (ops/_digests.py,
csrc/source_digests.py): a kernel edited since its GPU run leaves ``auto`` with no revision to
bump by hand, while the verdicts that record no digest keep the revision rule. No GPU needed:
the GPU is faked as in tests/test_gpu_suite.py."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from cuda_support import pretend_gpu_with_verdict
from eagle_kernels.ops import _backend, _digests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "csrc"))
# no csrc/__pycache__: build stamps hash csrc/ (bench/stages/build_carry.py, the Makefile)
_writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
import source_digests  # noqa: E402  (csrc/source_digests.py)
sys.dont_write_bytecode = _writes
import verdict  # noqa: E402

# A module of jit kernels like ops/*.py; {fields} are what each case edits.
FIXTURE = '''
from eagle_kernels.ops._triton import tl, triton

SCALE = tl.constexpr({scale})


@triton.jit
def _helper(x):
    return x * {factor}


@triton.jit{options}
def _kernel(x_ptr, BLOCK: tl.constexpr):
    """{doc}"""
    offsets = tl.arange(0, BLOCK)  # one block
    tl.store(x_ptr + offsets, _helper(tl.load(x_ptr + offsets)) + {term} * SCALE)


LAUNCH_BLOCK = {block}
ROUNDING = {rounding}
_MEMO = {{}}  # module state the launcher fills: never part of a digest


def _launch(x):
    """{launcher_doc}"""
    _MEMO.setdefault(x.shape, len(_MEMO))
    _kernel[{grid}](x, BLOCK=LAUNCH_BLOCK, **ROUNDING)
    return x


LAUNCHERS = (_launch,)


def _op(x):  # the registered implementation: reaches _launch through a tuple, as loss.py's
    return LAUNCHERS[0](x)
'''
BASE = dict(scale=2, factor=3, doc="Adds.", term=1, launcher_doc="Runs it.", block=16,
            options="", grid="(1,)", rounding='{"enable_fp_fusion": False}')


def _fixture(tmp_path: Path, **edits):
    """FIXTURE with ``edits``, loaded as an eagle_kernels module (a new file per call: no
    stale source cache)."""
    path = tmp_path / f"fixture_{len(list(tmp_path.iterdir()))}.py"
    path.write_text(FIXTURE.format(**{**BASE, **edits}))
    spec = importlib.util.spec_from_file_location("eagle_kernels._digest_fixture", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fixture_digest(tmp_path: Path, **edits) -> str:
    return _digests.triton_digest(_fixture(tmp_path, **edits)._op)


def test_a_triton_digest_follows_the_kernels_not_their_docs_or_launcher(tmp_path):
    base = _fixture_digest(tmp_path)
    assert re.fullmatch(r"[0-9a-f]{16}", base) and _fixture_digest(tmp_path) == base
    # docstrings and launcher code are not the kernel (a launcher change: bump the revision)
    assert _fixture_digest(tmp_path, doc="Adds, documented better.", launcher_doc="x") == base
    assert _fixture_digest(tmp_path, grid="(1, 1)") == base
    # the kernel's body and jit options, a jit helper it calls, a module constant it reads and
    # one the launcher passes it
    for edit in (dict(term=2), dict(options='(do_not_specialize=["x_ptr"])'), dict(factor=4),
                 dict(scale=5), dict(block=32), dict(rounding='{"enable_fp_fusion": True}')):
        assert _fixture_digest(tmp_path, **edit) != base, edit
    # module state (a private memo the launcher fills) is not a constant: what ran before a
    # digest is computed must not change it
    module = _fixture(tmp_path)
    module._MEMO.update({(4,): 0, (8,): 1})
    assert _digests.triton_digest(module._op) == base


def test_every_triton_op_has_a_stable_digest_over_the_kernels_it_launches():
    """Discovery from the registered launcher reaches at least one kernel of every op (through
    closures, as greedy_accept_chain's, and tuples, as soft_cross_entropy's), and the cached
    digest is what a fresh computation gives."""
    ops = sorted(op for op, impls in _backend._REGISTRY.items() if "triton" in impls)
    assert {"soft_cross_entropy", "greedy_accept_chain", "tree_attention"} <= set(ops)
    first = {op: _backend.source_digest(op, "triton") for op in ops}
    _backend.source_digest.cache_clear()
    assert first == {op: _backend.source_digest(op, "triton") for op in ops}
    assert all(re.fullmatch(r"[0-9a-f]{16}", digest) for digest in first.values()), first
    kernels = _digests.reached(_backend._REGISTRY["soft_cross_entropy"]["triton"].fn)[0]
    assert {k.__name__ for k in kernels} == {"_soft_ce_forward_kernel", "_soft_ce_backward_kernel"}
    assert _backend.source_digest("build_tree", "torch") is None
    assert _backend.source_digest("no_such_op", "triton") is None


def test_a_cuda_digest_follows_the_families_of_the_functions_its_launcher_calls():
    launcher = _backend._REGISTRY["stochastic_accept_tree"]["cuda"].fn
    table = {"stochastic_accept_tree": "a", "row_stats": "b", "build_tree": "c"}
    digest = _digests.cuda_digest(launcher, table)
    assert digest == _digests.cuda_digest(launcher, {**table, "build_tree": "changed"})
    assert digest != _digests.cuda_digest(launcher, {**table, "row_stats": "changed"})
    assert _digests.cuda_digest(launcher, None) is None  # an _C built without digests
    # every cuda op's launcher calls functions the real csrc defines
    real = source_digests.function_digests(ROOT / "csrc")
    for op, impls in _backend._REGISTRY.items():
        if "cuda" in impls:
            assert _digests.cuda_digest(impls["cuda"].fn, real) is not None, op


def _csrc(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_csrc_family_digests_cover_the_headers_each_family_includes(tmp_path):
    """tree.cuh includes topk.cuh in csrc/: a shared header's edit changes every family that
    includes it, a family's own file only that family; the header lists each function."""
    files = {"common.cuh": "// common\n",
             "a.cuh": '#include "common.cuh"\n', "a.cu": '#include "a.cuh"\n',
             "a_bindings.cpp": '#include "a.cuh"\nmodule.def("fa", &fa);\n',
             "b.cuh": '#include "a.cuh"\n', "b.cu": '#include "b.cuh"\n',
             "b_bindings.cpp": 'module.def("fb", &fb);\nmodule.def("fb_host", &h);\n'}
    before = source_digests.function_digests(_csrc(tmp_path / "csrc", files))
    assert set(before) == {"fa", "fb", "fb_host"} and before["fb"] == before["fb_host"]
    edited = {"b.cu": '#include "b.cuh"\n// edit\n'}
    after = source_digests.function_digests(_csrc(tmp_path / "csrc", edited))
    assert after["fa"] == before["fa"] and after["fb"] != before["fb"]
    shared = source_digests.function_digests(_csrc(tmp_path / "csrc", {"common.cuh": "// x\n"}))
    assert shared["fa"] != after["fa"] and shared["fb"] != after["fb"]
    out = tmp_path / "gen" / "source_digests.h"
    assert source_digests.main([str(tmp_path / "csrc"), str(out)]) == 0
    assert f'{{"fa", "{shared["fa"]}"}}' in out.read_text()


def test_the_built_extension_reports_the_digests_of_its_sources():
    """Where _C was built with digests (every GPU run builds it), they are csrc's own."""
    if not _backend._import_status("eagle_kernels._C").available:
        pytest.skip("eagle_kernels._C not built")
    compiled = _backend._compiled_digests()
    if compiled is None:
        pytest.skip("eagle_kernels._C built before source digests: rebuild to check them")
    assert compiled == source_digests.function_digests(ROOT / "csrc"), (
        "eagle_kernels._C was built from other csrc sources: rebuild it")


def _entry(op: str, **fields) -> dict:
    return {"op": op, "backend": "triton", "dtype": "bfloat16", "proven": True,
            "speedup_vs_torch": 3.0, "revision": _backend.kernel_revision(op, "triton"),
            **fields}


def test_an_entry_with_a_digest_counts_only_for_those_sources(monkeypatch):
    here = _backend.source_digest("build_tree", "triton")
    allows = _backend.verdict_allows
    assert allows(_entry("build_tree", source_digest=here))
    assert not allows(_entry("build_tree", source_digest="0" * 16))
    assert _backend.source_changed(_entry("build_tree", source_digest="0" * 16))
    # the revision still counts for an entry with a digest (changes a digest cannot see)
    assert not allows(_entry("build_tree", source_digest=here, revision=99))
    # no digest here (e.g. an _C built without them): a digest cannot be vouched for
    monkeypatch.setattr(_backend, "source_digest", lambda op, backend: None)
    assert not allows(_entry("build_tree", source_digest=here))


def test_entries_without_a_digest_prove_the_code_of_their_day(monkeypatch):
    """The committed verdicts of 2026-11-26/27 record no digest: their entries prove the code
    of b5ae095 (LEGACY_SOURCE_DIGESTS), and the revision rule still holds. An entry that
    records None (a check whose digest was unknown) has the revision rule alone."""
    assert _backend.LEGACY_SOURCE_DIGESTS[("build_tree", "triton")] == _backend.source_digest(
        "build_tree", "triton")  # unchanged since b5ae095
    assert _backend.verdict_allows(_entry("build_tree"))
    monkeypatch.setitem(_backend.KERNEL_REVISIONS, ("build_tree", "triton"), 7)
    assert not _backend.verdict_allows(_entry("build_tree", revision=1))
    monkeypatch.delitem(_backend.KERNEL_REVISIONS, ("build_tree", "triton"))
    # edited since b5ae095 with no revision bump: out
    monkeypatch.setitem(_backend.LEGACY_SOURCE_DIGESTS, ("build_tree", "triton"), "0" * 16)
    assert not _backend.verdict_allows(_entry("build_tree"))
    assert _backend.verdict_allows(_entry("build_tree", source_digest=None))
    for path in sorted(_backend.DEFAULT_VERDICTS.glob("2026-11-2[67]*/verdict.json")):
        kernels = json.loads(path.read_text())["kernels"]
        assert all("source_digest" not in entry for entry in kernels), path


def test_every_launch_site_names_a_kernel_of_its_ops_digest():
    """Kernels are found through plain names, closures, partials and tuples: every
    ``kernel[grid](...)`` in the code an op's launcher reaches must name a kernel its digest
    covers, and every jit function of eagle_kernels.ops must be covered by some op's digest
    (a kernel launched through a dict, getattr or a class would be missed, and its edits
    would keep a verdict entry)."""
    import ast
    import inspect
    import textwrap

    from eagle_kernels import ops
    from eagle_kernels.ops._triton import is_kernel

    covered = set()
    for op, impls in sorted(_backend._REGISTRY.items()):
        if "triton" not in impls:
            continue
        found = _digests.reached(impls["triton"].fn)
        ids = {id(kernel) for kernel in found.kernels}
        covered.update(_digests.kernel_texts(found.kernels))  # with the jit helpers they call
        for fn in found.functions:
            scope = {**fn.__globals__, **inspect.getclosurevars(fn).nonlocals}
            for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn)))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                    target = node.func.value
                    named = scope.get(target.id) if isinstance(target, ast.Name) else None
                    assert named is not None and id(named) in ids, (
                        op, fn.__qualname__, ast.unparse(node.func))
    modules = [module for name, module in sorted(vars(ops).items())
               if getattr(module, "__name__", "").startswith("eagle_kernels.ops.")]
    kernels = {f"{value.fn.__module__}.{value.fn.__name__}" for module in modules
               for value in vars(module).values() if is_kernel(value)}
    assert kernels and not kernels - covered, sorted(kernels - covered)


def test_the_report_names_entries_set_aside_for_changed_sources(monkeypatch, tmp_path):
    here = _backend.source_digest("build_tree", "triton")
    kernels = [_entry("build_tree", source_digest=here),
               _entry("tree_attention", source_digest="0" * 16)]
    pretend_gpu_with_verdict(monkeypatch, tmp_path, kernels)
    try:
        report = _backend.backend_report()
        table = _backend.op_backends()
    finally:
        _backend.gpu_verdict.cache_clear()
    assert table["build_tree"]["triton"] == "auto"
    assert table["tree_attention"]["triton"] == "explicit only"
    assert "set aside, source changed since that GPU run" in report, report
    now = _backend.source_digest("tree_attention", "triton")
    assert f"tree_attention triton (bfloat16): proved {'0' * 16}, here {now}" in report
    assert "build_tree triton" not in report.split("set aside")[1]


def test_the_verdict_records_the_digest_its_gpu_check_recorded(tmp_path):
    """bench/verdict.py copies the digest from the kernel check (run on the GPU by the code
    that ran there), as it copies the revision; auto follows the registry's rule here."""
    stage = tmp_path / "stage1"
    stage.mkdir()
    (stage / "gpu-tests.xml").write_text('<testsuites><testsuite><testcase '
                                         'file="tests/test_tree_kernels.py" name="t[triton]"/>'
                                         '</testsuite></testsuites>')
    (stage / "memcheck.tsv").write_text("build_tree\tclean\n")
    (stage / "bench.csv").write_text("op,backend,dtype,speedup_vs_torch\n"
                                     "build_tree,triton,int32,3\n")
    here = _backend.source_digest("build_tree", "triton")
    row = dict(op="build_tree", backend="triton", dtype="int32", status="correct",
               max_error=0.0, revision=_backend.kernel_revision("build_tree", "triton"))
    for recorded, joins in ((here, True), ("0" * 16, False), ("unknown", False), (None, True)):
        rows = [row if recorded is None else {**row, "source_digest": recorded}]
        (stage / "kernel-check.json").write_text(json.dumps({"device": "cuda:0",
                                                             "rows": rows}))
        entry = verdict.build([stage], "GPU A")["kernels"][0]
        assert entry["proven"] and entry.get("source_digest") == recorded
        assert ("source_digest" in entry) == (recorded is not None)  # old checks: legacy
        assert entry["auto"] == joins, entry


def test_the_kernel_check_records_each_backends_digest(monkeypatch):
    spec = importlib.util.spec_from_file_location("sanitize_kernels",
                                                  ROOT / "bench" / "sanitize_kernels.py")
    sanitize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sanitize)
    monkeypatch.setattr(sanitize, "_dtype_cases", lambda device, seed: [("build_tree", "int32",
                                                                          None)])
    monkeypatch.setattr(sanitize, "_run_case", lambda case, backend, device: {})
    rows = {row["backend"]: row for row in sanitize.verdict_rows(torch.device("cpu"))}
    for backend in ("triton", "cuda"):  # "unknown" where nothing vouches (no _C digests)
        want = _backend.source_digest("build_tree", backend) or "unknown"
        assert rows[backend]["source_digest"] == want, backend
