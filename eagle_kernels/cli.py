"""Command line: ``python -m eagle_kernels generate ...`` (the README's main command).

    python -m eagle_kernels generate --prompt "Why is the sky blue?" --compare

Generates with EAGLE speculative decoding (default target SmolLM2-135M-Instruct and its head),
prints the reply and the statistics; ``--compare`` also runs the autoregressive baseline of the
same runtime on the same prompts, reports the speedup and, for greedy decoding, checks that the
two outputs are identical token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from .ops._validate import check_device, check_model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_PROMPT = "What is speculative decoding, and why does it make language models faster?"
# --compare: rounds of one speculative and one autoregressive call, in alternating order, whose
# median speedup is reported (one pair of sub-second calls moved 0.92-1.09x on this project's
# 2-core VM with the two modes running the same plain steps: its speed drifts between calls)
COMPARE_ROUNDS = 3


def _tree(text: str):
    from .runtime.drafting import TreeConfig

    if text == "auto":
        return "auto"
    try:
        top_k, depth, total = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or TOP_K,DEPTH,TOTAL_TOKENS, got {text!r}")
    try:
        return TreeConfig(top_k=top_k, depth=depth, total_tokens=total)
    except (TypeError, ValueError) as error:
        raise argparse.ArgumentTypeError(str(error))


class UserError(Exception):
    """A mistake in the command line or its files: reported as one ``error:`` line, status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors as one line (``error: ...``, status 2), like ours."""

    def error(self, message: str):
        _fail(f"{message} (see {self.prog} --help)")


def _fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    from .runtime.api import DRAFT_WEIGHTS

    root = _Parser(prog="python -m eagle_kernels", description=__doc__.split("\n")[0])
    # Subparsers are created with the root's class, so they report errors the same way.
    commands = root.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate replies with EAGLE speculative decoding")
    gen.add_argument("--prompt", action="append", help="a user message (repeat for a batch)")
    gen.add_argument("--target", help="HF checkpoint dir or .gguf (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--draft", help="EAGLE head dir, random-eagle3, random-eagle1 or none "
                                     "(default: the bundled head of the default model)")
    gen.add_argument("--draft-weights", choices=DRAFT_WEIGHTS, default="auto",
                     help="the head's weights: q8_0 (8-bit, what 'auto' picks on the cpu) or "
                          "exact; the output is the target's either way")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--tree", type=_tree, default="auto",
                     help="'auto' (measure this device, default) or TOP_K,DEPTH,TOTAL_TOKENS")
    gen.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    gen.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    gen.add_argument("--no-chat", action="store_true", help="raw text, no chat template")
    gen.add_argument("--no-lookup", action="store_true",
                     help="no context (or reply-store) drafts in the steps the tree budget "
                          "decodes plainly")
    gen.add_argument("--compare", action="store_true",
                     help="also run the autoregressive baseline and report the speedup")
    gen.add_argument("--stream", action="store_true", help="print the reply as it is generated")
    gen.add_argument("--json", action="store_true", help="print the statistics as JSON")
    gen.add_argument("--activations", choices=["fp32", "int16", "int8"], default="fp32",
                     help="CPU: round activations to int16 / int8 in the GGUF target's 4 / 8-bit "
                          "GEMMs (faster; int8 as llama.cpp; still lossless against our own AR "
                          "decoding in that mode, no longer fp32 transformers' arithmetic)")
    _train_parser(commands)
    return root


def _train_parser(commands) -> None:
    from .train import TrainConfig

    defaults = TrainConfig(out="")
    train = commands.add_parser("train", help="train an EAGLE-3 (or EAGLE-1) draft head")
    train.add_argument("--out", required=True, help="output dir: head, trainer state, log")
    train.add_argument("--target", help="HF checkpoint dir or .gguf (default: SmolLM2-135M-Instruct)")
    train.add_argument("--kind", choices=["eagle3", "eagle1"], default=defaults.kind)
    for name in ("draft_vocab", "conversations", "skip_conversations", "max_length",
                 "batch_tokens", "epochs",
                 "warmup_steps", "ttt_steps", "seed", "save_every", "threads",
                 "regenerate_batch", "regenerate_max_new", "turns", "code_prompts",
                 "skip_code_prompts"):
        train.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    train.add_argument("--lr", type=float, default=defaults.lr)
    train.add_argument("--target-temperature", type=float, default=defaults.target_temperature,
                       help="soft labels softmax(target logits / T); below 1 sharpens them "
                            "towards the target's greedy token")
    train.add_argument("--max-minutes", type=float, default=defaults.max_minutes,
                       help="stop and save after this long (resume by running again); 0 = no limit")
    train.add_argument("--regenerate", action="store_true",
                       help="self-distillation: replace assistant turns by the target's replies")
    train.add_argument("--loss-backend", choices=["auto", "torch", "triton"], default="auto")
    train.add_argument("--init-from", metavar="DIR",
                       help="warm start from this EAGLE-3 head (e.g. the bundled one)")
    train.add_argument("--data-dir", metavar="DIR",
                       help="where the dataset and the target cache live (default: --out)")
    train.add_argument("--cache-target", action=argparse.BooleanOptionalAction, default=None,
                       help="store the target's outputs once and reuse them every epoch "
                            "(default: when --epochs > 1)")
    train.add_argument("--prepare-only", action="store_true",
                       help="build the dataset (regenerate, cache) and stop")
    train.add_argument("--export-dtype", choices=sorted(DTYPES), default=defaults.export_dtype)
    train.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")


def _check_train(args):
    """The train command's checks that need no model; returns its TrainConfig (which checks
    its numbers)."""
    from .train import TrainConfig

    _check_target(args.target)
    _check_device(args.device)
    for name in ("out", "data_dir"):
        value = getattr(args, name)
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise UserError(f"--{name.replace('_', '-')}: expected a directory (or a new path), "
                            f"got the file {value}")
    if args.init_from is not None and not (Path(args.init_from) / "config.json").is_file():
        raise UserError(f"--init-from: expected an EAGLE-3 head directory with config.json, got "
                        f"{args.init_from}")
    names = TrainConfig.__dataclass_fields__
    try:
        config = TrainConfig(**{k: v for k, v in vars(args).items() if k in names})
    except (TypeError, ValueError) as error:  # "name: expected ..." -> "--name: expected ..."
        name, _, rest = str(error).partition(":")
        raise UserError(f"--{name.replace('_', '-')}:{rest}") from None
    _make_dirs(args)  # last: a run refused for another reason leaves no folder behind
    return config


def _make_dirs(args) -> None:
    """--data-dir and --out created now, before the model loads: a path that cannot be a
    directory is one user error naming its option, and the folders made for the other are
    removed again."""
    made = []  # deepest first
    try:
        for name in ("data_dir", "out"):
            value = getattr(args, name)
            if value is None:
                continue
            path = Path(value)
            missing = [p for p in (path, *path.parents) if not p.exists()]
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise UserError(f"--{name.replace('_', '-')}: cannot create the directory "
                                f"{value} ({error.strerror or error})") from None
            made += missing
    except UserError:
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                pass
        raise


def run_train(args, config) -> int:
    """Train with ``config`` (the :func:`_check_train` of ``args``)."""
    from .runtime.api import load_target_and_tokenizer
    from .train import train

    config.extra = {"command": " ".join(sys.argv)}
    target, tokenizer, _ = load_target_and_tokenizer(args.target, torch.float32, args.device)
    summary = train(config, target, tokenizer)
    print(json.dumps(summary))
    return 0


def _check_target(target: str | None) -> None:
    """Fail fast (before any model loads) on a target that cannot be one."""
    try:
        check_model_path("--target", target)
    except ValueError as error:
        raise UserError(str(error)) from None


def _check_device(device: str) -> None:
    try:
        check_device("--device", device)
    except ValueError as error:
        raise UserError(str(error)) from None


def _check(args) -> None:
    """Every check that needs no model: bad values fail in milliseconds, not after loading."""
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens: expected >= 1, got {args.max_new_tokens}")
    from .runtime.calls import SamplingConfig

    try:  # what generate() will check, named as the options that carry it
        SamplingConfig(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as error:
        raise UserError(f"--{str(error).replace('_', '-')}") from None
    if args.stream and (args.compare or len(args.prompt) > 1):
        raise UserError("--stream takes one prompt and no --compare")
    _check_target(args.target)
    from .runtime.api import check_draft_and_tree

    try:
        check_draft_and_tree(args.draft, None)
    except ValueError as error:
        missing = args.draft is not None and not Path(args.draft).exists()
        raise UserError(f"--{error}" + (" (no such directory)" if missing else "")) from None
    if args.draft == "none":  # options that only shape drafting: refused, not ignored
        for name, value, default in (("--tree", args.tree, "auto"),
                                     ("--draft-weights", args.draft_weights, "auto")):
            if value != default:
                raise UserError(f"{name}: shapes drafting, and --draft none drafts nothing")
    _check_device(args.device)
    if args.activations != "fp32" and torch.device(args.device).type != "cpu":
        raise UserError(f"--activations {args.activations}: a CPU kernels' option, got --device "
                        f"{args.device}")


def activations_warning(target, mode: str) -> str | None:
    """A line for ``--activations`` int16 / int8 over a target whose layers do not take it
    (only GEMMs over Q4 / Q8 block packs do: a GGUF target in fp32 on the cpu backend); None
    when the mode applies or is fp32."""
    from .ops.decoder import follows_cpu_activations

    if mode == "fp32":
        return None
    weight = target.model.layers[0].self_attn.q_proj.weight
    if follows_cpu_activations(weight):
        return None
    return (f"--activations {mode} changes nothing here: the target's weights are not 4- / "
            f"8-bit GGUF blocks in fp32 on the CPU ({str(weight.dtype).replace('torch.', '')} "
            f"on {weight.device.type}), so its GEMMs keep fp32 activations")


def compare(generator, prompts, options: dict, first):
    """:data:`COMPARE_ROUNDS` rounds of a speculative and an autoregressive call on ``prompts``
    (the first round runs the speculative call first, the second the autoregressive one, and
    so on, so neither mode always meets the machine warmer). ``first``, the call already
    printed, is not timed again: a process's first call pays one-off costs the other mode's
    calls never see (its prefill took ~40 ms more, ~6 % of a 128-token reply here). Returns the
    first autoregressive output, each round's speedup (speculative tokens/s over
    autoregressive) and whether every call's tokens equal ``first``'s."""
    speedups, same, base = [], True, None
    for index in range(COMPARE_ROUNDS):
        outputs = {}
        for speculative in ((True, False) if index % 2 == 0 else (False, True)):
            # without a head (--draft none) the "speculative" side decodes plainly too
            mode = speculative and generator.engine.head is not None
            outputs[speculative] = generator.generate(prompts, speculative=mode, **options)
        base = base or outputs[False]
        speedups.append(outputs[True].stats.tokens_per_second
                        / outputs[False].stats.tokens_per_second)
        same &= outputs[True].tokens == outputs[False].tokens == first.tokens
    return base, speedups, same


def generate(args) -> int:
    from . import backend_report, ops
    from .runtime.api import from_pretrained

    try:  # before from_pretrained: the tree budget times the GEMMs of this mode
        ops.set_cpu_activations(args.activations)
    except RuntimeError as error:
        raise UserError(f"--activations: {error}") from error
    generator = from_pretrained(args.target, args.draft, DTYPES[args.dtype], args.device,
                                args.tree, args.draft_weights)
    if args.activations != "fp32":
        warning = activations_warning(generator.engine.target, args.activations)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    if getattr(generator, "budget", None) is not None:
        print(generator.budget.report())
    generator.engine.prompt_lookup = not args.no_lookup
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=not args.no_chat)
    if args.stream:  # without a head (--draft none) the stream decodes plainly
        pieces = generator.stream(args.prompt[0], speculative=generator.engine.head is not None,
                                  **options)
        for piece in pieces:
            print(piece, end="", flush=True)
        print()
        print(json.dumps(pieces.output.stats.summary()))
        return 0
    spec = generator.generate(args.prompt, speculative=generator.engine.head is not None,
                              **options)
    for prompt, text in zip(args.prompt, spec.texts):
        print(f"prompt: {prompt}\nreply:  {text.strip()}\n")
    stats = spec.stats
    print(f"{stats.mode}: {sum(stats.new_tokens)} new tokens in "
          f"{stats.prefill_seconds + stats.decode_seconds:.2f} s = {stats.tokens_per_second:.1f} "
          f"tokens/s, tau {stats.tau:.2f} tokens/cycle, {stats.cycles} cycles, "
          f"accepted-length histogram {stats.accepted_histogram}")
    if stats.plain_steps:
        print(f"  {stats.plain_steps} of the cycles were plain steps: {stats.fallback}")
    if stats.lookup_steps:
        print(f"  context drafts: {stats.lookup_steps} steps verified one ("
              f"{stats.context_cycles} in place of a tree, {stats.store_steps} from the reply "
              f"store), {stats.lookup_accepted} drafted tokens accepted")
    report = {"speculative": stats.summary()}
    if args.compare:
        base, speedups, same = compare(generator, args.prompt, options, spec)
        speedup = statistics.median(speedups)
        print(f"autoregressive: {base.stats.tokens_per_second:.1f} tokens/s; speedup "
              f"{speedup:.2f}x (median of {len(speedups)} rounds, each one call of both in "
              f"alternating order: {' '.join(f'{x:.2f}' for x in speedups)}); outputs "
              f"identical: {'yes' if same else 'NO'}"
              f"{'' if args.temperature == 0 else ' (sampling: not expected)'}")
        report.update(autoregressive=base.stats.summary(), speedup=speedup,
                      round_speedups=speedups, identical=same)
    if args.json:
        print(json.dumps(report))
    print(backend_report())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run a command; a user error prints one ``error: ...`` line and exits with status 2."""
    args = parser().parse_args(argv)
    try:
        if args.command == "train":
            return run_train(args, _check_train(args))
        args.prompt = args.prompt or [DEFAULT_PROMPT]
        _check(args)
        return generate(args)
    except UserError as error:
        _fail(str(error))
    except (ValueError, OSError) as error:
        # The library raises these for bad arguments and files, each naming what was wrong
        # (a checkpoint that does not fit the target, a missing data package, a directory
        # without a tokenizer, a file it may not read, ...). Not TypeError: the CLI passes
        # only parsed values, so one would be a bug, and its traceback is wanted.
        _fail(" ".join(str(error).split()) or type(error).__name__)


if __name__ == "__main__":
    sys.exit(main())
