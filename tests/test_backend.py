"""Backend dispatch: availability report, auto resolution, environment override, value checks."""

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
    assert set(table) == ALL_OPS
    assert all(impls.get("torch") == "auto" for impls in table.values())


def test_available_backends_explain_themselves(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    status = ops.available_backends()
    assert set(status) == {"cuda", "triton", "torch"} and status["torch"].available
    for name, (available, reason) in status.items():
        assert reason, name
    if not torch.cuda.is_available():
        assert not status["cuda"].available and not status["triton"].available
        assert "TRITON_INTERPRET=1" in status["triton"].reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ops.available_backends()["triton"].available or "cannot import triton" in \
        ops.available_backends()["triton"].reason
    report = ops.backend_report()
    assert all(op in report for op in ALL_OPS)


def test_auto_resolves_to_torch_until_kernels_are_proven(monkeypatch):
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    for op in ALL_OPS:
        assert _backend.resolve(op, "auto", torch.device("cpu"))[0] == "torch"


def test_environment_forces_a_backend(monkeypatch):
    monkeypatch.setenv(_backend.BACKEND_ENV, "torch")
    assert _backend.resolve("build_tree", "auto", torch.device("cpu"))[0] == "torch"
    ops.build_tree(PARENTS)
    monkeypatch.setenv(_backend.BACKEND_ENV, "cuda")
    with pytest.raises(ValueError, match="backend: 'cuda'"):
        ops.build_tree(PARENTS)
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
