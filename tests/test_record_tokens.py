"""The decode loop's bookkeeping in C++ (csrc/cpu/acceptance.h record_tokens / greedy_step)
against its torch version (calls.py _Call.record): same output buffer, lengths, stop flags
and recorded counts, exactly, on random batches that hit every rule (finished rows, EOS inside
and outside the offered tokens, spent budgets); and whole generate calls with either version
give the same tokens and stop reasons. The comparisons are exact; the one chance event is the
power check below (every rule exercised), whose false-failure probability is stated there."""

from __future__ import annotations

import pytest
import torch

from cpu_support import needs_cpu_backend
from eagle_kernels.runtime import Engine, SamplingConfig, TreeConfig
from eagle_kernels.runtime import calls
from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head
from eagle_kernels.runtime.generation import GenerationStats, _Call
from runtime_helpers import tiny_target

pytestmark = needs_cpu_backend

VOCAB = 50
CASES = 100  # random batches of test_record_tokens_equals_the_torch_version (see its power check)


def _calls(budgets, width, eos):
    """A C++ call and a torch call with the same state."""
    native, torch_call = (_Call(budgets, width, eos, SamplingConfig(), TreeConfig(),
                                max(budgets), GenerationStats("autoregressive"),
                                torch.device("cpu")) for _ in range(2))
    assert native.native is not None
    torch_call.native = None
    return native, torch_call


def _same_state(a: _Call, b: _Call):
    for name in ("out", "generated", "done"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_record_tokens_equals_the_torch_version(gen):
    print(f"seed note: {gen.initial_seed()}")
    rules = dict(finished=0, eos_cut=0, budget_cut=0, eos_past_count=0)
    for _ in range(CASES):
        batch = int(torch.randint(1, 6, (1,), generator=gen))
        width = int(torch.randint(1, 9, (1,), generator=gen))
        budgets = torch.randint(1, 20, (batch,), generator=gen).tolist()
        eos = torch.randint(0, VOCAB, (int(torch.randint(0, 3, (1,), generator=gen)),),
                            generator=gen).tolist()
        native, reference = _calls(budgets, width, eos)
        for _ in range(8):
            tokens = torch.randint(0, VOCAB, (batch, width), generator=gen)
            counts = torch.randint(0, width + 1, (batch,), generator=gen)
            before_done = reference.done.clone()
            left = reference.budgets - reference.generated
            got = native.record(tokens, counts)
            want = reference.record(tokens, counts)
            assert torch.equal(got, want)
            _same_state(native, reference)
            is_eos = torch.isin(tokens, torch.tensor(eos or [-1]))
            offered = torch.arange(width) < counts.unsqueeze(1)
            rules["finished"] += int(before_done.sum())
            rules["eos_cut"] += int(((is_eos & offered).any(1) & ~before_done).sum())
            rules["eos_past_count"] += int(((is_eos & ~offered).any(1) & ~before_done).sum())
            rules["budget_cut"] += int(((counts > left) & ~before_done).sum())
    # power: every rule was exercised, so a version that ignored one would have differed on that
    # row. A case exercises none of a rule with probability <= 0.72 (measured over 20000 cases:
    # 0.706 at most, EOS past the offered count), so all CASES miss one of the 4 rules with
    # probability <= 4 * 0.72**100 = 2e-14 per run. (The check was "> 10 each" over 60 cases:
    # 1 of 300 seeds failed it, with EOS past the count 6 times.)
    assert all(count >= 1 for count in rules.values()), rules


def test_greedy_step_equals_argmax_and_record(gen):
    print(f"seed note: {gen.initial_seed()}")
    for _ in range(30):
        batch = int(torch.randint(1, 5, (1,), generator=gen))
        budgets = torch.randint(1, 6, (batch,), generator=gen).tolist()
        native, reference = _calls(budgets, 1, [3, 7])
        lens_native = torch.randint(0, 100, (batch,), generator=gen, dtype=torch.int32)
        lens_reference = lens_native.clone()
        for _ in range(6):
            logits = torch.randn(batch, VOCAB, generator=gen)
            logits[:, 5] = logits.max(1).values  # ties: the first maximum wins
            if bool(torch.rand(1, generator=gen) < 0.2):
                logits[0, 9] = float("nan")  # a NaN counts as the maximum, as in torch.argmax
            active = (~reference.done).to(torch.int64)
            root, counts, got_active = native.greedy_step(logits, lens_native)
            want_root = logits.argmax(-1)
            lens_reference += active.to(torch.int32)
            want_counts = reference.record(want_root.unsqueeze(1), torch.ones(batch,
                                                                              dtype=torch.int64))
            assert torch.equal(root, want_root)
            assert torch.equal(counts, want_counts)
            assert torch.equal(got_active, active)
            assert torch.equal(lens_native, lens_reference)
            _same_state(native, reference)


@pytest.mark.parametrize("speculative", [False, True])
def test_generate_with_either_bookkeeping_is_the_same(gen, monkeypatch, speculative):
    target = tiny_target()
    prompts = [torch.randint(0, 299, (n,), generator=gen).tolist() for n in (5, 12, 2)]
    tree = TreeConfig(top_k=4, depth=3, total_tokens=16)
    plain = Engine(target).generate(prompts, 30, speculative=False)
    eos = [plain.tokens[0][9]]  # the first sequence stops early, at its 10th token or before
    runs = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(calls, "cpu_bookkeeping", lambda device: None)
        head = new_draft_head(EAGLE3, target) if speculative else None
        out = Engine(target, head, tree).generate(prompts, 30, eos_token_ids=eos,
                                                  speculative=speculative)
        runs.append((out.tokens, out.stop_reasons))
    assert runs[0] == runs[1]
    assert runs[0][1][0] == "eos" and len(runs[0][0][0]) <= 10


def test_record_tokens_stays_inside_its_buffers_whatever_the_counts():
    """Counts past the width, negative counts, lengths past the buffer: clamped, never a write
    outside ``out`` (a guard after it stays untouched; ASan runs this file too)."""
    from eagle_kernels.ops._backend import cpu_extension

    batch, width, out_width, guard = 3, 4, 6, 16
    buffer = torch.full((batch * out_width + guard,), -7, dtype=torch.int64)
    generated = torch.tensor([0, 5, 9], dtype=torch.int64)  # row 2 already past the buffer
    done = torch.zeros(batch, dtype=torch.bool)
    budgets = torch.tensor([100, 100, 100], dtype=torch.int64)
    eos = torch.tensor([-1], dtype=torch.int64)
    tokens = torch.arange(batch * width, dtype=torch.int64).view(batch, width)
    recorded = torch.empty(batch, dtype=torch.int64)
    state = [t.data_ptr() for t in (generated, done, buffer, budgets, eos)]
    for counts in ([99, 99, 99], [-5, 2, 1 << 40]):
        counts = torch.tensor(counts, dtype=torch.int64)
        cpu_extension().record_tokens(tokens.data_ptr(), counts.data_ptr(), recorded.data_ptr(),
                                      state, batch, width, out_width, 1)
        assert bool((buffer[batch * out_width:] == -7).all())
        assert bool((recorded >= 0).all()) and bool((recorded <= width).all())
