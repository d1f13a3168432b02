"""The whole-decoder-layer op: one call per layer (csrc/cpu/decoder_layer.h on CPU).

:func:`decoder_layer` is the public op: every argument checked on every call, like the other
ops. A model runs 30 layers per forward with the same positions, tables, lengths and mask, and
the same weights every step, so the runtime splits the checks by how often their subjects
change:

* :class:`LayerWeights`: a layer's weights, biases and norms, checked once and packed for the
  cpu GEMM on first use. It re-packs by itself when a weight changes in place (version counter)
  or any of its tensors moves (storage pointer), and holds every tensor it points at, so a
  held binding never runs stale or freed memory.
* :class:`DecoderStep`: what every layer of one forward shares (positions, cos/sin tables,
  cache lengths, tree mask, tree offset, the cache's shape), checked once per forward,
  value checks included.
* :meth:`DecoderStep.run`: per layer only ``x``, the layer's K/V cache tensors and the
  residual, with shape / dtype / contiguity compared against what the step and the weights
  fixed, before one C++ call. A decode step's Python time per layer drops from ~150 us (every
  check on every call, measured on 2 cores) to ~15 us.

Whatever the path, the kernel sees exactly the sizes its pointers were checked against, so no
input can make it read or write out of bounds, value checks on or off.
"""

from __future__ import annotations

import operator
from typing import Sequence

import torch

from . import reference
from ._backend import cpu_extension, cpu_float32_only, register, resolve
from ._validate import (_UNCHANGED, block_memo, check_eps, check_int, check_positive,
                        check_range, check_tensor, recall, remember, value_checks_enabled)
from .decoder import _PACKS, _check_input, pack_address

LAYER_WEIGHTS = ("q", "k", "v", "o", "gate", "up", "down")


def decoder_layer_backend(device: torch.device, dtype: torch.dtype) -> str:
    """The backend ``decoder_layer(..., backend="auto")`` runs for tensors of this device and
    dtype: "cpu" where the fused kernel takes them, else "torch" (the reference composition,
    which a caller with faster per-op backends, e.g. CUDA, should not use)."""
    return resolve("decoder_layer", "auto", device, dtype=dtype)[0]


def _matches(t, dtype: torch.dtype, shape: tuple, device: torch.device) -> bool:
    """Fast yes for a well-formed tensor argument; on no the caller runs check_tensor, which
    raises the precise error."""
    return (isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == shape
            and t.device == device and t.is_contiguous())


def _check(name: str, t, dtype: torch.dtype, shape: tuple, device: torch.device) -> None:
    if not _matches(t, dtype, shape, device):
        check_tensor(name, t, (dtype,), shape, device)


class LayerWeights:
    """One decoder layer's parameters, checked once (see the module docstring).

    Parameters
    ----------
    weights : q [Hq*D, in], k [Hkv*D, in], v [Hkv*D, in], o [H, Hq*D], gate [I, H], up [I, H],
        down [H, I] (nn.Linear layout), one float dtype, contiguous, one device.
    biases : seven entries, each None or [N] of its weight.
    input_norm : [in] RMSNorm weight applied to the input first, or None (EAGLE heads).
    post_norm : [H] RMSNorm weight of the MLP input.
    eps : RMSNorm epsilon.
    """

    def __init__(self, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor | None],
                 input_norm: torch.Tensor | None, post_norm: torch.Tensor, eps: float):
        if not isinstance(weights, (list, tuple)) or len(weights) != len(LAYER_WEIGHTS):
            raise ValueError(f"weights: expected {len(LAYER_WEIGHTS)} tensors "
                             f"({', '.join(LAYER_WEIGHTS)})")
        if not isinstance(biases, (list, tuple)) or len(biases) != len(LAYER_WEIGHTS):
            raise ValueError(f"biases: expected {len(LAYER_WEIGHTS)} entries (None for no bias)")
        self.weights, self.biases = list(weights), list(biases)
        self.input_norm, self.post_norm, self.eps = input_norm, post_norm, check_eps("eps", eps)
        self._dims = None
        self._check_tensors()
        self._tensors = [t for t in (*weights, *biases, input_norm, post_norm) if t is not None]
        self._checked = self._stamp_now()  # the tensors' stamp when last checked / packed
        self._packed = None
        self._packs: list[torch.Tensor] = []
        self._pointers: list[int] = []
        self._held: list[torch.Tensor] = []
        self._stamped_in = -1  # the weights_unchanged epoch of the last stamp comparison

    def _check_tensors(self) -> None:
        """Every tensor's type, dtype, device, contiguity and shape; on a re-check (a tensor
        changed since), also that nothing the kernel sizes itself by has changed."""
        wq = _check_input("weights[0] (q)", self.weights[0])
        if wq.dim() != 2:
            raise ValueError(f"weights[0] (q): expected shape [Hq*D, in], got {list(wq.shape)}")
        dtype, device = wq.dtype, wq.device
        q_width, in_features = wq.shape
        wk, wo, wg = self.weights[1], self.weights[3], self.weights[4]
        check_tensor("weights[1] (k)", wk, (dtype,), (None, in_features), device)
        kv_width = wk.shape[0]
        hidden = wo.shape[0] if isinstance(wo, torch.Tensor) and wo.dim() == 2 else -1
        intermediate = wg.shape[0] if isinstance(wg, torch.Tensor) and wg.dim() == 2 else -1
        shapes = [(kv_width, in_features), (hidden, q_width), (intermediate, hidden),
                  (intermediate, hidden), (hidden, intermediate)]
        for i, (name, w, shape) in enumerate(zip(LAYER_WEIGHTS[2:], self.weights[2:], shapes), 2):
            check_tensor(f"weights[{i}] ({name})", w, (dtype,), shape, device)
        for i, (name, w, b) in enumerate(zip(LAYER_WEIGHTS, self.weights, self.biases)):
            if b is not None:
                check_tensor(f"biases[{i}] ({name})", b, (dtype,), (w.shape[0],), device)
        if self.input_norm is not None:
            check_tensor("input_norm", self.input_norm, (dtype,), (in_features,), device)
        check_tensor("post_norm", self.post_norm, (dtype,), (hidden,), device)
        if min(q_width, in_features, kv_width, hidden, intermediate) == 0:
            raise ValueError(f"weights: expected no empty dimension, got q {q_width}, in "
                             f"{in_features}, k/v {kv_width}, hidden {hidden}, intermediate "
                             f"{intermediate}")
        dims = (dtype, device, q_width, in_features, kv_width, hidden, intermediate)
        if self._dims is not None and dims != self._dims:
            raise ValueError(f"weights: changed since they were bound (dtype, device, sizes "
                             f"{self._dims} -> {dims}); bind the layer again")
        self._dims = dims
        (self.dtype, self.device, self.q_width, self.in_features, self.kv_width, self.hidden,
         self.intermediate) = dims

    def _stamp_now(self) -> tuple | None:
        """Storage pointers and version counters of every tensor; None for inference tensors
        (no version counter: their packs cannot be kept, see decoder._PackedWeights)."""
        try:
            return tuple((t.data_ptr(), t._version) for t in self._tensors)
        except RuntimeError:
            return None

    def kernel_pointers(self) -> list[int]:
        """input norm, post norm, the seven packed weights, the seven biases (0 for none):
        checked and packed again first when any tensor changed since the last call (storage
        pointer or version counter; a write through ``.data`` bumps neither, so change weights
        in place under ``torch.no_grad()`` instead). Inside :func:`weights_unchanged`, only
        the first call in the block compares (a call outside any block, e.g. from another
        thread, makes the next one compare again)."""
        block = _UNCHANGED.epoch
        if block >= 0 and self._stamped_in == block:
            return self._pointers
        self._stamped_in = -1  # until this call's comparison (and any re-check) succeeds
        stamp = self._stamp_now()
        if stamp is None or stamp != self._packed:
            if stamp is None or stamp != self._checked:
                self._check_tensors()
                self._checked = stamp
            self._packs = [_PACKS.get(w) for w in self.weights]
            self._pointers = [0 if self.input_norm is None else self.input_norm.data_ptr(),
                              self.post_norm.data_ptr(), *(pack_address(p) for p in self._packs),
                              *(0 if b is None else b.data_ptr() for b in self.biases)]
            # Views of the storages those pointers address: inside weights_unchanged a tensor
            # given new storage (.data = / set_) despite the promise runs stale values, not
            # freed memory (the packs are private copies, held by _packs). Resizing a storage
            # in place is not covered: that breaks the promise beyond what is held.
            self._held = [t.detach() for t in (self.input_norm, self.post_norm, *self.biases)
                          if t is not None]
            self._packed = stamp
        if stamp is not None:  # inference tensors are re-packed on every call
            self._stamped_in = block
        return self._pointers


class HeldTensors(list):
    """What a kept stack's pointers address (packs, views of the caches' storages); a list a
    test can hold a weak reference to, to see it go with its caches."""


class DecoderStep:
    """What every layer of one forward shares, checked once (value checks included).

    Parameters
    ----------
    batch, count : B and T of the layer inputs.
    positions : [B, T] int64 RoPE positions into ``cos`` / ``sin``.
    cos, sin : [P, D] rotary tables (P >= 1), dtype of the inputs.
    cache_shape : (B, max_len, Hkv, D) of every layer's K and V cache tensors.
    cache_lens : [B] int32 committed lengths.
    tree_mask : [B, T, ceil((tree_offset + T) / 32)] int32 packed visibility over the
        ``tree_offset + T`` tree keys.
    tree_offset : int, tree keys already written by earlier calls (drafting frontiers).
    dtype, device : of the layer inputs, weights and caches.
    """

    def __init__(self, batch: int, count: int, positions: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor, cache_shape: Sequence[int], cache_lens: torch.Tensor,
                 tree_mask: torch.Tensor, tree_offset: int, dtype: torch.dtype,
                 device: torch.device):
        check_int("batch", batch, 0)
        check_int("count", count, 0)
        if not isinstance(cache_shape, (tuple, list, torch.Size)):
            raise TypeError(f"cache_shape: expected (B, max_len, Hkv, D), got "
                            f"{type(cache_shape).__name__}")
        device = torch.device(device)
        if len(cache_shape) != 4 or cache_shape[0] != batch or min(cache_shape[2:]) < 1:
            raise ValueError(f"k_cache: expected shape [{batch}, max_len, Hkv >= 1, D >= 1], got "
                             f"{list(cache_shape)}")
        _, max_len, kv_heads, head_dim = cache_shape
        check_int("tree_offset", tree_offset, 0)
        tree_keys = tree_offset + count
        check_tensor("positions", positions, (torch.int64,), (batch, count), device)
        check_tensor("cos", cos, (dtype,), (None, head_dim), device)
        check_tensor("sin", sin, (dtype,), tuple(cos.shape), device)
        if cos.shape[0] == 0 and batch * count:
            raise ValueError("cos: expected at least one row (the tables positions index)")
        check_tensor("cache_lens", cache_lens, (torch.int32,), (batch,), device)
        check_tensor("tree_mask", tree_mask, (torch.int32,),
                     (batch, count, reference.mask_words(tree_keys)), device)
        if value_checks_enabled():
            check_range("cache_lens", cache_lens, 0, max_len - tree_keys + 1,
                        f" (prefix plus {tree_keys} tree keys must fit max_len {max_len})")
            check_range("positions", positions, 0, cos.shape[0], " (rows of the cos/sin tables)")
        self.batch, self.count, self.dtype, self.device = batch, count, dtype, device
        self.cache_shape = torch.Size(cache_shape)
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.positions, self.cos, self.sin = positions, cos, sin
        self.cache_lens, self.tree_mask, self.tree_offset = cache_lens, tree_mask, tree_offset
        self._tail = [positions.data_ptr(), cos.data_ptr(), sin.data_ptr()]
        self._sizes = [cos.shape[0], max_len, tree_offset, tree_mask.shape[2]]

    def check(self, layer: LayerWeights, x: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor, residual: torch.Tensor | None) -> None:
        """The per-layer checks: x, the caches and the residual against the step and weights."""
        if layer.dtype != self.dtype or layer.device != self.device:
            raise ValueError(f"weights: expected {self.dtype} on {self.device} (the inputs'), "
                             f"got {layer.dtype} on {layer.device}")
        _check("x", x, self.dtype, (self.batch, self.count, layer.in_features), self.device)
        _check("k_cache", k_cache, self.dtype, self.cache_shape, self.device)
        _check("v_cache", v_cache, self.dtype, self.cache_shape, self.device)
        heads, rest = divmod(layer.q_width, self.head_dim)
        if (layer.kv_width != self.kv_heads * self.head_dim or rest or heads % self.kv_heads):
            raise ValueError(f"weights: expected q rows a multiple of {self.kv_heads} heads of "
                             f"{self.head_dim} and k/v rows {self.kv_heads * self.head_dim} "
                             f"(the cache's heads), got {layer.q_width} and {layer.kv_width}")
        if residual is None and layer.in_features != layer.hidden:
            raise ValueError(f"residual: required when x's width {layer.in_features} differs "
                             f"from hidden {layer.hidden}")
        if residual is not None:
            _check("residual", residual, self.dtype, (self.batch, self.count, layer.hidden),
                   self.device)

    def run(self, layer: LayerWeights, x: torch.Tensor, k_cache: torch.Tensor,
            v_cache: torch.Tensor, residual: torch.Tensor | None = None,
            sm_scale: float | None = None) -> torch.Tensor:
        """One layer on the cpu backend (fp32 CPU tensors): checks, then one C++ call.

        ``x`` [B, T, in] -> [B, T, H]; the T new keys are written into ``k_cache`` /
        ``v_cache`` at ``cache_lens[b] + tree_offset + t``."""
        self._check_cpu()
        self.check(layer, x, k_cache, v_cache, residual)
        return self._run_cpu(layer, x, k_cache, v_cache, residual, sm_scale)

    def _check_cpu(self) -> None:
        reason = cpu_float32_only(dtype=self.dtype)
        if reason is not None or self.device.type != "cpu":
            raise ValueError(f"x: the cpu decoder layer {reason or 'takes CPU tensors'}")

    def run_layers(self, layers: Sequence[LayerWeights], x: torch.Tensor,
                   k_caches: Sequence[torch.Tensor], v_caches: Sequence[torch.Tensor],
                   sm_scale: float | None = None, capture: Sequence[int] = (),
                   final_norm: tuple[torch.Tensor, float] | None = None
                   ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Consecutive layers, each taking the previous one's output (and its input as the
        residual), in one C++ call on the cpu backend: what :meth:`run` gives layer after
        layer, bit for bit, without returning to Python in between.

        ``layers[i]`` runs over ``k_caches[i]`` / ``v_caches[i]``; every layer needs
        in == hidden == ``x``'s width and the first layer's eps, intermediate size and q width.
        ``x`` [B, T, H] -> [B, T, H].

        ``capture``: indices into ``layers`` whose inputs are returned too (EAGLE-3 features),
        concatenated in increasing index order: with any, the result is ``(out, features)``,
        features [B, T, len(set(capture)) * H]; without, ``out`` alone. ``final_norm``:
        ``(weight [H], eps)``, the model's last RMSNorm applied to ``out`` (the bits of
        :func:`rms_norm`).
        """
        if not layers:
            raise ValueError("layers: expected at least one LayerWeights")
        if len(k_caches) != len(layers) or len(v_caches) != len(layers):
            raise ValueError(f"k_caches, v_caches: expected one per layer ({len(layers)}), got "
                             f"{len(k_caches)} and {len(v_caches)}")
        self._check_cpu()
        first = layers[0]
        self.check(first, x, k_caches[0], v_caches[0], None)  # x, the caches, the heads
        pointers = self._stack_pointers(layers, k_caches, v_caches)
        slots = self._feature_slots(capture, len(layers))
        norm, norm_eps = self._final_norm(final_norm, first)
        out = torch.empty_like(x)
        features = (torch.empty(self.batch, self.count, max(slots) + 1, first.hidden,
                                dtype=x.dtype, device=x.device) if slots else None)
        shared = [x.data_ptr(), out.data_ptr(), *self._tail, self.cache_lens.data_ptr(),
                  self.tree_mask.data_ptr()]
        cpu_extension().decoder_stack(
            pointers, shared, self._kernel_sizes(first), first.eps, self._scale(sm_scale),
            features=0 if features is None else features.data_ptr(), feature_slots=slots,
            slots=0 if features is None else features.shape[2],
            final_norm=0 if norm is None else norm.data_ptr(), final_eps=norm_eps)
        if not capture:
            return out
        return out, features.view(self.batch, self.count, -1)

    def _stack_pointers(self, layers: Sequence[LayerWeights], k_caches: Sequence[torch.Tensor],
                        v_caches: Sequence[torch.Tensor]) -> list[int]:
        """Every layer's kernel pointers and K / V cache addresses, each layer checked against
        the first and its caches against this step. Inside a :func:`weights_unchanged` block
        the list is made once per (layers, caches) and kept in the block's memo: the same
        layer and cache objects under the same cache shape need no new look (walking 30 layers
        every step cost ~0.2 ms of a 6 ms decode step on 2 cores, their objects out of cache
        after the step's weight stream)."""
        memo = block_memo()
        if memo is not None:  # outside a block nothing is kept: no key to build
            key = ("stack", self.cache_shape, self.dtype, self.device, id(layers[0]),
                   id(k_caches[0]))
            bound = (*layers, *k_caches, *v_caches)
            kept = recall(memo, key, bound)
            if kept is not None:
                return kept[0]
        first, pointers = layers[0], []
        for i, (layer, k_cache, v_cache) in enumerate(zip(layers, k_caches, v_caches)):
            # Every later layer: the first one's dims (so the same checks hold) and caches.
            if (layer.hidden != layer.in_features or layer.eps != first.eps
                    or layer._dims != first._dims):
                raise ValueError(f"layers[{i}]: expected in == hidden and the first layer's eps, "
                                 f"dtype, device and sizes, got in {layer.in_features}, hidden "
                                 f"{layer.hidden}, eps {layer.eps}, (dtype, device, q, in, k/v, "
                                 f"hidden, intermediate) {layer._dims} against {first._dims}")
            if i:
                _check("k_cache", k_cache, self.dtype, self.cache_shape, self.device)
                _check("v_cache", v_cache, self.dtype, self.cache_shape, self.device)
            pointers += layer.kernel_pointers()
            pointers += (k_cache.data_ptr(), v_cache.data_ptr())
        # Not kept where a layer re-packs on every call (inference-tensor weights: its packs of
        # this call die with its next call). Kept: the packs and the storages pointed at, so a
        # tensor given new storage despite the promise runs stale memory, never freed memory.
        if memo is not None and all(layer._stamped_in == _UNCHANGED.epoch for layer in layers):
            held = HeldTensors([pack for layer in layers for pack in (*layer._packs, *layer._held)]
                               + [t.detach() for t in (*k_caches, *v_caches)])
            remember(memo, key, bound, (pointers, held))
        return pointers

    @staticmethod
    def _feature_slots(capture: Sequence[int], depth: int) -> list[int]:
        """Per layer, its input's place among the captured ones (-1: not captured); [] for
        no capture."""
        if not capture:
            return []
        try:
            indices = [operator.index(i) for i in capture if not isinstance(i, bool)]
        except TypeError:
            indices = []
        if len(indices) != len(capture):
            raise TypeError(f"capture: expected int layer indices, got {list(capture)}")
        if any(not 0 <= i < depth for i in indices):
            raise ValueError(f"capture: expected layer indices in [0, {depth}), got {indices}")
        order = sorted(set(indices))
        return [order.index(i) if i in order else -1 for i in range(depth)]

    def _final_norm(self, final_norm, first: LayerWeights) -> tuple[torch.Tensor | None, float]:
        if final_norm is None:
            return None, 0.0
        if not isinstance(final_norm, (tuple, list)) or len(final_norm) != 2:
            raise TypeError(f"final_norm: expected (weight, eps), got {type(final_norm).__name__}")
        weight, eps = final_norm
        check_tensor("final_norm", weight, (self.dtype,), (first.hidden,), self.device)
        return weight, check_eps("final_norm (eps)", eps)

    def _kernel_sizes(self, layer: LayerWeights) -> list[int]:
        """The C++ layer's sizes (cpu_bindings.cpp decoder_layer's order)."""
        return [self.batch, self.count, layer.in_features, layer.hidden, layer.intermediate,
                layer.q_width // self.head_dim, self.kv_heads, self.head_dim, *self._sizes]

    def _scale(self, sm_scale: float | None) -> float:
        return self.head_dim**-0.5 if sm_scale is None else check_positive("sm_scale", sm_scale)

    def _run_cpu(self, layer, x, k_cache, v_cache, residual, sm_scale) -> torch.Tensor:
        out = torch.empty(self.batch, self.count, layer.hidden, dtype=x.dtype)
        pointers = [x.data_ptr(), (x if residual is None else residual).data_ptr(),
                    out.data_ptr(), *layer.kernel_pointers(), *self._tail,
                    k_cache.data_ptr(), v_cache.data_ptr(), self.cache_lens.data_ptr(),
                    self.tree_mask.data_ptr()]
        cpu_extension().decoder_layer(pointers, self._kernel_sizes(layer), layer.eps,
                                      self._scale(sm_scale))
        return out


def decoder_layer(x: torch.Tensor, weights: Sequence[torch.Tensor],
                  biases: Sequence[torch.Tensor | None], input_norm: torch.Tensor | None,
                  post_norm: torch.Tensor, eps: float, positions: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, cache_lens: torch.Tensor, tree_mask: torch.Tensor,
                  tree_offset: int = 0, residual: torch.Tensor | None = None,
                  sm_scale: float | None = None, backend: str = "auto") -> torch.Tensor:
    """One whole pre-norm decoder layer over the KV cache, in one call.

    The composition of :func:`rms_norm`, :func:`linear_group`, :func:`apply_rope`, a cache
    write, :func:`eagle_kernels.ops.tree_attention` and the SiLU-gated MLP (contract:
    :func:`eagle_kernels.ops.reference.decoder_layer`). The ``cpu`` backend runs it as one C++
    call (csrc/cpu/decoder_layer.h): a decode step then costs one Python call per layer instead
    of a dozen, and the result equals the op-by-op cpu path bit for bit. Callers that run many
    layers over the same step should use :class:`LayerWeights` and :class:`DecoderStep`.

    Parameters
    ----------
    x : [B, T, in] float32 / float16 / bfloat16, contiguous.
    weights : q [Hq*D, in], k [Hkv*D, in], v [Hkv*D, in], o [H, Hq*D], gate [I, H], up [I, H],
        down [H, I] (nn.Linear layout), dtype of ``x``, contiguous.
    biases : seven entries, each None or [N] of its weight.
    input_norm : [in] RMSNorm weight applied to ``x`` first, or None (EAGLE heads).
    post_norm : [H] RMSNorm weight of the MLP input.
    eps : RMSNorm epsilon.
    positions : [B, T] int64 RoPE positions into ``cos`` / ``sin`` [P, D].
    k_cache, v_cache : [B, max_len, Hkv, D]; the T new keys are written in place at
        ``cache_lens[b] + tree_offset + t`` (which must be < max_len).
    cache_lens : [B] int32 committed lengths.
    tree_mask : [B, T, ceil((tree_offset + T) / 32)] int32 packed visibility over the
        ``tree_offset + T`` tree keys.
    tree_offset : int, tree keys already written by earlier calls (drafting frontiers).
    residual : [B, T, H], optional; default ``x`` (needs in == H).
    sm_scale : attention scale, default ``D ** -0.5``.

    Returns
    -------
    [B, T, H], dtype of ``x``.
    """
    _check_input("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected shape [B, T, in], got {list(x.shape)}")
    check_tensor("k_cache", k_cache, (x.dtype,), (x.shape[0], None, None, None), x.device)
    layer, step = _bind(x, weights, biases, input_norm, post_norm, eps, positions, cos, sin,
                        k_cache, cache_lens, tree_mask, tree_offset)
    step.check(layer, x, k_cache, v_cache, residual)  # the backends take checked arguments
    name, implementation = resolve("decoder_layer", backend, x.device, dtype=x.dtype)
    if name == "cpu":  # the registered function would check everything again
        return step._run_cpu(layer, x, k_cache, v_cache, residual, sm_scale)
    return implementation(x, layer.weights, layer.biases, input_norm, post_norm, layer.eps,
                          positions, cos, sin, k_cache, v_cache, cache_lens, tree_mask,
                          tree_offset, residual, sm_scale)


def _bind(x, weights, biases, input_norm, post_norm, eps, positions, cos, sin, k_cache,
          cache_lens, tree_mask, tree_offset) -> tuple[LayerWeights, DecoderStep]:
    """decoder_layer's arguments as a checked LayerWeights and DecoderStep."""
    layer = LayerWeights(weights, biases, input_norm, post_norm, eps)
    step = DecoderStep(x.shape[0], x.shape[1], positions, cos, sin, k_cache.shape, cache_lens,
                       tree_mask, tree_offset, x.dtype, x.device)
    return layer, step


def _decoder_layer_cpu(x, weights, biases, input_norm, post_norm, eps, positions, cos, sin,
                       k_cache, v_cache, cache_lens, tree_mask, tree_offset, residual, sm_scale):
    layer, step = _bind(x, weights, biases, input_norm, post_norm, eps, positions, cos, sin,
                        k_cache, cache_lens, tree_mask, tree_offset)
    return step._run_cpu(layer, x, k_cache, v_cache, residual, sm_scale)


register("decoder_layer", "torch", reference.decoder_layer)
register("decoder_layer", "cpu", _decoder_layer_cpu, supports=cpu_float32_only)
