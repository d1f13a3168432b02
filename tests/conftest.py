"""Shared test fixtures: fresh random seeds every run, reproducible on demand.

Each run draws a new base seed, printed in the pytest header, in the terminal summary (which
``-q`` keeps) and in a section of every failed test's report; set ``EAGLE_TEST_SEED`` to that
value to replay a failing run exactly. Every test gets its own generator seeded from the base
seed and its node id. pytest-xdist workers share the controller's base seed (it exports
``EAGLE_TEST_SEED`` before they start), so one printed value replays every worker's tests.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

# Triton kernels run on CPU tensors in the interpreter; the flag must be set before any module
# defining @triton.jit kernels is imported, and conftest is imported first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import interpreter_bounds
    interpreter_bounds.install()  # every load / store inside one of the launch's tensors
except Exception:  # no (working) triton: the Triton backends are unavailable and skipped;
    pass           # test_interpreter_bounds then fails on its own if triton imports

BASE_SEED = int(os.environ.get("EAGLE_TEST_SEED", int.from_bytes(os.urandom(4), "little")))


def seed_line() -> str:
    return f"eagle_kernels test seed: EAGLE_TEST_SEED={BASE_SEED}"


def pytest_report_header(config):
    return seed_line()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The seed again at the end: pytest 9 drops the header under -q (make test, stage 1)."""
    terminalreporter.write_line(seed_line())


@pytest.fixture(scope="session")
def ext():
    """The compiled eagle_kernels._C; skips (fails under CI=true with nvcc) when missing."""
    from cuda_support import load_extension_or_skip

    return load_extension_or_skip()


@pytest.fixture
def gen(request) -> torch.Generator:
    """A CPU generator seeded from the run's base seed and the test's id."""
    seed = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**63
    generator = torch.Generator().manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    return generator


SHAPES = ("uniform", "deep", "bushy", "chain", "star")


def random_parents(batch: int, num_nodes: int, gen: torch.Generator,
                   shape: str = "uniform") -> torch.Tensor:
    """[B, N] int32 random topologically ordered trees (parents[b, i] < i) of one shape:
    uniform parent; "deep" (one of the last three nodes: long EAGLE-like paths); "bushy" (the
    first quarter: wide and shallow); "chain"; "star" (every node a child of the root)."""
    parents = torch.full((batch, num_nodes), -1, dtype=torch.int32)
    for node in range(1, num_nodes):
        u = torch.rand(batch, generator=gen)
        if shape == "uniform":
            parent = (u * node).long()
        elif shape == "deep":
            parent = node - 1 - (u * min(node, 3)).long()
        elif shape == "bushy":
            parent = (u * max(1, node // 4)).long()
        elif shape == "chain":
            parent = torch.full((batch,), node - 1)
        else:
            parent = torch.zeros(batch, dtype=torch.long)
        parents[:, node] = parent.to(torch.int32)
    return parents


def assert_as_close_as_torch(ours, torch_low, exact, note=""):
    """Error rule of the project: within 2x the error of torch at the same precision, plus a
    noise floor of a few ulps of the output's scale."""
    scale = float(exact.abs().max()) if exact.numel() else 1.0
    ours_error = float((ours.double() - exact).abs().max()) if exact.numel() else 0.0
    torch_error = float((torch_low.double() - exact).abs().max()) if exact.numel() else 0.0
    assert ours_error <= 2 * torch_error + 4e-7 * scale, (ours_error, torch_error, scale, note)


def chain_parents(batch: int, num_nodes: int) -> torch.Tensor:
    """[B, N] int32 chain-shaped trees: node i's parent is i - 1."""
    parents = torch.arange(-1, num_nodes - 1, dtype=torch.int32)
    return parents.expand(batch, -1).contiguous()


# --------------------------------------------------------------------------------------------
# The `gpu` marker (bench/stages/stage1_correctness.sh runs `pytest -m gpu` on a lent GPU)
# --------------------------------------------------------------------------------------------
# A test is a GPU test when it says so (@pytest.mark.gpu) or skips without a CUDA device
# (cuda_support.needs_gpu, or a module-level skipif with one of these reasons).
GPU_SKIP_REASONS = ("no CUDA device", "needs a CUDA device")
# What a Triton kernel launched on CPU tensors raises where TRITON_INTERPRET is off: the
# driver's pointer check, or resolve() refusing the triton backend for CPU tensors.
INTERPRETER_ONLY_ERRORS = ("cannot be accessed from Triton (cpu tensor?)",
                           "'triton' cannot run", "'triton' is not available here")


def pytest_configure(config):
    # The controller (or a plain run) exports its base seed before pytest-xdist starts workers:
    # they inherit the environment, so each imports this file with the same BASE_SEED.
    if not hasattr(config, "workerinput"):
        os.environ["EAGLE_TEST_SEED"] = str(BASE_SEED)
    config.addinivalue_line("markers", "gpu: needs a CUDA device; the lent-GPU stage runs "
                            "exactly these (pytest -m gpu)")
    config.addinivalue_line("markers", "interpreted: a Triton test running in the interpreter "
                            "because no GPU is here (gpu-marked where one is)")


def _needs_cuda(item) -> bool:
    return any(mark.name == "gpu" or (mark.name == "skipif" and any(
        reason in str(mark.kwargs.get("reason", "")) for reason in GPU_SKIP_REASONS))
        for mark in item.iter_markers())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _needs_cuda(item) and item.get_closest_marker("gpu") is None:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Every failed report gets a section naming the seeds that replay it. And on a CUDA
    machine TRITON_INTERPRET is off, so a test that runs Triton kernels on CPU tensors (the
    interpreter route CI proves them by) cannot run: skip it, naming why. GPU tests are never
    skipped so: there such an error is a real bug."""
    outcome = yield
    report = outcome.get_result()
    _skip_interpreter_only(item, call, report)
    if report.failed:
        seeds = [str(value) for name, value in item.user_properties if name == "seed"]
        test_seed = f" (test seed {', '.join(seeds)})" if seeds else ""
        report.sections.append(("eagle_kernels test seed",
                                f"EAGLE_TEST_SEED={BASE_SEED}{test_seed}"))


def _skip_interpreter_only(item, call, report) -> None:
    if (report.failed and call.excinfo is not None and torch.cuda.is_available()
            and os.environ.get("TRITON_INTERPRET", "0") != "1"
            and item.get_closest_marker("gpu") is None
            and any(text in str(call.excinfo.value) for text in INTERPRETER_ONLY_ERRORS)):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           "Skipped: Triton interpreter test (CPU tensors); TRITON_INTERPRET "
                           "is off where CUDA exists")
