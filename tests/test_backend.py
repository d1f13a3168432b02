"""Backend dispatch: availability report, auto resolution, environment override, value checks."""

from pathlib import Path

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import _backend

PARENTS = torch.tensor([[-1, 0, 0]], dtype=torch.int32)
ALL_OPS = {"build_tree", "compact_kv", "eagle2_expand", "eagle2_rerank", "greedy_accept_chain",
           "greedy_accept_tree", "stochastic_accept_chain", "stochastic_accept_tree",
           "soft_cross_entropy", "target_probs", "topk_log_softmax", "tree_attention"}


def test_every_op_has_a_torch_reference():
    table = ops.op_backends()
    assert ALL_OPS <= set(table)
    assert all(impls.get("torch") == "auto" for impls in table.values())


def test_available_backends_explain_themselves(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    status = ops.available_backends()
    assert set(status) == {"cuda", "triton", "cpu", "torch"} and status["torch"].available
    for name, (available, reason) in status.items():
        assert reason, name
    if not torch.cuda.is_available():
        assert not status["cuda"].available and not status["triton"].available
        assert "TRITON_INTERPRET=1" in status["triton"].reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ops.available_backends()["triton"].available or "triton is not installed" in \
        ops.available_backends()["triton"].reason
    report = ops.backend_report()
    assert all(op in report for op in ALL_OPS)


# Ops whose cpu kernels auto takes on CPU without a dtype fact (tree_attention's fp32 rule is
# checked by its own tests; the decoder ops state their dtype and are covered in test_decoder).
CPU_AUTO_OPS = {"tree_attention", "topk_log_softmax", "eagle2_expand", "eagle2_rerank",
                "build_tree", "greedy_accept_tree", "greedy_accept_chain", "compact_kv"}


def test_auto_resolves_to_torch_until_kernels_are_proven(monkeypatch):
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    cpu_built = ops.available_backends()["cpu"].available
    for op in ALL_OPS:
        if op == "tree_attention":
            continue
        expected = "cpu" if cpu_built and op in CPU_AUTO_OPS else "torch"
        assert _backend.resolve(op, "auto", torch.device("cpu"))[0] == expected, op


def test_environment_forces_a_backend(monkeypatch):
    monkeypatch.setenv(_backend.BACKEND_ENV, "torch")
    assert _backend.resolve("build_tree", "auto", torch.device("cpu"))[0] == "torch"
    ops.build_tree(PARENTS)
    monkeypatch.setenv(_backend.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match="backend: 'cuda'"):
        ops.build_tree(PARENTS)
    # an op the forced backend lacks runs its torch reference (its inner ops forced in turn);
    # asked for by name, the same backend is refused
    monkeypatch.setitem(_backend._REGISTRY, "torch_only_op",
                        {"torch": _backend._Implementation(lambda: None, True)})
    assert _backend.resolve("torch_only_op", "auto", torch.device("cpu"))[0] == "torch"
    with pytest.raises(ValueError, match="torch_only_op has no 'cuda' implementation"):
        _backend.resolve("torch_only_op", "cuda", torch.device("cpu"))
    # an explicit argument beats the environment
    assert ops.build_tree(PARENTS, backend="torch")[0].tolist() == [[0, 1, 1]]
    monkeypatch.setenv(_backend.BACKEND_ENV, "fastest")
    with pytest.raises(ValueError, match=_backend.BACKEND_ENV):
        ops.build_tree(PARENTS)


def test_explicit_backend_errors_name_the_problem(monkeypatch):
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    # every real op has a Triton kernel now: a torch-only op registered for this test
    monkeypatch.setitem(_backend._REGISTRY, "torch_only_op",
                        {"torch": _backend._Implementation(lambda: None, True)})
    with pytest.raises(ValueError, match="torch_only_op has no 'triton' implementation"):
        _backend.resolve("torch_only_op", "triton", torch.device("cpu"))
    with pytest.raises(ValueError, match="backend: expected 'auto' or one of"):
        ops.build_tree(PARENTS, backend="CUDA")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="backend: 'cuda' is not available here"):
            ops.build_tree(PARENTS, backend="cuda")


def test_value_checks_can_be_turned_off(monkeypatch):
    tokens = torch.tensor([[0, 99]])
    logits = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match="tokens: expected values in"):
        ops.greedy_accept_chain(tokens, logits)
    monkeypatch.setenv(ops.CHECK_VALUES_ENV, "0")
    assert not ops.value_checks_enabled()
    assert ops.greedy_accept_chain(tokens, logits).num_accepted.tolist() == [0]


def test_value_checks_turned_off_in_one_thread_stay_on_in_another():
    """A no_value_checks block (a generation loop's step, a training step) holds for its own
    thread only: another thread's calls are still checked, also while the block is open (one
    process-wide counter switched them off for every thread)."""
    import threading

    from eagle_kernels.ops._validate import no_value_checks

    entered, release, seen = threading.Event(), threading.Event(), []

    def loop():
        with no_value_checks():
            seen.append(ops.value_checks_enabled())
            entered.set()
            release.wait(10)

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        assert entered.wait(10)
        assert ops.value_checks_enabled()
        with pytest.raises(ValueError, match="tokens: expected values in"):
            ops.greedy_accept_chain(torch.tensor([[0, 99]]), torch.zeros(1, 2, 4))
    finally:
        release.set()
        worker.join()
    assert seen == [False] and ops.value_checks_enabled()


# --------------------------------------------------------------------------------------------
# What a backend can take (issue 13 b): supports= at registration, facts from every op
# --------------------------------------------------------------------------------------------

STAR_1025 = torch.cat([torch.tensor([[-1]]), torch.zeros(1, 1024, dtype=torch.int64)], 1).int()


def _enable_for_auto(monkeypatch, op, backend):
    """Pretend a GPU verdict proved ``backend``'s ``op`` (GPU kernels join auto only so)."""
    real = _backend._proven_here
    monkeypatch.setattr(_backend, "_proven_here", lambda name, impl, device, facts: (
        (name, impl) == (op, backend) or real(name, impl, device, facts)))


def test_auto_falls_through_what_a_backend_cannot_take(monkeypatch):
    """build_tree passes N to resolve: with its Triton kernel enabled for auto, a tree past
    TRITON_MAX_NODES falls through to the next backend (cpu, which has no node limit, or torch
    where it is not built) instead of raising; a small one runs on Triton."""
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _enable_for_auto(monkeypatch, "build_tree", "triton")
    if not _backend.backend_status("triton").available:
        pytest.skip("triton not installed")
    depth, _, paths = ops.build_tree(STAR_1025, max_depth=1)
    assert depth[0, -1] == 1 and paths.shape == (1, 1025, 2)
    after_triton = "cpu" if ops.available_backends()["cpu"].available else "torch"
    assert _backend.resolve("build_tree", "auto", torch.device("cpu"),
                            num_nodes=1025)[0] == after_triton
    assert _backend.resolve("build_tree", "auto", torch.device("cpu"), num_nodes=4)[0] == "triton"


def _two_proven_kernels(monkeypatch, tmp_path, speedups: dict) -> None:
    """Pretend this machine has a GPU on which cuda and triton both run, and whose verdict
    proves both top-k kernels with ``speedups`` {(backend, dtype): speedup}."""
    from cuda_support import pretend_gpu_with_verdict

    pretend_gpu_with_verdict(monkeypatch, tmp_path, [
        {"op": "topk_log_softmax", "backend": backend, "dtype": dtype, "proven": True,
         "speedup_vs_torch": speedup,
         "revision": _backend.kernel_revision("topk_log_softmax", backend)}
        for (backend, dtype), speedup in speedups.items()])
    monkeypatch.setattr(_backend, "_available", lambda name: True)
    monkeypatch.setattr(_backend, "source_changed", lambda entry: False)  # digests: their tests


def test_auto_takes_the_faster_of_two_proven_gpu_kernels(monkeypatch, tmp_path):
    """Both kernels proven and faster than torch: auto runs the one the verdict measured
    faster at the inputs' dtype (on the 2026-11-28 H200 the cuda top-k was 9x slower than the
    triton one, and auto, taking cuda first, ran it); an op passing no dtype takes the faster
    at the slowest dtype, and op_backends labels that one."""
    _two_proven_kernels(monkeypatch, tmp_path, {
        ("cuda", "bfloat16"): 6.7, ("triton", "bfloat16"): 62.3,
        ("cuda", "float32"): 9.0, ("triton", "float32"): 4.0})
    gpu = torch.device("cuda")
    try:
        pick = lambda **facts: _backend.resolve("topk_log_softmax", "auto", gpu, k=10,
                                                **facts)[0]
        assert pick(dtype=torch.bfloat16) == "triton"
        assert pick(dtype=torch.float32) == "cuda"
        assert pick() == "cuda"  # top-k passes no dtype: cuda's 6.7 against triton's 4.0
        labels = ops.op_backends()["topk_log_softmax"]
        assert (labels["cuda"], labels["triton"]) == ("auto", "explicit only")
        # the preferred kernel past its limits: auto falls through to the other proven one
        most = _backend.cuda_limit("TOPK_MAX_K")
        if most is not None:
            assert _backend.resolve("topk_log_softmax", "auto", gpu, k=most + 1)[0] == "triton"
    finally:
        _backend.gpu_verdict.cache_clear()


def test_auto_keeps_backends_order_between_kernels_measured_alike(monkeypatch, tmp_path):
    """Within AUTO_FASTER_BY of each other (noise), cuda stays first: a pick that flips with
    a few % of benchmark noise would change from one verdict to the next."""
    alike = 5.0 * _backend.AUTO_FASTER_BY * 0.99
    _two_proven_kernels(monkeypatch, tmp_path, {
        ("cuda", "bfloat16"): 5.0, ("triton", "bfloat16"): alike,
        ("cuda", "float16"): 5.0, ("triton", "float16"): 5.0 * _backend.AUTO_FASTER_BY * 1.01})
    gpu = torch.device("cuda")
    try:
        pick = lambda dtype: _backend.resolve("topk_log_softmax", "auto", gpu, k=10,
                                              dtype=dtype)[0]
        assert pick(torch.bfloat16) == "cuda" and pick(torch.float16) == "triton"
    finally:
        _backend.gpu_verdict.cache_clear()


def test_explicit_request_for_unsupported_inputs_names_the_limit():
    with pytest.raises(ValueError, match=r"'triton' cannot run build_tree.*TRITON_MAX_NODES"):
        ops.build_tree(STAR_1025, max_depth=1, backend="triton")
    q = torch.zeros(1, 1, 1, 264)  # head_dim past TRITON_MAX_HEAD_DIM (256)
    with pytest.raises(ValueError, match="TRITON_MAX_HEAD_DIM"):
        ops.tree_attention(q, q, q, torch.zeros(1, dtype=torch.int32),
                           torch.ones(1, 1, 1, dtype=torch.int32), backend="triton")
    with pytest.raises(ValueError, match="soft_cross_entropy has no 'cuda' implementation"):
        ops.soft_cross_entropy(torch.zeros(2, 4), torch.zeros(2, 4), backend="cuda")


@pytest.fixture
def cuda_runs_here(monkeypatch, ext):
    """Pretend the cuda backend runs on CPU tensors, so resolve() reaches the supports checks
    (the limits come from the real, built _C module)."""
    real = _backend.backend_status
    monkeypatch.setattr(_backend, "backend_status", lambda name: _backend.BackendStatus(
        True, "test") if name == "cuda" else real(name))
    monkeypatch.setattr(_backend, "_supports_device", lambda name, device: True)
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    return ext


def test_cuda_limits_are_exported_by_the_extension(ext):
    assert ext.TOPK_MAX_K == 32 and ext.EXPAND_MAX_CANDIDATES == 6144
    assert ext.BUILD_TREE_MAX_NODES == 8192 and ext.RERANK_MAX_CANDIDATES == 2048
    assert ext.STOCHASTIC_ACCEPT_MAX_NODES == 2048
    assert tuple(ext.ATTENTION_HEAD_DIMS) == (64, 128)
    assert tuple(ext.ATTENTION_DTYPE_CODES) == (1, 2)


def test_every_op_passes_the_facts_its_cuda_limits_need(cuda_runs_here):
    """Each public op, asked for cuda past a limit, raises the resolve() error naming the _C
    constant before any kernel runs (CPU tensors: a kernel call would fail differently)."""
    from eagle_kernels.ops._validate import no_value_checks

    def raises(limit, call):
        with pytest.raises(ValueError, match=rf"backend: 'cuda' cannot run .*{limit}"):
            call()

    ext = cuda_runs_here
    with no_value_checks():
        raises("TOPK_MAX_K", lambda: ops.topk_log_softmax(torch.zeros(1, 64), ext.TOPK_MAX_K + 1,
                                                          backend="cuda"))
        raises("EXPAND_MAX_CANDIDATES", lambda: ops.eagle2_expand(
            torch.zeros(1, 1), torch.zeros(1, 1, ext.EXPAND_MAX_CANDIDATES + 1), 1,
            backend="cuda"))
        m = ext.RERANK_MAX_CANDIDATES + 1
        raises("RERANK_MAX_CANDIDATES", lambda: ops.eagle2_rerank(
            torch.zeros(1, dtype=torch.int64), torch.zeros(1, m, dtype=torch.int64),
            torch.zeros(1, m), torch.full((1, m), -1, dtype=torch.int32), 2, backend="cuda"))
        n = ext.BUILD_TREE_MAX_NODES + 1
        raises("BUILD_TREE_MAX_NODES", lambda: ops.build_tree(
            torch.zeros(1, n, dtype=torch.int32), max_depth=1, backend="cuda"))
        n = ext.STOCHASTIC_ACCEPT_MAX_NODES + 1
        tokens, logits = torch.zeros(1, n, dtype=torch.int64), torch.zeros(1, n, 2)
        uniforms, bonus = torch.zeros(1, n), torch.zeros(1)
        raises("STOCHASTIC_ACCEPT_MAX_NODES", lambda: ops.stochastic_accept_tree(
            tokens, torch.zeros(1, n, dtype=torch.int32), logits, uniforms, bonus, max_depth=1,
            backend="cuda"))
        raises("STOCHASTIC_ACCEPT_MAX_NODES", lambda: ops.stochastic_accept_chain(
            tokens, torch.zeros(1, n - 1, 2), logits, uniforms, bonus, backend="cuda"))
        lens, mask = torch.zeros(1, dtype=torch.int32), torch.ones(1, 1, 1, dtype=torch.int32)
        q32 = torch.zeros(1, 1, 1, 64)
        raises("ATTENTION_DTYPE_CODES", lambda: ops.tree_attention(q32, q32, q32, lens, mask,
                                                                   backend="cuda"))
        q16 = torch.zeros(1, 1, 1, 32, dtype=torch.float16)
        raises("ATTENTION_HEAD_DIMS", lambda: ops.tree_attention(q16, q16, q16, lens, mask,
                                                                 backend="cuda"))


def test_auto_skips_cuda_past_its_limits(cuda_runs_here, monkeypatch):
    _enable_for_auto(monkeypatch, "topk_log_softmax", "cuda")
    cpu = torch.device("cpu")
    limit = cuda_runs_here.TOPK_MAX_K
    assert _backend.resolve("topk_log_softmax", "auto", cpu, k=limit)[0] == "cuda"
    assert _backend.resolve("topk_log_softmax", "auto", cpu, k=limit + 1)[0] != "cuda"


def test_cuda_limits_without_the_extension(monkeypatch):
    """With _C not built no limit applies (the backend is unavailable anyway) and nothing in
    the supports checks imports it."""
    monkeypatch.setattr(_backend, "_import_status",
                        lambda module: _backend.BackendStatus(False, "not built (test)"))
    assert _backend.cuda_limit("TOPK_MAX_K") is None
    for op, facts in (("topk_log_softmax", dict(k=10**6)), ("build_tree", dict(num_nodes=10**6)),
                      ("tree_attention", dict(dtype=torch.float32, head_dim=3))):
        assert _backend._REGISTRY[op]["cuda"].supports(**facts) is None
    assert not _backend.backend_status("cuda").available


def test_the_ops_resolved_without_a_dtype_are_the_ones_auto_ranks_over_every_dtype():
    """_backend.DTYPE_FREE_OPS (how auto and verdict.txt rank an op's kernels) matches the
    resolve calls of eagle_kernels/ops: an op whose call passes dtype= is ranked per dtype."""
    import re

    from eagle_kernels.ops._backend import _REGISTRY, DTYPE_FREE_OPS

    by_dtype, without = set(), set()
    for path in (Path(__file__).resolve().parents[1] / "eagle_kernels" / "ops").glob("*.py"):
        text = path.read_text()
        for match in re.finditer(r'resolve\("(\w+)"', text):
            depth, end = 0, match.start() + len("resolve")
            for end in range(end, len(text)):  # to the call's closing parenthesis
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                if depth == 0:
                    break
            call = text[match.start():end]
            (by_dtype if "dtype=" in call else without).add(match.group(1))
    assert not by_dtype & without  # one op, one way
    assert without == set(DTYPE_FREE_OPS)
    assert by_dtype | without <= set(_REGISTRY)
