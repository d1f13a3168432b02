"""soft_cross_entropy: the reference against hand-computed goldens and float64 formulas, the
Triton kernels (the interpreter on CPU, compiled on a GPU) and the cpu kernel against float64,
forward and backward.

The truth is always the loss / gradient computed in float64 from the (exactly upcast) inputs
(``fp64_truth``); the yardstick is torch's own error against it at the precision the output is
computed in. Per dtype:

* loss (fp32 in every dtype: fp16 / bf16 inputs are upcast exactly, so the loss is fp32 math):
  error <= 2x the error of the fp32 reference (``torch_fp32``) + 1e-6 of the loss scale
  (1 + max |finite loss|: ~8 ulps, the noise floor of a sum over V terms);
* fp32 gradient: <= 2x the fp32 reference's gradient error + 1e-6 (1 + max |weight|) (a few
  ulps of the largest |gradient| <= |weight|);
* fp16 / bf16 gradient (rounded to x's dtype): within 2x the error of the same formula done by
  torch in x's dtype (``low_precision_formula``) + that noise, or, per element, the rounding no
  output in that dtype can avoid: half an ulp of the exact value on top of the fp32 budget.

Given the run's seed each verdict is deterministic (seeded inputs, deterministic CPU code);
over seeds the budgets rest on maxima over whole [T, V] outputs of fp32 rounding errors (see
check_triton_case for the measured margins).
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F

from eagle_kernels import ops
from eagle_kernels.ops import reference

from conftest import assert_as_close_as_torch
from cpu_support import each_cpu_isa, needs_cpu_backend
from cuda_support import needs_gpu, seed_note

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# relative rounding error of the gradient's dtype (normal range); Triton's interpreter converts
# fp32 -> bf16 by truncation (a GPU rounds to nearest even): a whole ulp there
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
HALF_ULP = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** (-7 if INTERPRETED else -8)}


def random_case(gen, rows, vocab, dtype, scale=3.0, device="cpu"):
    """x, y [rows, vocab] with masked vocab (-inf in both, ~10% of columns, never the last)
    plus a few -inf in y only; per-row weights with zeros (rows the caller masks out)."""
    x = torch.randn(rows, vocab, generator=gen) * scale
    y = torch.randn(rows, vocab, generator=gen) * scale
    masked = torch.rand(vocab, generator=gen) < 0.1
    masked[-1] = False
    x[:, masked] = float("-inf")
    y[:, masked] = float("-inf")
    y[torch.rand(rows, vocab, generator=gen) < 0.05] = float("-inf")
    y[:, -1] = y[:, -1].clamp(min=0.0)  # every row keeps a finite target
    weights = torch.randn(rows, generator=gen)
    weights[torch.rand(rows, generator=gen) < 0.3] = 0.0
    return x.to(dtype).to(device), y.to(dtype).to(device), weights.to(device)


def loss_and_grad(fn, x, y, weights):
    leaf = x.clone().requires_grad_(True)
    loss = fn(leaf, y)
    (loss * weights).sum().backward()
    return loss.detach(), leaf.grad


def torch_fp32(x, y, weights):
    """Loss and gradient computed by torch in fp32 from the (exactly upcast) inputs (the
    reference): the fp32 yardstick of the error budgets."""
    loss, grad = loss_and_grad(reference.soft_cross_entropy, x.float(), y.float(), weights)
    return loss, grad


def fp64_truth(x, y, weights):
    """Loss and gradient in float64 from the exactly upcast inputs: the truth every check
    measures errors against (the reference upcasts to fp32 only)."""
    x, y = x.double(), y.double()
    p = torch.softmax(y, -1)
    loss = -(p * torch.log_softmax(x, -1).masked_fill(p == 0, 0)).sum(-1)
    grad = (torch.softmax(x, -1) - p) * weights.double()[:, None]
    return loss, grad


def loss_scale(want_loss):
    finite = want_loss[torch.isfinite(want_loss)]
    return 1.0 + (float(finite.abs().max()) if finite.numel() else 0.0)


def loss_budget(torch_loss, want_loss):
    """2x torch's fp32 loss error + 1e-6 of the loss scale (the module note)."""
    return 2 * max_err(torch_loss, want_loss) + 1e-6 * loss_scale(want_loss)


def grad_noise(weights):
    """A few ulps of the largest |gradient| (<= |weight|)."""
    return 1e-6 * (1.0 + float(weights.abs().max()))


def low_precision_formula(x, y, weights):
    """The same formula evaluated in x's dtype: the error budget for low-precision kernels."""
    log_q = torch.log_softmax(x, -1)
    p = torch.softmax(y, -1)
    loss = -(p * log_q.masked_fill(p == 0, 0)).sum(-1)
    grad = (torch.softmax(x, -1) - p) * weights.to(x.dtype)[:, None]
    return loss.float(), grad.to(x.dtype)  # y may be fp32 under bf16 x: round like the kernel


def max_err(a, b):
    a, b = a.float(), b.float()
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    return float(torch.where(both_inf, 0.0, (a - b).abs()).max()) if a.numel() else 0.0


# ---------------------------------------------------------------- reference goldens


def test_reference_hand_golden():
    # p = [1/4, 3/4], q = [1/2, 1/2]: loss = log 2. Fixed inputs (nothing random): the fp32
    # result is log 2 to a few ulps (6e-8 each); abs=1e-6 is ~16 ulps, deterministic.
    x = torch.zeros(1, 2)
    y = torch.tensor([[0.0, math.log(3.0)]])
    assert reference.soft_cross_entropy(x, y).tolist() == pytest.approx([math.log(2.0)], abs=1e-6)


# The two reference checks below: conftest.assert_as_close_as_torch against a float64 formula,
# the yardstick the same formula done by torch in fp32 (2x its error + 4e-7 of the output's
# scale). Measured over 5000 seeds: error / budget max 0.18 (one-hot) and 0.47 (entropy); an
# exponential tail fitted to the top 1% gives < 1e-8. Power: the reference's loss scaled by
# 1 + 1e-6 fails both (the old fixed rtol / atol passed it).


def test_reference_one_hot_target_is_cross_entropy(gen):
    x = torch.randn(6, 50, generator=gen)
    labels = torch.randint(0, 50, (6,), generator=gen)
    y = torch.full((6, 50), float("-inf"))
    y[torch.arange(6), labels] = 0.0
    got = reference.soft_cross_entropy(x, y)
    assert got.dtype == torch.float32 and got.shape == (6,)
    assert_as_close_as_torch(got, F.cross_entropy(x, labels, reduction="none"),
                             F.cross_entropy(x.double(), labels, reduction="none"), seed_note(gen))


def test_reference_equal_logits_is_entropy(gen):
    x = torch.randn(5, 33, generator=gen) * 2

    def entropy(x):
        p = torch.softmax(x, -1)
        return -(p * p.log()).sum(-1)

    got = reference.soft_cross_entropy(x, x)
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert_as_close_as_torch(got, entropy(x), entropy(x.double()), seed_note(gen))


def test_reference_gradient_matches_an_independent_formula(gen):
    """The reference's loss and autograd gradient against lse(x) - E_p[x] in float64, the
    yardstick that formula in fp32, with the budgets of the kernels (loss_budget, grad_noise):
    4 rows are too few maxima for the 4e-7 noise (error / budget reached 1.4 in 5000 seeds).
    Measured over 20000 seeds: error / budget max 0.32 (loss) and 0.19 (gradient); an
    exponential tail fitted to the top 5% gives < 1e-7 each. Power: the reference's logits
    scaled by 1 + 3e-6 fail every seed (loss)."""
    x, y, weights = random_case(gen, 4, 40, torch.float32)

    def independent(x, y):  # lse(x) - E_p[x], masked terms dropped, in x's dtype
        p = torch.softmax(y.to(x.dtype), -1)
        return torch.logsumexp(x, -1) - (p * x.masked_fill(p == 0, 0)).sum(-1)

    loss, grad = loss_and_grad(reference.soft_cross_entropy, x, y, weights)
    torch_loss, torch_grad = loss_and_grad(independent, x, y, weights)
    want_loss, want_grad = loss_and_grad(independent, x.double(), y, weights.double())
    assert max_err(loss, want_loss) <= loss_budget(torch_loss, want_loss), seed_note(gen)
    assert (max_err(grad, want_grad)
            <= 2 * max_err(torch_grad, want_grad) + grad_noise(weights)), seed_note(gen)
    # and that gradient is the closed form (softmax(x) - softmax(y)) w: in float64 the two
    # differ by rounding only (~1e-16 of O(1) terms; 1e-12 cannot fail by chance)
    closed = (torch.softmax(x.double(), -1) - torch.softmax(y.double(), -1)) * weights[:, None]
    torch.testing.assert_close(closed, want_grad, rtol=0, atol=1e-12)


def test_reference_gives_no_gradient_to_targets(gen):
    x, y, _ = random_case(gen, 2, 9, torch.float32)
    y = y.clone().requires_grad_(True)
    for backend in ("torch", "triton", "cpu"):
        ops.soft_cross_entropy(x.clone().requires_grad_(True), y, backend=backend).sum().backward()
        assert y.grad is None, backend


# ---------------------------------------------------------------- Triton vs reference


def check_triton_case(x, y, weights, note):
    got_loss, got_grad = loss_and_grad(
        lambda a, b: ops.soft_cross_entropy(a, b, backend="triton"), x, y, weights)
    assert got_loss.dtype == torch.float32 and got_loss.shape == (x.shape[0],), note
    assert got_grad.dtype == x.dtype and got_grad.shape == x.shape, note
    want_loss, want_grad = fp64_truth(x, y, weights)
    torch_loss, torch_grad = torch_fp32(x, y, weights)
    # The loss is fp32 math on exactly upcast inputs in every dtype. Measured (interpreter, 100
    # seeds x every case of the Triton tests: 1100 per dtype): error / budget max 0.27 (loss),
    # 0.11 (fp32 gradient); the low-precision gradient's per-element bound is a rounding bound
    # (rounding to nearest, or the interpreter's truncation, of an fp32 value within fp32_budget
    # of the truth moves it less than HALF_ULP of itself), reached up to 0.95 (bf16 truncation).
    budget_loss = loss_budget(torch_loss, want_loss)
    assert max_err(got_loss, want_loss) <= budget_loss, \
        f"{note}: loss error {max_err(got_loss, want_loss):.3g} > {budget_loss:.3g}"
    noise = grad_noise(weights)
    fp32_budget = 2 * max_err(torch_grad, want_grad) + noise
    if x.dtype == torch.float32:
        assert max_err(got_grad, want_grad) <= fp32_budget, \
            f"{note}: grad error {max_err(got_grad, want_grad):.3g} > {fp32_budget:.3g}"
    else:
        _, lp_grad = low_precision_formula(x, y, weights)
        budget = 2 * max_err(lp_grad, want_grad) + noise
        # or, per element, rounding an fp32 gradient as good as torch's (within fp32_budget of
        # the truth) into x's dtype: half an ulp more, the best any output in that dtype can do
        # (the low-precision formula can be exact by luck)
        half_ulp = (want_grad.abs() + fp32_budget) * HALF_ULP[x.dtype] + fp32_budget
        error = (got_grad.double() - want_grad).abs()
        worst = float((error - half_ulp.clamp(min=budget)).max())
        assert worst <= 0, f"{note}: error {max_err(got_grad, want_grad)}, budget {budget}"
    assert not torch.isnan(got_grad).any(), note


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("vocab", [7, 1000, 4097])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_triton_matches_reference(gen, rows, vocab, dtype):
    x, y, weights = random_case(gen, rows, vocab, dtype)
    check_triton_case(x, y, weights, f"T={rows} V={vocab} {dtype} {seed_note(gen)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
def test_triton_extreme_logits(gen, dtype):
    scale = 1e4 if dtype != torch.float16 else 6e3  # fp16 tops out at 65504
    x, y, weights = random_case(gen, 5, 1000, dtype, scale=scale)
    check_triton_case(x, y, weights, f"|x| ~ {scale} {dtype} {seed_note(gen)}")
    # one logit far above the rest in x, another in y: the running maxima jump mid-row
    x, y, weights = random_case(gen, 3, 4097, dtype)
    x[:, 4000], y[:, 10] = scale, scale
    check_triton_case(x, y, weights, f"late max {dtype} {seed_note(gen)}")


def test_triton_draft_masked_under_a_live_target_is_infinite(gen):
    x, y, weights = random_case(gen, 3, 1000, torch.float32)
    x[1, -1] = float("-inf")  # y[:, -1] is finite: the draft gives a target token probability 0
    got_loss = ops.soft_cross_entropy(x, y, backend="triton")
    want_loss, _ = fp64_truth(x, y, torch.ones(3))
    assert math.isinf(got_loss[1]) and got_loss[1] > 0 and math.isinf(want_loss[1])
    # the finite rows and every gradient within the fp64-truth budgets (max_err: equal
    # infinities count as no error)
    check_triton_case(x, y, torch.ones(3), f"masked draft {seed_note(gen)}")


def test_triton_mixed_dtypes_and_empty(gen):
    x, _, weights = random_case(gen, 4, 300, torch.bfloat16)
    _, y, _ = random_case(gen, 4, 300, torch.float32)
    y[:, torch.isinf(x[0])] = float("-inf")
    check_triton_case(x, y, weights, f"bf16 x, fp32 y {seed_note(gen)}")
    empty = torch.zeros(0, 10, requires_grad=True)
    loss = ops.soft_cross_entropy(empty, torch.zeros(0, 10), backend="triton")
    loss.sum().backward()
    assert loss.shape == (0,) and empty.grad.shape == (0, 10)


def test_auto_is_the_reference_until_proven():
    assert ops.op_backends()["soft_cross_entropy"] == {"torch": "auto", "cpu": "auto",
                                                       "triton": "explicit only"}


# ---------------------------------------------------------------- cpu backend vs fp64


def check_cpu_case(x, y, weights, note):
    """On every instruction set this processor runs: the cpu kernel's error against fp64
    within twice torch's fp32 error plus noise (loss: 1e-6 of its scale; gradient: 1e-6 of the
    largest weight), and no NaN."""
    torch_loss, torch_grad = loss_and_grad(reference.soft_cross_entropy, x, y, weights)
    want_loss, want_grad = fp64_truth(x, y, weights)
    noise = grad_noise(weights)  # as for Triton
    for isa in each_cpu_isa():
        got_loss, got_grad = loss_and_grad(
            lambda a, b: ops.soft_cross_entropy(a, b, backend="cpu"), x, y, weights)
        where = f"{note} isa={isa}"
        assert got_loss.dtype == torch.float32 and got_grad.dtype == torch.float32, where
        assert max_err(got_loss, want_loss) <= loss_budget(torch_loss, want_loss), where
        assert max_err(got_grad, want_grad) <= 2 * max_err(torch_grad, want_grad) + noise, where
        assert not torch.isnan(got_grad).any() and not torch.isnan(got_loss).any(), where


@needs_cpu_backend
@pytest.mark.parametrize("vocab", [1, 7, 1000, 4097, 8192])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_cpu_matches_fp64(gen, rows, vocab):
    x, y, weights = random_case(gen, rows, vocab, torch.float32)
    check_cpu_case(x, y, weights, f"T={rows} V={vocab} {seed_note(gen)}")


@needs_cpu_backend
def test_cpu_extreme_logits_and_late_maxima(gen):
    x, y, weights = random_case(gen, 5, 1000, torch.float32, scale=1e4)
    check_cpu_case(x, y, weights, f"|x| ~ 1e4 {seed_note(gen)}")
    x, y, weights = random_case(gen, 3, 4097, torch.float32)
    x[:, 4000], y[:, 10] = 1e4, 1e4
    check_cpu_case(x, y, weights, f"late max {seed_note(gen)}")


@needs_cpu_backend
def test_cpu_draft_masked_under_a_live_target_is_infinite_and_bf16_targets_upcast(gen):
    x, y, weights = random_case(gen, 3, 1000, torch.float32)
    x[1, -1] = float("-inf")  # y[:, -1] is finite
    loss = ops.soft_cross_entropy(x, y, backend="cpu")
    assert math.isinf(loss[1]) and loss[1] > 0 and torch.isfinite(loss[[0, 2]]).all()
    x, y, weights = random_case(gen, 4, 300, torch.float32)
    y16 = y.to(torch.bfloat16)
    check_cpu_case(x, y16, weights, f"bf16 targets {seed_note(gen)}")
    empty = torch.zeros(0, 10, requires_grad=True)
    out = ops.soft_cross_entropy(empty, torch.zeros(0, 10), backend="cpu")
    out.sum().backward()
    assert out.shape == (0,) and empty.grad.shape == (0, 10)


@needs_cpu_backend
def test_cpu_takes_float32_drafts_only_and_auto_falls_back():
    x = torch.zeros(2, 5, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        ops.soft_cross_entropy(x, x, backend="cpu")
    assert ops.soft_cross_entropy(x, x).dtype == torch.float32  # auto: the reference


@needs_cpu_backend
def test_cpu_check_has_the_power_to_reject_a_sloppy_kernel(gen):
    """The budget is tight enough to catch a loss 1e-5 off in relative terms (e.g. sums in a
    lower precision): the same check fails for the kernel's loss scaled by 1 + 1e-5."""
    x, y, weights = random_case(gen, 17, 8192, torch.float32)
    want_loss, _ = fp64_truth(x, y, weights)
    torch_loss = reference.soft_cross_entropy(x, y)
    sloppy = ops.soft_cross_entropy(x, y, backend="cpu") * (1 + 1e-5)
    assert max_err(sloppy, want_loss) > loss_budget(torch_loss, want_loss)


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("backend", ["torch", "triton", "cpu"])
def test_bad_inputs_name_the_argument(backend):
    x, y = torch.zeros(2, 5), torch.zeros(2, 5)

    def call(a, b, **kwargs):
        return ops.soft_cross_entropy(a, b, backend=kwargs.get("b", backend))

    cases = [
        ((x[0], y), ValueError, "draft_logits"),
        ((x, y[:, :4]), ValueError, "target_logits"),
        ((x, y[0]), ValueError, "target_logits"),
        ((x.long(), y), ValueError, "draft_logits"),
        ((x, y.to(torch.int32)), ValueError, "target_logits"),
        ((x.numpy(), y), TypeError, "draft_logits"),
        ((x, [[0.0] * 5] * 2), TypeError, "target_logits"),
        ((torch.zeros(5, 2).t(), y), ValueError, "draft_logits"),
        ((x, torch.zeros(5, 2).t()), ValueError, "target_logits"),
        ((x, torch.zeros(2, 5, device="meta")), ValueError, "target_logits"),
        ((torch.zeros(2, 0), torch.zeros(2, 0)), ValueError, "draft_logits"),
        ((torch.full((2, 5), float("nan")), y), ValueError, "draft_logits"),
        ((x, torch.full((2, 5), float("-inf"))), ValueError, "target_logits"),
    ]
    for args, error, name in cases:
        with pytest.raises(error, match=name):
            call(*args)
    with pytest.raises(ValueError, match="backend"):
        ops.soft_cross_entropy(x, y, backend="cuda")


# ---------------------------------------------------------------- GPU


@needs_gpu
@pytest.mark.parametrize("backend", ["triton"])  # the verdict credits the backend a GPU case names
@pytest.mark.parametrize("vocab", [32000, 128256])
def test_gpu_bf16_large(gen, vocab, backend):
    rows = 2048
    x, y, weights = random_case(gen, rows, vocab, torch.bfloat16, device="cuda")
    check_triton_case(x, y, weights, f"GPU T={rows} V={vocab} {seed_note(gen)}")
    # memory: beyond the inputs, only grad_x ([T, V] in x's dtype), [T]-sized statistics and
    # reduction scratch. Measured on an H200 (2026-11-26): grad_x + 1.04 MiB at both vocabularies.
    # 4 MiB of slack still catches any [T, V] temporary (the smallest, a bool mask, is T V bytes:
    # 62.5 MiB here; the value checks used to make three of them)
    leaf = x.clone().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    (ops.soft_cross_entropy(leaf, y, backend=backend) * weights).sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= leaf.numel() * leaf.element_size() + (4 << 20), extra
