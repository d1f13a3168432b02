"""Training losses: fused soft cross-entropy over the draft vocabulary (EAGLE-3).

Public op :func:`soft_cross_entropy` with the contract of
:func:`eagle_kernels.ops.reference.soft_cross_entropy`: per row t,
``loss[t] = -sum_v softmax(y[t])_v * log_softmax(x[t])_v`` in fp32, gradient
``(softmax(x[t]) - softmax(y[t])) * grad_loss[t]`` to x, none to y. Backends: ``torch``
(reference, autograd), ``triton`` (below; explicit only until proven on a GPU) and ``cpu``
(csrc/cpu/loss.h: the Triton kernels' math over fp32 rows, OpenMP; auto on CPU).

Triton forward, one program per row, reading x and y once in blocks. With running maxima mx, my
it keeps ``sx = sum exp(x - mx)``, ``sy = sum exp(y - my)`` and
``sxy = sum exp(y - my) * (x - mx)`` (terms with exp(y - my) == 0 skipped, so a token masked to
-inf in both is 0, not NaN). Then ``loss = log(sx) - sxy / sy``: since
``log_softmax(x) = x - mx - log(sx)`` and the target probabilities sum to 1. Keeping x relative
to the running max (not x itself) matters for large logits: with |x| ~ 1e4, ``lse(x) - E_p[x]``
would cancel two numbers of size 1e4 in fp32 (error ~1e-3); ``x - mx`` is what the reference's
fp32 log_softmax rounds too. When mx grows by d, every stored ``x - mx`` shrinks by d, so
``sxy -= sy * d``; when my grows, sy and sxy scale by ``exp(my_old - my_new)`` like sx.

Only per-row statistics are saved: a [4, T] fp32 tensor of mx, log(sx), my, log(sy) (plus the
inputs autograd keeps anyway). The backward kernel recomputes
``exp((x - mx) - log(sx)) - exp((y - my) - log(sy))`` block by block and writes grad_x in x's
dtype. The max and the log-sum stay separate for the same reason as above: ``mx + log(sx)``
rounded to fp32 at |x| ~ 1e4 is off by ~5e-4, a relative error of the probability itself.
No [T, V] probability tensor is ever materialised.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from . import reference
from ._backend import cpu_extension, cpu_float32_only, register, resolve
from ._triton import tl, triton
from ._validate import FLOAT_DTYPES, check_logits, check_same_device, check_tensor

# Initial running max: finite, so ``exp(m_old - m_new)`` and ``x - m`` never see -inf - -inf
# (NaN) before the first finite entry; any real logit (|x| < 3e38) exceeds it.
_NEG_BIG = -1.0e30
_MAX_BLOCK = 4096  # fp32 x and y blocks of 4096 = 32 + 32 registers per thread at 4 warps


def soft_cross_entropy(draft_logits, target_logits, backend: str = "auto") -> torch.Tensor:
    """Soft cross-entropy of the draft distribution against the target's, per row.

    Parameters
    ----------
    draft_logits : [T, V] float16 / bfloat16 / float32, contiguous (-inf allowed, not NaN or
        +inf); the gradient flows to it, in its dtype.
    target_logits : [T, V] float16 / bfloat16 / float32, contiguous, same device (-inf allowed);
        treated as detached.
    backend : "auto", "triton" or "torch".

    Returns
    -------
    loss : [T] float32, ``-sum_v softmax(y[t])_v * log_softmax(x[t])_v``; differentiable in
    ``draft_logits``.
    """
    check_tensor("draft_logits", draft_logits, FLOAT_DTYPES, (None, None))
    rows, vocab = draft_logits.shape
    check_tensor("target_logits", target_logits, FLOAT_DTYPES, (None, None))
    if tuple(target_logits.shape) != (rows, vocab):
        raise ValueError(f"target_logits: expected shape {[rows, vocab]} (like draft_logits), "
                         f"got {list(target_logits.shape)}")
    if vocab == 0:
        raise ValueError("draft_logits: expected a non-empty vocabulary dimension, got V = 0")
    device = check_same_device(draft_logits=draft_logits, target_logits=target_logits)
    check_logits("draft_logits", draft_logits.detach())
    check_logits("target_logits", target_logits.detach())
    _, implementation = resolve("soft_cross_entropy", backend, device, dtype=draft_logits.dtype)
    return implementation(draft_logits, target_logits)


@triton.jit
def _soft_ce_forward_kernel(x_ptr, y_ptr, loss_ptr, stats_ptr, rows, vocab,
                            NEG_BIG: tl.constexpr, BLOCK: tl.constexpr):
    """Program t: one pass over row t of x and y; writes loss[t] and stats[:, t]."""
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * vocab
    y_row = y_ptr + row * vocab
    cols = tl.arange(0, BLOCK)
    # scalars built from a reduction so their type stays fp32 across loop iterations
    zero = tl.sum(tl.zeros([BLOCK], dtype=tl.float32), axis=0)
    mx = zero + NEG_BIG
    my = zero + NEG_BIG
    sx = zero
    sy = zero
    sxy = zero
    for start in range(0, vocab, BLOCK):
        mask = start + cols < vocab
        x = tl.load(x_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.load(y_row + start + cols, mask=mask, other=float("-inf")).to(tl.float32)
        new_mx = tl.maximum(mx, tl.max(x, axis=0))
        new_my = tl.maximum(my, tl.max(y, axis=0))
        alpha_y = tl.exp(my - new_my)
        # alpha_y can underflow to 0 while sxy is -inf (x = -inf under a finite target): keep
        # 0 instead of -inf * 0 = NaN
        sxy = tl.where(alpha_y > 0, sxy * alpha_y, 0.0)
        sy = sy * alpha_y
        sxy = sxy - sy * (new_mx - mx)
        sx = sx * tl.exp(mx - new_mx) + tl.sum(tl.exp(x - new_mx), axis=0)
        w = tl.exp(y - new_my)
        sy = sy + tl.sum(w, axis=0)
        # select before multiplying: 0 * -inf (a token masked in both) would be NaN
        sxy = sxy + tl.sum(w * tl.where(w > 0, x - new_mx, 0.0), axis=0)
        mx = new_mx
        my = new_my
    tl.store(loss_ptr + row, tl.log(sx) - sxy / sy)
    tl.store(stats_ptr + row, mx)
    tl.store(stats_ptr + rows + row, tl.log(sx))
    tl.store(stats_ptr + 2 * rows + row, my)
    tl.store(stats_ptr + 3 * rows + row, tl.log(sy))


@triton.jit
def _soft_ce_backward_kernel(x_ptr, y_ptr, stats_ptr, grad_loss_ptr, grad_x_ptr, rows, vocab,
                             BLOCK: tl.constexpr):
    """Program (t, block): grad_x[t, block] = (softmax(x) - softmax(y)) * grad_loss[t]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < vocab
    x = tl.load(x_ptr + row * vocab + cols, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.load(y_ptr + row * vocab + cols, mask=mask, other=float("-inf")).to(tl.float32)
    mx = tl.load(stats_ptr + row)
    log_sx = tl.load(stats_ptr + rows + row)
    my = tl.load(stats_ptr + 2 * rows + row)
    log_sy = tl.load(stats_ptr + 3 * rows + row)
    grad = tl.load(grad_loss_ptr + row)
    # exp(-inf) = 0: masked tokens get a zero gradient
    delta = (tl.exp((x - mx) - log_sx) - tl.exp((y - my) - log_sy)) * grad
    tl.store(grad_x_ptr + row * vocab + cols, delta.to(grad_x_ptr.dtype.element_ty), mask=mask)


def _block(vocab: int) -> int:
    return min(_MAX_BLOCK, triton.next_power_of_2(max(vocab, 1)))


def _triton_forward(x, y, loss, stats):
    rows, vocab = x.shape
    block = _block(vocab)
    _soft_ce_forward_kernel[(rows,)](x, y, loss, stats, rows, vocab, NEG_BIG=_NEG_BIG,
                                     BLOCK=block, num_warps=8 if block >= 2048 else 4)


def _triton_backward(x, y, stats, grad_loss, grad_x):
    rows, vocab = x.shape
    block = _block(vocab)
    _soft_ce_backward_kernel[(rows, triton.cdiv(vocab, block))](
        x, y, stats, grad_loss, grad_x, rows, vocab, BLOCK=block,
        num_warps=8 if block >= 2048 else 4)


def _cpu_forward(x, y, loss, stats):
    cpu_extension().soft_ce_forward(x.data_ptr(), y.data_ptr(), loss.data_ptr(),
                                    stats.data_ptr(), *x.shape)


def _cpu_backward(x, y, stats, grad_loss, grad_x):
    cpu_extension().soft_ce_backward(x.data_ptr(), y.data_ptr(), stats.data_ptr(),
                                     grad_loss.data_ptr(), grad_x.data_ptr(), *x.shape)


class _Kernels(NamedTuple):
    """One backend's launchers: ``forward(x, y, loss, stats)`` fills loss [T] and stats
    [4, T]; ``backward(x, y, stats, grad_loss, grad_x)`` fills grad_x. Both see T > 0."""

    forward: Callable
    backward: Callable


_TRITON = _Kernels(_triton_forward, _triton_backward)
_CPU = _Kernels(_cpu_forward, _cpu_backward)  # csrc/cpu/loss.h: the same math, OpenMP over rows


class _SoftCrossEntropy(torch.autograd.Function):
    """Forward / backward through one backend's kernels; saves x, y (held by the graph anyway)
    and [4, T] fp32 statistics."""

    @staticmethod
    def forward(ctx, draft_logits, target_logits, kernels: _Kernels):
        rows = draft_logits.shape[0]
        loss = torch.empty(rows, dtype=torch.float32, device=draft_logits.device)
        stats = torch.empty(4, rows, dtype=torch.float32, device=draft_logits.device)
        if rows:
            kernels.forward(draft_logits, target_logits, loss, stats)
        ctx.kernels = kernels
        ctx.save_for_backward(draft_logits, target_logits, stats)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        if not ctx.needs_input_grad[0]:
            return None, None, None
        draft_logits, target_logits, stats = ctx.saved_tensors
        grad_loss = grad_loss.to(torch.float32).contiguous()
        grad_x = torch.empty_like(draft_logits)
        if draft_logits.shape[0]:
            ctx.kernels.backward(draft_logits, target_logits, stats, grad_loss, grad_x)
        return grad_x, None, None


def _soft_cross_entropy_triton(draft_logits, target_logits) -> torch.Tensor:
    # targets carry no gradient by contract: detach so autograd never asks for one
    return _SoftCrossEntropy.apply(draft_logits, target_logits.detach(), _TRITON)


def _soft_cross_entropy_cpu(draft_logits, target_logits) -> torch.Tensor:
    # fp32 kernels: y of another float dtype is upcast exactly
    return _SoftCrossEntropy.apply(draft_logits, target_logits.detach().float().contiguous(),
                                   _CPU)


register("soft_cross_entropy", "torch", reference.soft_cross_entropy)
register("soft_cross_entropy", "cpu", _soft_cross_entropy_cpu, supports=cpu_float32_only)
register("soft_cross_entropy", "triton", _soft_cross_entropy_triton, auto=False)
