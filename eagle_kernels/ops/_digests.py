"""Source digests: which kernel code a GPU verdict entry proved.

A verdict entry records the digest of the kernels its GPU run proved (``source_digest``,
written on the GPU by bench/sanitize_kernels.py), and
:func:`eagle_kernels.ops._backend.verdict_allows` lets it count only while the kernels here
have that digest: a kernel edited since its run leaves ``auto`` until a run proves the edit
(entries written before digests existed: ``_backend.LEGACY_SOURCE_DIGESTS``;
``KERNEL_REVISIONS`` still guards the changes a digest cannot see).

* ``triton``: over the source of the ``@triton.jit`` functions the op's registered launcher
  reaches (directly, through Python helpers of eagle_kernels, closures such as
  ``acceptance._chain_as_tree``'s, partials, and tuples of launchers such as ``loss._TRITON``),
  the jit helpers those kernels name, transitively, the module constants they read
  (``NO_KEY``) and the module constants the launcher's code reads (block sizes, limits and
  compile options it passes them: ``LINEAR_BLOCK_M``, ``TOPK_CHUNK``, ``EXACT_ROUNDING``; a
  constant is a number, string, dtype, or a tuple or public dict of those: :func:`_constant`).
  A kernel's text is its decorators, signature and body with its docstring left out, so
  docstrings and the launchers' code leave the digest alone, while any edit of a kernel's
  decorator options, signature or body, comments included, or of a constant either reads,
  changes it.
  Computed from the Python source, not Triton's ``JITFunction.src``: the same digest with any
  Triton version, or none. Limits: a launcher's own code (its grid, the arguments it passes)
  is not covered, so bump ``KERNEL_REVISIONS`` for such a change; kernels are found through
  plain names, closures, partials and tuples (tests/test_kernel_digests.py checks that every
  launch site of every op's code names a kernel of its digest); kernels an op reaches only
  through the registry (another public op) belong to that op's entries.
* ``cuda``: the digests ``_C.source_digests()`` reports for the ``_C`` functions the launcher
  calls, and the module constants its code reads (the csrc files of each op family, embedded
  at build time by csrc/source_digests.py:
  an installed package need not carry csrc/, and only the binary says what was compiled). An
  ``_C`` built before digests existed reports none, and then an entry that records a digest
  does not count: nothing vouches that the binary is the code it proved.

Nothing is computed at import: ``_backend.source_digest`` computes on first use and caches.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import textwrap
import types
from typing import Callable, Iterable, NamedTuple

import torch

from ._triton import is_kernel

DIGEST_CHARS = 16  # hex digits kept, as csrc/source_digests.py keeps
_PACKAGE = "eagle_kernels."
# resolve() and the registry reach every op's launchers: an op's digest stops at them.
_REGISTRY_MODULE = "eagle_kernels.ops._backend"


def _hash(parts: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:DIGEST_CHARS]


def _ours(fn: types.FunctionType) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module.startswith(_PACKAGE) and module != _REGISTRY_MODULE


def _named_by(fn: types.FunctionType, names: set[str], constants: dict[str, str]) -> list:
    """The values ``fn``'s code (nested functions included) names: its globals and closure
    cells. Every name it uses goes into ``names``, attribute names too (``_C.build_tree``),
    and every module constant it reads into ``constants`` (``"module.NAME": repr``): block
    sizes and limits a launcher passes to its kernels decide what they compute."""
    found = []
    for cell in fn.__closure__ or ():
        try:
            found.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        codes += [const for const in code.co_consts if isinstance(const, types.CodeType)]
        names.update(code.co_names)
        for name in code.co_names:
            if name not in fn.__globals__:
                continue
            value = fn.__globals__[name]
            found.append(value)
            text = None if name.startswith("__") or is_kernel(value) else _constant(name, value)
            if text is not None:
                constants[f"{fn.__module__}.{name}"] = text
    return found


class Reached(NamedTuple):
    """What a launcher reaches (:func:`reached`)."""

    kernels: list            # the jit kernels it launches
    names: set[str]          # every name its Python code uses (the _C functions it calls)
    constants: dict[str, str]  # "module.NAME" -> repr of each module constant its code reads
    functions: list          # the Python functions of eagle_kernels it went through


def reached(launcher: Callable) -> Reached:
    """The jit kernels a launcher reaches, every name its Python code uses and the module
    constants it reads."""
    kernels, names, constants, functions = {}, set(), {}, []
    seen, todo = set(), [launcher]
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if is_kernel(obj) and is_kernel(obj.fn):  # an autotune wrapper: the kernel is inside
            todo.append(obj.fn)
        elif is_kernel(obj):
            kernels[id(obj)] = obj
        elif isinstance(obj, functools.partial):
            todo += [obj.func, *obj.args, *obj.keywords.values()]
        elif isinstance(obj, tuple):  # a NamedTuple of launchers (loss.py's _Kernels)
            todo += list(obj)
        elif isinstance(obj, types.FunctionType) and _ours(obj):
            functions.append(obj)
            todo += _named_by(obj, names, constants)
            if hasattr(obj, "__wrapped__"):  # functools.wraps decorators
                todo.append(obj.__wrapped__)
    return Reached(list(kernels.values()), names, constants, functions)


def _constant(name: str, value) -> str | None:
    """A module constant as launchers and kernels read it, as text, or None for anything
    else: a number, bool or string (``tl.constexpr(x)`` holds x; without Triton the stand-in
    returns x itself), a torch dtype, a tuple or frozenset of those, or a dict of those under a
    public name (``EXACT_ROUNDING``, ``LOGIT_DTYPE_CODES``). Lists, sets and private dicts are
    module state, not constants (``_LAYOUTS`` is a memo, ``_VALUE_CHECKS_OFF`` a counter): a
    digest that read them would change with what ran before it."""
    value = getattr(value, "value", value)
    if isinstance(value, (bool, int, float, str, torch.dtype)):
        return repr(value)
    if isinstance(value, (tuple, frozenset)):
        items = [_constant(name, item) for item in value]
        if None in items:
            return None
        items = sorted(items) if isinstance(value, frozenset) else items
        return f"{type(value).__name__}({', '.join(items)})"
    if isinstance(value, dict) and not name.startswith("_"):
        items = [(_constant(name, key), _constant(name, item)) for key, item in value.items()]
        if any(None in pair for pair in items):
            return None
        return "{" + ", ".join(f"{key}: {item}" for key, item in items) + "}"
    return None


def _kernel_source(kernel) -> tuple[str, list]:
    """A kernel's text (decorators and body, docstring left out, then the module constants
    it reads) and the jit helpers it names."""
    source = textwrap.dedent(inspect.getsource(kernel.fn))
    node = ast.parse(source).body[0]
    skip = set()
    if ast.get_docstring(node, clean=False) is not None:
        skip = set(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    first = min([node.lineno] + [decorator.lineno for decorator in node.decorator_list])
    text = [line for number, line in enumerate(source.splitlines()[first - 1:], first)
            if number not in skip]
    helpers, constants = [], []
    used = {name.id for part in (node.args, *node.body) for name in ast.walk(part)
            if isinstance(name, ast.Name)}
    for name in sorted(used & kernel.fn.__globals__.keys()):
        value = kernel.fn.__globals__[name]
        if is_kernel(value):
            helpers.append(value)
        elif (constant := _constant(name, value)) is not None:
            constants.append(f"{name} = {constant}")
    return "\n".join(text + constants), helpers


def kernel_texts(kernels: list) -> dict[str, str]:
    """The text (:func:`_kernel_source`) of each of ``kernels`` and of the jit helpers they
    call, transitively, by ``"module.name"``. Raises OSError / TypeError where a source
    cannot be read."""
    todo, texts = list(kernels), {}
    while todo:
        kernel = todo.pop()
        key = f"{kernel.fn.__module__}.{kernel.fn.__name__}"
        if key not in texts:
            texts[key], helpers = _kernel_source(kernel)
            todo += helpers
    return texts


def triton_digest(launcher: Callable) -> str | None:
    """Digest of the Triton kernels ``launcher`` runs (see the module docstring); None when
    it reaches none or their source cannot be read."""
    found = reached(launcher)
    try:
        texts = kernel_texts(found.kernels)
    except (OSError, TypeError):  # no source here (a bytecode-only install): cannot vouch
        return None
    if not texts:
        return None
    return _hash([f"{key}\n{texts[key]}" for key in sorted(texts)] + _constant_lines(found))


def _constant_lines(found: Reached) -> list[str]:
    return [f"{name} = {value}" for name, value in sorted(found.constants.items())]


def cuda_digest(launcher: Callable, compiled: dict[str, str] | None) -> str | None:
    """Digest of the ``_C`` functions ``launcher`` calls, from ``compiled`` (what
    ``_C.source_digests()`` reports); None when it reports none or the launcher calls none."""
    if not compiled:
        return None
    found = reached(launcher)
    used = sorted(name for name in found.names if name in compiled)
    if not used:
        return None
    return _hash([f"{name} {compiled[name]}" for name in used] + _constant_lines(found))
