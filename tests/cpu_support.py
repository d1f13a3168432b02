"""Helpers for tests of the cpu backend (eagle_kernels._cpu): skip where it is not built (a
failing build under CI=true is an error, since CI machines have a C++ compiler), and run a
check once per instruction set the processor supports."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest
import torch

from eagle_kernels.ops import available_backends


def _cpu_status():
    return available_backends()["cpu"]


def cpu_backend_missing_reason() -> str | None:
    status = _cpu_status()
    return None if status.available else status.reason


if os.environ.get("CI") == "true" and cpu_backend_missing_reason() is not None:
    raise RuntimeError(f"CI=true but the cpu backend is missing: {cpu_backend_missing_reason()}")

needs_cpu_backend = pytest.mark.skipif(cpu_backend_missing_reason() is not None,
                                       reason=f"cpu backend: {cpu_backend_missing_reason()}")


def each_cpu_isa() -> Iterator[str]:
    """Yield with the kernels switched to each supported instruction set, then restore."""
    from eagle_kernels import _cpu

    default = _cpu.isa()
    try:
        for isa in _cpu.supported_isas():
            _cpu.set_isa(isa)
            yield isa
    finally:
        _cpu.set_isa(default)


CPU_ISAS = ("avx512", "avx2", "generic")


@contextlib.contextmanager
def using_cpu_isa(isa: str):
    """The cpu kernels switched to ``isa`` for the block (the test is skipped where the backend
    is not built or the processor lacks ``isa``), restored afterwards."""
    if cpu_backend_missing_reason() is not None:
        pytest.skip(f"cpu backend: {cpu_backend_missing_reason()}")
    from eagle_kernels import _cpu

    if isa not in _cpu.supported_isas():
        pytest.skip(f"this processor lacks {isa}")
    default = _cpu.isa()
    _cpu.set_isa(isa)
    try:
        yield isa
    finally:
        _cpu.set_isa(default)


def q4_exact_weight(gen, out: int, width: int) -> torch.Tensor:
    """A GGUF Q4_1 tensor dequantized to fp32: per 32 consecutive k an fp16 d > 0 and m, q in
    0..15 with 0 and 15 present (as llama.cpp's quantizer makes them), w = fl(d * q + m); the
    first block of the first row has equal weights (d = 0). m is the block's minimum, so
    |m| >= d / 2 here (about 7 d for weights centred on zero; either sign)."""
    blocks = width // 32
    d = (torch.rand(out, blocks, 1, generator=gen) * 0.02 + 1e-4).half().float()
    sign = torch.randint(0, 2, (out, blocks, 1), generator=gen).float() * 2 - 1
    m = (sign * d * (0.5 + 10 * torch.rand(out, blocks, 1, generator=gen))).half().float()
    q = torch.randint(0, 16, (out, blocks, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15
    d[0, 0], q[0, 0] = 0.0, 0.0  # one block of equal weights: d = 0
    return (d * q + m).reshape(out, width)


def q8_exact_weight(gen, out: int, width: int) -> torch.Tensor:
    """A GGUF Q8_0 tensor dequantized to fp32: per 32 consecutive k an fp16 d > 0, q in
    -127..127 with |q| = 127 present, w = d * q (exact)."""
    blocks = width // 32
    d = (torch.rand(out, blocks, 1, generator=gen) * 0.01 + 1e-4).half().float()
    q = torch.randint(-127, 128, (out, blocks, 32), generator=gen).float()
    q[..., 0] = 127
    return (d * q).reshape(out, width)


def q4_exact_layers(target) -> None:
    """Every linear weight of ``target``'s layers made a GGUF Q4_1 tensor dequantized to fp32
    (as the default target's layers are)."""
    with torch.no_grad():
        for layer in target.model.layers:
            for module in (*layer.self_attn.children(), *layer.mlp.children()):
                if isinstance(module, torch.nn.Linear):
                    out, width = module.weight.shape
                    module.weight.copy_(q4_exact_weight(torch.Generator().manual_seed(out), out,
                                                        width))
