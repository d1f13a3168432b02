"""What a plain step that verifies one drafted token costs, as the speculative loop runs it:
calls that decode plainly from the start (the tree budget's fallback), one with no drafts, one
whose every step verifies a 1-token draft (a store drafting the last token again,
nearly always rejected; the drafts-lose pause turned off), ms per step over 128 tokens, medians
of ROUNDS alternating calls; then, under cProfile, the C++ decoder stack's and the lm_head's
time per call in each.

    python bench/results/2026-11-29_cpu-2core/loop_step_cost.py 7 > loop_step_cost.txt
"""
import cProfile
import pstats
import statistics
import sys

from eagle_kernels.runtime import lookup
from eagle_kernels.runtime.api import from_pretrained
from eagle_kernels.runtime.reply_store import ReplyStore


class RepeatLast(ReplyStore):
    """A reply store that drafts the last token again at every step."""

    def draft(self, history):
        return [int(history[-1])]


def main() -> int:
    rounds = int(sys.argv[1])
    generator = from_pretrained()
    engine, budget = generator.engine, generator.budget
    start_call = budget.start_call
    budget.start_call = lambda batch=None: (start_call(batch), False)[1]  # plain from the start
    lookup.ContextDrafts._time = lambda self, *args: None  # never pause the drafts
    ids = generator.encode("Write a short story about a robot who learns to paint.")
    engine.prompt_lookup = False  # context drafts would come and go with the reply

    def run(drafting: bool):
        engine.prompt_lookup = drafting
        engine.reply_store = RepeatLast([], engine.target.vocab_size) if drafting else None
        return engine.generate([ids], 128)

    per_step = {False: [], True: []}
    for r in range(rounds):
        for drafting in ((False, True) if r % 2 == 0 else (True, False)):
            stats = run(drafting).stats
            per_step[drafting].append(stats.decode_seconds / stats.cycles)
    plain, drafted = (statistics.median(per_step[k]) for k in (False, True))
    print(f"plain step {plain * 1e3:.2f} ms, step verifying a 1-token draft "
          f"{drafted * 1e3:.2f} ms = {drafted / plain:.2f} plain steps (medians of {rounds})")
    for drafting in (False, True):
        profile = cProfile.Profile()
        profile.enable()
        run(drafting)
        profile.disable()
        for (_, _, name), row in pstats.Stats(profile).stats.items():
            if name in ("<built-in method eagle_kernels._cpu.decoder_stack>",
                        "<built-in method eagle_kernels._cpu.linear>"):
                calls, _, total = row[1], row[2], row[3]
                print(f"{'drafted' if drafting else 'plain':7s} {name.split('.')[-1][:-1]:13s} "
                      f"{total / calls * 1e3:.2f} ms a call ({calls} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
