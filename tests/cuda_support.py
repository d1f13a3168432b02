"""Shared helpers of the csrc/ (eagle_kernels._C) kernel tests.

* ``load_extension_or_skip`` (the ``ext`` fixture of conftest.py): the extension module. Under
  ``CI=true`` with nvcc on PATH a missing extension fails the run (the build silently fell back
  to pure Python); elsewhere it skips.
* Outputs are prefilled with ``SENTINEL`` so an entry a kernel forgot to write shows up, and
  ``guarded`` buffers carry ``GUARD`` sentinel entries each side to catch out-of-bounds writes.
* ``pretend_gpu_with_verdict``: a GPU called "GPU A" whose committed verdict holds the given
  entries (backend dispatch tests, no GPU needed).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil

import pytest
import torch

from conftest import BASE_SEED

DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


SENTINEL = -7777  # prefilled into outputs: an entry the kernel forgot to write shows up


GUARD = 64  # sentinel entries before and after every output in the bounds tests


def _import_extension():
    try:
        return importlib.import_module("eagle_kernels._C"), None
    except Exception as error:  # a broken build can raise OSError as well as ImportError
        return None, error


def _missing_extension(error) -> None:
    nvcc = shutil.which("nvcc")
    message = f"eagle_kernels._C not importable ({error})"
    if os.environ.get("CI") == "true" and nvcc:
        pytest.fail(f"{message}, but CI=true and nvcc is on PATH ({nvcc}): the build must "
                    "produce the extension here")
    pytest.skip(f"{message}; nvcc on PATH: {nvcc or 'no'}")


def load_extension_or_skip():
    """The extension module, or skip (fail under CI with nvcc) when it cannot be imported."""
    module, error = _import_extension()
    if module is None:
        _missing_extension(error)
    return module


def seed_note(gen: torch.Generator) -> str:
    return f"(test seed {gen.initial_seed()}; replay with EAGLE_TEST_SEED={BASE_SEED})"


def assert_same(actual, expected, note: str) -> None:
    for name, a, e in zip(("first", "second", "third"), actual, expected):
        assert a.dtype == e.dtype, f"{name} output dtype {a.dtype} != {e.dtype} {note}"
        assert torch.equal(a, e), f"{name} output differs {note}\nkernel:\n{a}\nreference:\n{e}"


def guarded(shape, dtype, device="cpu"):
    """A sentinel-filled buffer with GUARD spare entries each side, and its inner view."""
    numel = 1
    for size in shape:
        numel *= size
    buffer = torch.full((numel + 2 * GUARD,), SENTINEL, dtype=dtype, device=device)
    return buffer, buffer[GUARD:GUARD + numel].view(shape)


def assert_guards(buffer, note):
    assert bool((buffer[:GUARD] == SENTINEL).all() and (buffer[-GUARD:] == SENTINEL).all()), \
        f"write outside the output {note}"


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
# Tests that run the Triton kernels on CUDA tensors where a GPU is, in the interpreter elsewhere:
# `gpu`-marked (the lent GPU's `pytest -m gpu` runs them) only on a CUDA machine, so the CPU
# rehearsal of the GPU stages (whose GPU tests must skip) does not run them a second time.
gpu_when_present = pytest.mark.gpu if torch.cuda.is_available() else pytest.mark.interpreted


def pretend_gpu_with_verdict(monkeypatch, folder, kernels: list[dict], gpu: str = "GPU A"):
    """Make ``torch.cuda`` report one GPU called ``gpu`` whose verdict (written under
    ``folder``, which the backend registry then reads) holds ``kernels``; the registry's
    verdict cache is cleared, and the caller clears it again when done."""
    from eagle_kernels.ops import _backend

    run = folder / "2026-12-01_gpu"
    run.mkdir()
    (run / "verdict.json").write_text(json.dumps(
        {"schema": _backend.VERDICT_SCHEMA, "gpu": gpu, "date": "2026-12-01",
         "kernels": kernels}))
    monkeypatch.setenv(_backend.VERDICT_ENV, str(folder))
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    _backend.gpu_verdict.cache_clear()
