"""Training forward passes for draft heads: EAGLE-3 training-time test and the EAGLE-1 loss.

Data convention (the runtime's, :mod:`.drafting`): the head's entry at position p pairs the
target's feature at p with the token at p + 1 and predicts token p + 2, whose distribution is
the target's logits at p + 1.

EAGLE-3 training-time test (TTT), ``steps`` = K unrolled drafting steps over one sequence:

* step 0 at position p: hidden = fc(target features at p), token = x[p + 1];
* step i > 0 at position p: hidden = the head's own step i - 1 output at p, token = x[p + 1 + i];
  it stands for a depth-i draft node, so its RoPE position is p + i (where drafting puts it);
* the query of step i at p sees the step-0 keys at positions <= p (the real prefix) and the key
  of each step 1..i at the same position p (its own drafted ancestors): what the runtime's own
  drafting attends to (``test_ttt_forward_equals_the_drafting_path``).
  :func:`ttt_dense_mask` spells it out over all (step, position) keys; :func:`ttt_attention`
  computes it without the dense mask (causal scores against step 0 plus one diagonal score per
  later step). It is not the official mask at steps >= 1: SafeAILab/EAGLE's
  ``eagle/traineagle3/cnets.py`` (at 9666a81) also hides, at step i, the step-0 keys at
  positions p - i + 1 .. p (it masks one more diagonal of the step-0 mask after each step),
  which drafting does not do; SafeAILab/EAGLE issue #247 questions that mask;
* step i's target is the target's distribution of token p + 2 + i restricted to the draft
  vocabulary (softmax over the target's logits of the draft tokens); the loss is
  ``sum_i decay^i * mean_p soft_CE`` over positions whose token p + 2 + i is a trained
  (assistant) token and whose target argmax lies in the draft vocabulary.

EAGLE-1: the head reads (target hidden + uniform noise at p, token p + 1) and regresses the
target's hidden at p + 1 (SmoothL1) plus 0.1 x soft cross-entropy of the target's logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops
from .draft_heads import Eagle1Head, Eagle3Head
from .drafting import causal_tree_mask
from .layers import apply_rope
from .model import TargetModel

TTT_STEPS = 7
TTT_DECAY = 0.8
EAGLE1_NOISE = 0.2   # width of the uniform input noise (official EAGLE-1: U(-0.1, 0.1))
EAGLE1_CE_WEIGHT = 0.1


# ------------------------------------------------------------------------------ target side


@torch.no_grad()
def target_pass(target: TargetModel, input_ids: torch.Tensor, feature_layers=()):
    """One causal prefill of ``input_ids`` [B, L]: (final-normed hidden [B, L, H], features)."""
    batch, length = input_ids.shape
    cache = target.allocate_cache(batch, length)
    positions = torch.arange(length, device=input_ids.device).expand(batch, -1)
    return target(input_ids, positions, cache, causal_tree_mask(batch, length, input_ids.device),
                  tuple(feature_layers))


def draft_vocab_ids(head: Eagle3Head) -> torch.Tensor:
    """Target id of each draft id: ``i + d2t[i]`` ([Vd] int64)."""
    ids = torch.arange(head.lm_head.out_features, device=head.d2t.device)
    return ids + head.d2t if head.d2t_offsets() is not None else ids


@torch.no_grad()
def target_draft_logits(target: TargetModel, hidden: torch.Tensor, draft_ids: torch.Tensor,
                        chunk: int = 2048):
    """Target logits over the draft vocabulary [..., Vd] and the full-vocabulary argmax [...].

    The full [T, V] logits exist one chunk of rows at a time (only the argmax is kept).
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    restricted, argmax = [], []
    for rows in flat.split(chunk):
        logits = target.logits(rows)
        argmax.append(logits.argmax(-1))
        restricted.append(logits[:, draft_ids])
    shape = hidden.shape[:-1]
    return torch.cat(restricted).view(*shape, -1), torch.cat(argmax).view(shape)


# ------------------------------------------------------------------------------ TTT attention


def ttt_dense_mask(length: int, steps: int, device=None) -> torch.Tensor:
    """Explicit TTT visibility: [steps * L, steps * L] bool, rows/cols ordered (step, position).

    Row (i, p) sees column (0, q) for q <= p and column (j, p) for 1 <= j <= i.
    """
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool, device=device))
    eye = torch.eye(length, dtype=torch.bool, device=device)
    mask = torch.zeros(steps * length, steps * length, dtype=torch.bool, device=device)
    for i in range(steps):
        rows = slice(i * length, (i + 1) * length)
        mask[rows, :length] = causal
        for j in range(1, i + 1):
            mask[rows, j * length:(j + 1) * length] = eye
    return mask


def ttt_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]):
    """Attention of step ``len(keys) - 1`` under the TTT mask, without a dense mask.

    q : [B, Hq, L, D]; keys / values : one [B, Hq, L, D] per step so far (step 0 first, GQA
    already expanded). Returns [B, Hq, L, D]. Scores against step 0 are causal; each later
    step contributes one score per position (its same-position key), all in one softmax.
    """
    batch, heads, length, dim = q.shape
    # The [L, L] scores are the big tensor (75 MB per step at B 8, L 512): every elementwise pass
    # over them costs more than the GEMMs around them. So the scale goes into q, and the causal
    # mask is an additive bias the GEMM itself adds (baddbmm), no separate scale or mask pass.
    q = q * (1.0 / math.sqrt(dim))
    scores = torch.baddbmm(_causal_bias(length, q.dtype, q.device), q.reshape(-1, length, dim),
                           keys[0].reshape(-1, length, dim).transpose(1, 2))
    scores = scores.view(batch, heads, length, length)
    diagonal = [(q * k).sum(-1, keepdim=True) for k in keys[1:]]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1,
                          dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    out = probs[..., :length] @ values[0]
    for j, v in enumerate(values[1:]):
        out = out + probs[..., length + j:length + j + 1] * v
    return out


def _causal_bias(length: int, dtype, device) -> torch.Tensor:
    """[1, L, L]: 0 where key <= query, -inf above the diagonal."""
    bias = torch.full((length, length), float("-inf"), dtype=dtype, device=device)
    return bias.triu_(1).unsqueeze(0)


def _project_qkv(attn, x, rope):
    """q [B, Hq, L, D] and GQA-expanded k, v of ``attn`` for input ``x`` [B, L, in]."""
    batch, length, _ = x.shape
    q = attn.q_proj(x).view(batch, length, attn.num_heads, attn.head_dim)
    k = attn.k_proj(x).view(batch, length, attn.kv_heads, attn.head_dim)
    v = attn.v_proj(x).view(batch, length, attn.kv_heads, attn.head_dim)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    group = attn.num_heads // attn.kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _merge_heads(attn, out):
    batch, _, length, _ = out.shape
    return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


# ------------------------------------------------------------------------------ EAGLE-3 TTT


@dataclass
class TTTResult:
    loss: torch.Tensor            # scalar: sum_i decay^i * loss_i
    step_losses: list[float]      # per step, mean soft CE over its valid positions
    step_accuracy: list[float]    # per step, draft argmax == target argmax (valid positions)
    step_counts: list[int]        # valid positions per step
    hidden: list[torch.Tensor]    # per step, the head's output [B, L, H] (keep_hidden only)


def shift_left(x: torch.Tensor, by: int, fill=0) -> torch.Tensor:
    """``x[:, p + by]`` at position p along dim 1, ``fill`` past the end."""
    if by == 0:
        return x
    pad = torch.full_like(x[:, :by], fill)
    return torch.cat([x[:, by:], pad], dim=1)


def eagle3_ttt_loss(head: Eagle3Head, features: torch.Tensor, input_ids: torch.Tensor,
                    target_logits: torch.Tensor, target_in_draft: torch.Tensor,
                    loss_mask: torch.Tensor, steps: int = TTT_STEPS, decay: float = TTT_DECAY,
                    loss_backend: str = "auto", keep_hidden: bool = False,
                    target_temperature: float = 1.0) -> TTTResult:
    """EAGLE-3 training-time-test loss of ``head`` on one batch.

    Parameters
    ----------
    features : [B, L, 3H] the target's inputs of layers 2, N//2, N-3 (no grad).
    input_ids : [B, L] int64 tokens.
    target_logits : [B, L, Vd] the target's logits at each position over the draft vocabulary.
    target_in_draft : [B, L] bool, the target's argmax at each position is a draft token.
    loss_mask : [B, L] bool, token p is trained on (an assistant token of the conversation).
    steps, decay : unrolled drafting steps K and the weight decay^i of step i's loss.
    target_temperature : the soft labels are softmax(target_logits / T); 1 is EAGLE-3's
        (the target's own distribution), below 1 sharpens them towards its argmax, the token
        greedy verification accepts. The accuracy metric is the argmax's either way.
    keep_hidden : also return each step's output (tests compare it with the drafting path).
    """
    batch, length = input_ids.shape
    layer = head.midlayer
    attn = layer.self_attn
    hidden = head.fc(features)
    base_positions = torch.arange(length, device=input_ids.device).expand(batch, -1)
    flat_targets = target_logits.reshape(batch * length, -1)
    with torch.no_grad():  # the target's draft-vocabulary argmax, once (accuracy metric)
        flat_target_argmax = flat_targets.argmax(-1)
    keys, values = [], []
    total = hidden.new_zeros((), dtype=torch.float32)
    result = TTTResult(total, [], [], [], [])
    for step in range(steps):
        rope = head.rotary_emb(base_positions + step, hidden.dtype)
        embedded = head.embed_tokens(shift_left(input_ids, 1 + step)).to(hidden.dtype)
        both = torch.cat([layer.input_layernorm(embedded), layer.hidden_norm(hidden)], dim=-1)
        q, k, v = _project_qkv(attn, both, rope)
        keys.append(k)
        values.append(v)
        h = hidden + _merge_heads(attn, ttt_attention(q, keys, values))
        hidden = h + layer.mlp(layer.post_attention_layernorm(h))
        if keep_hidden:
            result.hidden.append(hidden.detach())
        # Positions p whose predicted token p + 2 + step is trained on and whose target argmax
        # (at p + 1 + step) is a draft token; logits only for those rows.
        valid = shift_left(loss_mask, 2 + step, False) & shift_left(target_in_draft, 1 + step, False)
        rows = valid.reshape(-1).nonzero().squeeze(1)
        result.step_counts.append(int(rows.numel()))
        if not rows.numel():
            result.step_losses.append(float("nan"))
            result.step_accuracy.append(float("nan"))
            continue
        logits = head.lm_head(head.norm(hidden.reshape(batch * length, -1)[rows])).float()
        target_rows = rows + 1 + step  # row p + 1 + step of the same sequence
        target = flat_targets[target_rows].float()
        if target_temperature != 1.0:
            target = target / target_temperature
        step_loss = ops.soft_cross_entropy(logits.contiguous(), target.contiguous(),
                                           backend=loss_backend).mean()
        total = total + decay ** step * step_loss
        with torch.no_grad():
            result.step_losses.append(float(step_loss.detach()))
            agree = logits.argmax(-1) == flat_target_argmax[target_rows]
            result.step_accuracy.append(float(agree.float().mean()))
    result.loss = total
    return result


# ------------------------------------------------------------------------------ EAGLE-1


def eagle1_loss(head: Eagle1Head, target: TargetModel, target_hidden: torch.Tensor,
                input_ids: torch.Tensor, loss_mask: torch.Tensor, noise: float = EAGLE1_NOISE,
                ce_weight: float = EAGLE1_CE_WEIGHT, generator: torch.Generator | None = None):
    """EAGLE-1 loss: SmoothL1(predicted feature, target feature) + ce_weight * soft CE.

    target_hidden : [B, L, H] the target's final-normed hidden states (no grad).
    Returns (loss, regression loss, cross-entropy) as scalars.
    """
    batch, length = input_ids.shape
    noisy = target_hidden + (torch.rand(target_hidden.shape, generator=generator,
                                        device=target_hidden.device,
                                        dtype=target_hidden.dtype) - 0.5) * noise
    layer = head.layers[0]
    x = head.fc(torch.cat([head.embed_tokens(shift_left(input_ids, 1)).to(noisy.dtype), noisy], -1))
    positions = torch.arange(length, device=input_ids.device).expand(batch, -1)
    q, k, v = _project_qkv(layer.self_attn, x, head.rotary_emb(positions, x.dtype))
    h = x + _merge_heads(layer.self_attn, ttt_attention(q, [k], [v]))
    predicted = h + layer.mlp(layer.post_attention_layernorm(h))
    wanted = shift_left(target_hidden, 1)
    valid = shift_left(loss_mask, 2, False)
    if not bool(valid.any()):
        zero = predicted.sum() * 0.0
        return zero, zero, zero
    regression = F.smooth_l1_loss(predicted[valid], wanted[valid])
    with torch.no_grad():
        target_logits = target.logits(wanted[valid])
    cross_entropy = ops.soft_cross_entropy(target.logits(predicted[valid]).contiguous(),
                                           target_logits.contiguous()).mean()
    return regression + ce_weight * cross_entropy, regression, cross_entropy
