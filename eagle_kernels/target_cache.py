"""The target's outputs on the training examples, computed once and reused by every epoch.

The EAGLE-3 loss needs, at every position of a training example, the target's features (the
inputs of three of its layers, [L, 3H]), its logits over the draft vocabulary and the argmax of
its full-vocabulary logits. Producing them is a no-grad prefill of the target plus its lm_head:
on 2 CPU cores about 40 % of a training step with 7 TTT steps, the same work in every epoch.
This cache does it once per example and stores, per example (unpadded, fp32):

* ``features`` [L, 3H]: as :func:`eagle_kernels.runtime.training.target_pass` returns them;
* ``hidden`` [L, H]: the final-normed hidden state; the draft-vocabulary logits are recomputed
  from it at load time (one [L, H] x [H, Vd] GEMM, ~3 % of a step), because storing Vd = 8192
  logits per token would take 3.5x the space of everything else;
* ``argmax`` [L] int64: the target's greedy token (over the full vocabulary) at each position.

Layout: ``DIR/key.json`` (what the cache was computed from: the dataset key, the target's
fingerprint, the feature layers; a mismatch rebuilds the cache) and ``DIR/NNNNNN.safetensors``
per example, whose metadata holds the example's digest (:func:`example_digest`: its length and
the CRC-32 of its token ids). :meth:`TargetCache.fill` recomputes every file whose digest is not
its example's (missing, torn, or another example's); :meth:`TargetCache.batch` refuses one
(ValueError): a run sharing the directory rewrote it meanwhile. About 9.2 KB per token at
SmolLM2-135M's width (0.7 M tokens: 6.5 GB).

On the ``cpu`` backend the target's forward and lm_head are row-invariant, so an example's
cached outputs are bit-identical to those a padded training batch would compute: caching changes
only the speed, never the loss (``tests/test_training.py`` checks this exactly).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch

from . import ops
from .runtime import training
from .runtime.model import TargetModel

KEY_FILE = "key.json"
FORMAT = 2  # 2: per-example digests in each file's metadata


def target_fingerprint(target: TargetModel) -> list:
    """Shape and checksum of every target parameter: a different target changes the cache key."""
    return [[name, list(p.shape), round(float(p.detach().double().sum()), 6)]
            for name, p in target.named_parameters()]


def target_digest(target: TargetModel) -> str:
    """CRC-32 of :func:`target_fingerprint` and the target's dtype: a short form for keys."""
    text = json.dumps([target_fingerprint(target), str(target.dtype)])
    return f"{zlib.crc32(text.encode()):08x}"


def example_digest(ids: torch.Tensor) -> str:
    """``"length:crc32"`` of an example's token ids (int64 bytes): what a cached file was
    computed from."""
    data = ids.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
    return f"{ids.numel()}:{zlib.crc32(data):08x}"


class TargetCache:
    """Per-example target outputs under ``directory`` (see the module docstring)."""

    def __init__(self, directory: str | Path, target: TargetModel, feature_layers,
                 dataset_key: list, draft_ids: torch.Tensor):
        self.directory = Path(directory)
        self.target = target
        self.feature_layers = tuple(feature_layers)
        self.key = {"format": FORMAT, "dataset": dataset_key,
                    "feature_layers": list(self.feature_layers),
                    "target": target_fingerprint(target)}
        self.draft_ids = draft_ids
        # The lm_head rows of the draft vocabulary, kept so its packed form is built once.
        self.draft_weight = target.lm_head.weight[draft_ids].contiguous()
        self.digests: dict[int, str] = {}  # example index -> example_digest, set by fill

    def _file(self, index: int) -> Path:
        return self.directory / f"{index:06d}.safetensors"

    def _stored_digest(self, index: int) -> str | None:
        """The example digest in a stored file's metadata (None: no file, or unreadable)."""
        from safetensors import safe_open

        try:
            with safe_open(str(self._file(index)), "pt") as handle:
                return (handle.metadata() or {}).get("example")
        except Exception:  # missing or torn: safetensors raises its own error types
            return None

    def _current(self) -> bool:
        path = self.directory / KEY_FILE
        return path.is_file() and json.loads(path.read_text()) == self.key

    def fill(self, examples, batch_tokens: int, pad_id: int, progress: bool = True,
             indices: list[int] | None = None) -> None:
        """Compute and store every example (of ``indices``, default all) not stored yet; a
        changed key first empties the cache."""
        from safetensors.torch import save_file
        from tqdm import tqdm

        if not self._current():
            self.directory.mkdir(parents=True, exist_ok=True)
            for stale in self.directory.glob("*.safetensors"):
                stale.unlink()
            (self.directory / KEY_FILE).write_text(json.dumps(self.key))
        wanted = range(len(examples)) if indices is None else indices
        self.digests.update({i: example_digest(examples[i][0]) for i in wanted})
        missing = [i for i in wanted if self._stored_digest(i) != self.digests[i]]
        from .train import batch_plan, collate  # the training batches' own padding

        plan = batch_plan([examples[i][0].numel() for i in missing], batch_tokens, 0, 0)
        bar = tqdm(total=len(missing), desc="cache target outputs", disable=not progress)
        for batch in plan:
            chunk = [missing[i] for i in batch]
            ids, _ = collate(examples, chunk, pad_id, self.target.device)
            hidden, features = training.target_pass(self.target, ids, self.feature_layers)
            _, argmax = training.target_draft_logits(self.target, hidden, self.draft_ids)
            for row, index in enumerate(chunk):
                length = examples[index][0].numel()
                tensors = {"features": features[row, :length].contiguous(),
                           "hidden": hidden[row, :length].contiguous(),
                           "argmax": argmax[row, :length].contiguous()}
                temporary = self._file(index).with_suffix(".tmp")
                save_file({k: v.cpu() for k, v in tensors.items()}, str(temporary),
                          metadata={"example": self.digests[index]})
                temporary.replace(self._file(index))
            bar.update(len(chunk))
        bar.close()

    @torch.no_grad()
    def batch(self, indices: list[int], length: int):
        """(features [B, L, 3H], draft logits [B, L, Vd] fp32, argmax [B, L]) right-padded.

        Padded positions hold zeros (argmax 0); the loss mask never trains on them and no real
        position attends to them (causal). Each example must have been filled, and its file
        must still be its own (else ValueError).
        """
        device = self.target.device
        stored = [self._load(i) for i in indices]
        width = stored[0]["features"].shape[-1]
        features = torch.zeros(len(indices), length, width, dtype=self.target.dtype, device=device)
        hidden = torch.zeros(len(indices), length, self.target.hidden_size,
                             dtype=self.target.dtype, device=device)
        argmax = torch.zeros(len(indices), length, dtype=torch.int64, device=device)
        for row, tensors in enumerate(stored):
            size = tensors["argmax"].numel()
            features[row, :size] = tensors["features"].to(device)
            hidden[row, :size] = tensors["hidden"].to(device)
            argmax[row, :size] = tensors["argmax"].to(device)
        logits = ops.linear(hidden.reshape(-1, hidden.shape[-1]), self.draft_weight).float()
        return features, logits.view(len(indices), length, -1), argmax

    def _load(self, index: int) -> dict[str, torch.Tensor]:
        from safetensors import safe_open

        if index not in self.digests:
            raise ValueError(f"target cache: example {index} was not filled (fill it first)")
        with safe_open(str(self._file(index)), "pt") as handle:
            stored = (handle.metadata() or {}).get("example")
            if stored != self.digests[index]:
                raise ValueError(f"target cache: {self._file(index)} holds example {stored}, "
                                 f"expected {self.digests[index]} (length:crc32); another run "
                                 f"sharing {self.directory} rewrote it")
            return {name: handle.get_tensor(name) for name in handle.keys()}

