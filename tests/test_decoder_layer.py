"""The decoder layer as one cpu kernel call (the fused layer, its bound weights, the stacked
layers and the block memo): equal to the layer run op by op, bit for bit, following replaced
weights and hooks, with clear errors for bad calls."""

import functools
import warnings

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference
from eagle_kernels.runtime.drafting import causal_tree_mask
from eagle_kernels.runtime.layers import layer_step

from cpu_support import needs_cpu_backend, q4_exact_layers

def _layer_case(gen, config_overrides=None, count=5, offset=0):
    from transformers import LlamaConfig

    from eagle_kernels.runtime.layers import DecoderLayer, RotaryEmbedding

    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=50, **(config_overrides or {}))
    torch.manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    layer = DecoderLayer(config, layer_index=0).eval()
    with torch.no_grad():  # a real model's scales: each sublayer's output ~ its input, so a
        for p in layer.parameters():  # wiring error (a lost residual) is O(1) of the output
            p.normal_()  # norms too: not all ones
            if p.dim() == 2:
                p.mul_(p.shape[1] ** -0.5)
    from eagle_kernels.runtime.kv_cache import KVCache

    cache = KVCache.allocate(1, 2, 40, 2, 16, torch.float32, "cpu")
    cache.lens.copy_(torch.tensor([9, 3], dtype=torch.int32))
    cache.keys[0].normal_(generator=gen)
    cache.values[0].normal_(generator=gen)
    x = torch.randn(2, count, 64, generator=gen)
    positions = cache.lens.to(torch.int64).unsqueeze(1) + offset + torch.arange(count)
    rope = RotaryEmbedding(config).tables(positions, torch.float32, 40)
    from conftest import random_parents

    _, mask, _ = ops.build_tree(random_parents(2, offset + count, gen))
    return layer, cache, x, rope, mask[:, offset:].contiguous()


@needs_cpu_backend
@pytest.mark.parametrize("count,offset", [(1, 0), (5, 0), (3, 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_decoder_layer_fused_equals_op_by_op_bit_for_bit(gen, monkeypatch, count, offset, bias):
    """The one-call cpu layer (csrc/cpu/decoder_layer.h) is the op-by-op cpu path, bit for bit
    (output and the K/V it writes), and the reference composition within tolerance."""
    overrides = {"attention_bias": True, "mlp_bias": True} if bias else None
    layer, cache, x, rope, mask = _layer_case(gen, overrides, count, offset)
    caches = [type(cache)([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                          cache.lens.clone()) for _ in range(3)]
    with torch.inference_mode():
        fused = layer(x, rope, caches[0], mask, offset)
        with monkeypatch.context() as patch:  # the runtime's op-by-op path
            patch.setattr(ops, "decoder_layer_backend", lambda *_: "torch")
            op_by_op = layer(x, rope, caches[1], mask, offset)
        a = layer.self_attn
        m = layer.mlp
        projections = [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj,
                       m.down_proj]
        want = reference.decoder_layer(
            x.double(), [p.weight.double() for p in projections],
            [None if p.bias is None else p.bias.double() for p in projections],
            layer.input_layernorm.weight.double(), layer.post_attention_layernorm.weight.double(),
            layer.post_attention_layernorm.eps, rope.positions, rope.cos.double(),
            rope.sin.double(), caches[2].keys[0].double(), caches[2].values[0].double(),
            caches[2].lens, mask, offset)
        torch_fp32 = reference.decoder_layer(
            x, [p.weight for p in projections], [p.bias for p in projections],
            layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.eps, rope.positions, rope.cos, rope.sin,
            caches[2].keys[0].clone(), caches[2].values[0].clone(), caches[2].lens, mask, offset)
    assert torch.equal(fused, op_by_op)
    assert torch.equal(caches[0].keys[0], caches[1].keys[0])
    assert torch.equal(caches[0].values[0], caches[1].values[0])
    # The layer's accuracy is its ops' (each held to 2x torch's fp32 error in the tests above,
    # and bit-equal to the op-by-op path here); this checks the composition is the reference's.
    # Threshold 1e-5 of the output's scale. Measured over 900 draws of these cases (seeds
    # 0-299 x the 3 shapes): fp32 rounding gives median 2.1e-7, p99 4.5e-7, max 6.6e-7, a
    # light tail 15x below the threshold, so a chance failure is far rarer than 1e-6 per run.
    # Power: a layer that loses its residual is off by 0.24-1.0 of the scale (min over the
    # same draws), 2e4x the threshold. (With unscaled N(0, 1) weights the output reaches ~1e3,
    # rounding errors are heavy-tailed and a lost residual hides in them: hence the scaling.)
    scale = float(want.abs().max())
    assert float((fused.double() - want).abs().max()) <= 1e-5 * scale
    assert float((torch_fp32.double() - want).abs().max()) <= 1e-5 * scale


@needs_cpu_backend
def test_decoder_layer_with_separate_residual_and_wide_input(gen):
    """EAGLE-3's midlayer shape: x is [B, T, 2H] (no input norm), the residual is [B, T, H]."""
    layer, cache, x, rope, mask = _layer_case(gen)
    wide = torch.randn(2, x.shape[1], 128, generator=gen)
    # A real model's weight scale (as _layer_case): with N(0, 1) weights, fp32 rounding of the
    # two paths was heavy-tailed and exceeded the 1e-5 threshold below about once in 10 runs.
    # Scaled, |cpu - torch| / scale over 900 draws: median 1.8e-7, p99 3.3e-7, max 3.9e-7 (a
    # light tail 26x under the threshold: a chance failure far rarer than 1e-6 per run); a
    # layer that drops the residual is off by >= 0.53 of the scale on the same draws.
    shapes = [(64, 128), (32, 128), (32, 128), (64, 64), (96, 64), (96, 64), (64, 96)]
    weights = [torch.randn(*shape, generator=gen) * shape[1] ** -0.5 for shape in shapes]
    biases = [None] * 7
    args = (wide, weights, biases, None, torch.rand(64, generator=gen), 1e-6, rope.positions,
            rope.cos, rope.sin)
    cache_args = (cache.lens, mask, 0, x)
    ours = ops.decoder_layer(*args, cache.keys[0].clone(), cache.values[0].clone(), *cache_args,
                             backend="cpu")
    want = ops.decoder_layer(*args, cache.keys[0].clone(), cache.values[0].clone(), *cache_args,
                             backend="torch")
    scale = float(want.abs().max())
    torch.testing.assert_close(ours, want, rtol=0, atol=1e-5 * scale)
    with pytest.raises(ValueError, match="residual"):
        ops.decoder_layer(*args, cache.keys[0], cache.values[0], cache.lens, mask, 0, None)
    with pytest.raises(ValueError, match="weights"):
        ops.decoder_layer(wide, weights[:6], biases, *args[3:], cache.keys[0], cache.values[0],
                          *cache_args)
    with pytest.raises(ValueError, match="cache_lens"):
        ops.decoder_layer(*args, cache.keys[0], cache.values[0],
                          torch.tensor([39, 0], dtype=torch.int32), mask, 0, x)


def _fresh(cache):
    return type(cache)([k.clone() for k in cache.keys], [v.clone() for v in cache.values],
                       cache.lens.clone())


@needs_cpu_backend
def test_bound_layer_follows_its_weights(gen):
    """The runtime's bound path (LayerWeights kept on the module, one DecoderStep per forward)
    never runs stale weights: an in-place change, moved storage and a replaced parameter each
    give the output a freshly checked ops.decoder_layer call gives, bit for bit."""
    from eagle_kernels.runtime.layers import layer_step

    layer, cache, x, rope, mask = _layer_case(gen)

    def bound():
        fresh = _fresh(cache)
        return layer(x, rope, fresh, mask, step=layer_step(x, rope, fresh, mask))

    def unbound():
        fresh, a, m = _fresh(cache), layer.self_attn, layer.mlp
        projections = [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj,
                       m.down_proj]
        return ops.decoder_layer(x, [p.weight for p in projections],
                                 [p.bias for p in projections], layer.input_layernorm.weight,
                                 layer.post_attention_layernorm.weight,
                                 layer.post_attention_layernorm.eps, rope.positions, rope.cos,
                                 rope.sin, fresh.keys[0], fresh.values[0], fresh.lens, mask)

    with torch.inference_mode():
        first = bound()
        assert torch.equal(first, unbound())
    with torch.no_grad():
        layer.mlp.down_proj.weight.mul_(0.5)  # in place: version counter
    with torch.inference_mode():
        assert not torch.equal(bound(), first)
        assert torch.equal(bound(), unbound())
    with torch.no_grad():
        layer.self_attn.q_proj.weight.data = layer.self_attn.q_proj.weight.data * 2  # new storage
        layer.post_attention_layernorm.weight = torch.nn.Parameter(
            layer.post_attention_layernorm.weight + 1)  # a new parameter object
    with torch.inference_mode():
        assert torch.equal(bound(), unbound())
    # Changes the kernel would size itself by wrongly are errors, never out-of-bounds reads.
    down = layer.mlp.down_proj.weight
    with torch.no_grad():
        down.data = torch.randn(64, 95)  # same parameter object, a smaller matrix
    with torch.inference_mode(), pytest.raises(ValueError, match="down"):
        bound()
    with torch.no_grad():
        down.data = torch.randn(64, 96)
    layer.half()  # same parameter objects, another dtype
    with torch.inference_mode(), pytest.raises(ValueError, match="weights"):
        bound()


@needs_cpu_backend
def test_decoder_step_checks_each_layer_call(gen):
    """What the step fixed once is still enforced per layer: x, the caches and the residual
    must match it, and the weights must match the cache's heads."""
    layer, cache, x, rope, mask = _layer_case(gen)
    step = ops.DecoderStep(2, x.shape[1], rope.positions, rope.cos, rope.sin,
                           cache.keys[0].shape, cache.lens, mask, 0, torch.float32,
                           torch.device("cpu"))
    a, m = layer.self_attn, layer.mlp
    weights = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, a.o_proj.weight,
               m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight]
    bound = ops.LayerWeights(weights, [None] * 7, layer.input_layernorm.weight,
                             layer.post_attention_layernorm.weight, 1e-6)
    keys, values = cache.keys[0], cache.values[0]
    with torch.inference_mode():
        out = step.run(bound, x, keys.clone(), values.clone())
        assert out.shape == (2, x.shape[1], 64)
        cases = [
            (lambda: step.run(bound, x[:, :-1].contiguous(), keys, values), "x"),
            (lambda: step.run(bound, x.transpose(0, 1).contiguous().transpose(0, 1), keys, values),
             "x"),
            (lambda: step.run(bound, x, keys[:, :-1], values), "k_cache"),
            (lambda: step.run(bound, x, keys, values.double()), "v_cache"),
            (lambda: step.run(bound, x, keys, values, torch.zeros(2, x.shape[1], 63)),
             "residual"),
            (lambda: step.run(ops.LayerWeights([torch.randn(48, 64)] + weights[1:3]
                                               + [torch.randn(64, 48)] + weights[4:], [None] * 7,
                                               None, weights[3][:, 0].contiguous(), 1e-6),
                              x, keys, values), "weights"),
            (lambda: ops.LayerWeights(weights[:3] + [weights[3][:, :-1]] + weights[4:],
                                      [None] * 7, None, weights[3][:, 0].contiguous(), 1e-6),
             r"weights\[3\]"),
            (lambda: ops.DecoderStep(2, x.shape[1], rope.positions, rope.cos, rope.sin,
                                     keys.shape, cache.lens, mask[:, :, :0], 0, torch.float32,
                                     torch.device("cpu")), "tree_mask"),
            (lambda: ops.DecoderStep(2, x.shape[1], rope.positions, rope.cos[:, :0],
                                     rope.sin[:, :0], (2, 40, 2, 0), cache.lens, mask, 0,
                                     torch.float32, "cpu"), "k_cache"),
            (lambda: ops.DecoderStep(2, x.shape[1], rope.positions, rope.cos[:0], rope.sin[:0],
                                     keys.shape, cache.lens, mask, 0, torch.float32, "cpu"),
             "cos"),
        ]
        for call, message in cases:
            with pytest.raises(ValueError, match=message):
                call()


@needs_cpu_backend
def test_inference_tensor_weights_warn_that_they_are_packed_per_call(gen):
    """A weight made under torch.inference_mode has no version counter, so its pack cannot be
    kept: the result is still right, and the slow path says so instead of being silent."""
    x, w = torch.randn(2, 16, generator=gen), torch.randn(32, 16, generator=gen)
    with torch.inference_mode():
        w_inference = w.clone()
        with pytest.warns(UserWarning, match="inference tensor"):
            y = ops.linear(x, w_inference, backend="cpu")
    assert torch.equal(y, ops.linear(x, w, backend="cpu"))


@needs_cpu_backend
@pytest.mark.parametrize("weights", ["fp32", "q4"])
@pytest.mark.parametrize("features", [(), (0, 2, 5), (1, 3, 9)])
def test_stacked_layers_equal_layer_by_layer(gen, features, weights):
    """The target's forward runs its layers as one C++ call per run between captured features
    (DecoderStep.run_layers); that equals calling the layers one by one, bit for bit: hidden
    states, captured features and every layer's written K/V; over fp32 packs, and over 4-bit
    block packs (a GGUF Q4_1 model dequantized to fp32, as the default target's layers are)."""
    from conftest import random_parents
    from runtime_helpers import tiny_target

    from eagle_kernels.ops import decoder

    target = tiny_target(seed=int(torch.randint(1000, (1,), generator=gen)))
    if weights == "q4":
        q4_exact_layers(target)
        assert decoder.pack_weight(target.model.layers[0].mlp.down_proj.weight).dtype == torch.uint8
    tokens = torch.randint(0, 300, (2, 6), generator=gen)
    depth, mask, _ = ops.build_tree(random_parents(2, 6, gen))
    results = []
    for stacked in (True, False):
        cache = target.allocate_cache(2, 40)
        cache.lens.copy_(torch.tensor([7, 2], dtype=torch.int32))
        positions = cache.lens.to(torch.int64).unsqueeze(1) + depth.to(torch.int64)
        with torch.inference_mode():
            if not stacked:
                target._fused_weights = lambda: None  # the layer-by-layer path
            hidden, captured = target(tokens, positions, cache, mask, features)
        results.append((hidden, captured, cache))
    (h1, f1, c1), (h2, f2, c2) = results
    assert torch.equal(h1, h2)
    assert (f1 is None and f2 is None) or torch.equal(f1, f2)
    assert all(torch.equal(a, b) for a, b in zip(c1.keys + c1.values, c2.keys + c2.values))


@needs_cpu_backend
def test_run_layers_refuses_bad_capture_and_final_norm(gen):
    """capture indices outside the layers and a final norm of the wrong shape or eps are
    ValueErrors naming the argument; the C++ call refuses slots past the features buffer."""
    from eagle_kernels.ops._backend import cpu_extension
    from runtime_helpers import tiny_target

    target = tiny_target(seed=int(torch.randint(1000, (1,), generator=gen)))
    x = torch.randn(1, 2, 64, generator=gen)
    cache = target.allocate_cache(1, 8)
    mask = causal_tree_mask(1, 2, torch.device("cpu"))
    rope = target.model.rotary_emb.tables(torch.arange(2).view(1, 2), x.dtype, cache.max_len)
    step = layer_step(x, rope, cache, mask)
    with torch.no_grad():
        bound = target._fused_weights()
    run = functools.partial(step.run_layers, bound, x, cache.keys, cache.values)
    for capture in ([7], [-1]):
        with pytest.raises(ValueError, match="capture"):
            run(capture=capture)
    for capture in ([True], [0.5]):
        with pytest.raises(TypeError, match="capture"):
            run(capture=capture)
    with pytest.raises(TypeError, match="final_norm"):
        run(final_norm=torch.ones(64))
    for final_norm in ((torch.ones(63), 1e-5), (torch.ones(64), -1.0),
                       (torch.ones(64, dtype=torch.float64), 1e-5)):
        with pytest.raises(ValueError, match="final_norm"):
            run(final_norm=final_norm)
    out, features = run(capture=[3, 0, 3])
    assert features.shape == (1, 2, 128)
    with pytest.raises(ValueError, match="feature_slots"):
        cpu_extension().decoder_stack([0] * 18 * 7, [0] * 7, [1] * 12, 1e-5, 1.0,
                                      features=features.data_ptr(), feature_slots=[2] * 7,
                                      slots=2)


@needs_cpu_backend
def test_stacked_forward_follows_replaced_weights_and_hooks(gen):
    """The target keeps its layers' bindings between forwards (no grad mode); a parameter
    replaced by a new one, or a forward hook, is still seen on the next forward."""
    from runtime_helpers import tiny_target

    target = tiny_target(seed=int(torch.randint(1000, (1,), generator=gen)))
    tokens = torch.randint(0, 300, (1, 3), generator=gen)
    mask = causal_tree_mask(1, 3, torch.device("cpu"))

    def forward():
        cache = target.allocate_cache(1, 8)
        with torch.inference_mode():
            return target(tokens, torch.arange(3).view(1, 3), cache, mask)[0]

    before = forward()
    assert torch.equal(forward(), before)
    down = target.model.layers[3].mlp.down_proj
    down.weight = torch.nn.Parameter(down.weight.detach() * 2)  # a new parameter object
    after = forward()
    assert not torch.equal(after, before)
    calls = []
    handle = target.model.layers[5].register_forward_hook(lambda *args: calls.append(1))
    assert torch.equal(forward(), after) and calls == [1]  # the hook ran: layer by layer
    handle.remove()
    del target.model.layers[6]  # a ModuleList deletion bumps no registration hook
    stacked = forward()
    target._fused_weights = lambda: None  # the layer-by-layer path
    assert torch.equal(stacked, forward()) and not torch.equal(stacked, after)


def _bound_layer_case(gen):
    """A layer and a call of it through the runtime's bound path (a fresh cache each call)."""
    from eagle_kernels.runtime.layers import layer_step

    layer, cache, x, rope, mask = _layer_case(gen)

    def bound():
        fresh = _fresh(cache)
        return layer(x, rope, fresh, mask, step=layer_step(x, rope, fresh, mask))

    return layer, bound


@needs_cpu_backend
def test_weights_unchanged_block_stamps_once(gen):
    """Inside ops.weights_unchanged a bound layer compares its weights' stamps on first use
    only (the promise is the caller's: a change inside the block runs the old, still held
    weights, never freed memory); the next block sees the change and re-packs."""
    layer, bound = _bound_layer_case(gen)
    with torch.inference_mode():
        before = bound()
    with ops.weights_unchanged():
        with torch.inference_mode():
            assert torch.equal(bound(), before)
        with torch.no_grad():
            layer.mlp.down_proj.weight.mul_(0.5)
            layer.post_attention_layernorm.weight.data = (
                layer.post_attention_layernorm.weight.data * 2)  # new storage, old one held
        with torch.inference_mode():
            assert torch.equal(bound(), before)  # stale by promise
        binding = layer.__dict__["_layer_weights"][0]
        held = {t.data_ptr() for t in binding._held}
        assert binding._pointers[1] in held  # the old post-norm storage the kernel reads
        assert layer.post_attention_layernorm.weight.data_ptr() not in held
        with ops.weights_unchanged(), torch.inference_mode():  # nested: part of the outer one
            assert torch.equal(bound(), before)
    with torch.inference_mode():
        after = bound()
    assert not torch.equal(after, before)
    with ops.weights_unchanged(), torch.inference_mode():
        assert torch.equal(bound(), after)


@needs_cpu_backend
def test_block_memo_binds_each_stack_to_its_own_caches(gen):
    """Inside one weights_unchanged block the target's stack keeps its pointers per (layers,
    caches): a second cache, one of another length and the first one again each run over
    their own K/V (as outside any block, bit for bit). An entry lives only as long as its
    caches (a freed cache's entry goes; an id reused by a new cache never matches), and the
    block's end drops the memo."""
    import gc
    import weakref

    from eagle_kernels.ops._validate import _UNCHANGED
    from runtime_helpers import tiny_target

    target = tiny_target(seed=int(torch.randint(1000, (1,), generator=gen)))
    tokens = torch.randint(0, 300, (1, 2), generator=gen)
    mask = causal_tree_mask(1, 2, torch.device("cpu"))

    def cache_of(max_len, fill):
        cache = target.allocate_cache(1, max_len)
        for t in cache.keys + cache.values:
            t.normal_(generator=fill)
        cache.lens.fill_(5)
        return cache

    def forward(cache):
        positions = cache.lens.to(torch.int64).unsqueeze(1) + torch.arange(2)
        return target(tokens, positions, cache, mask)[0]

    def stacks():
        return sum(key[0] == "stack" for key in _UNCHANGED.memo)

    caches = [cache_of(16, torch.Generator().manual_seed(s)) for s in (1, 2)]
    caches.append(cache_of(24, torch.Generator().manual_seed(3)))
    with torch.inference_mode():
        alone = [forward(_fresh(cache)) for cache in caches]
        assert not torch.equal(alone[0], alone[1])  # the caches' prefixes tell them apart
        gc.disable()  # what is held must go by reference counting alone, not by a collection
        try:
            with ops.weights_unchanged():
                copies = [_fresh(cache) for cache in caches]
                inside = [forward(copy) for copy in copies]
                first_again = [forward(caches[0]), forward(caches[0])]
                kept = stacks()
                held = [weakref.ref(entry[1][1]) for key, entry in _UNCHANGED.memo.items()
                        if key[0] == "stack"]  # the packs and cache storages each entry holds
                del copies
                left, held_left = stacks(), sum(ref() is not None for ref in held)
                again = [forward(_fresh(cache)) for cache in caches]  # new caches, maybe old ids
            held_after = sum(ref() is not None for ref in held)
        finally:
            gc.enable()
    assert all(torch.equal(a, b) for a, b in zip(alone, inside))
    assert all(torch.equal(a, b) for a, b in zip(alone, again))
    assert all(torch.equal(alone[0], other) for other in first_again)
    assert (kept, left, held_left, held_after) == (4, 1, 1, 0)  # one per live cache object
    assert _UNCHANGED.memo == {}


@needs_cpu_backend
def test_block_memo_keeps_no_stack_of_layers_packed_per_call(gen):
    """Layers whose weights are inference tensors (made under torch.inference_mode) re-pack on
    every call, freeing the last call's packs: their stack pointers are not kept, so the
    stack runs over cache A, cache B and cache A again as it does outside a block."""
    from eagle_kernels.ops._validate import _UNCHANGED
    from runtime_helpers import tiny_target

    seed = int(torch.randint(1000, (1,), generator=gen))
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "re-packed on every call"
        target = tiny_target(seed=seed)
        tokens = torch.randint(0, 300, (1, 2), generator=gen)
        mask = causal_tree_mask(1, 2, torch.device("cpu"))
        caches = [target.allocate_cache(1, 16 + 8 * i) for i in range(2)]
        for cache in caches:
            for t in cache.keys + cache.values:
                t.normal_(generator=gen)
            cache.lens.fill_(5)  # a prefix of 5 random keys: each cache gives its own output
        positions = 5 + torch.arange(2).unsqueeze(0)
        alone = [target(tokens, positions, _fresh(c), mask)[0] for c in caches]
        with ops.weights_unchanged():  # the caches themselves: alive through the block
            inside = [target(tokens, positions, caches[i], mask)[0] for i in (0, 1, 0)]
            stacks = [key for key in _UNCHANGED.memo if key[0] == "stack"]
    assert not torch.equal(alone[0], alone[1])
    assert [torch.equal(a, b) for a, b in zip([alone[0], alone[1], alone[0]], inside)] == [True] * 3
    assert stacks == []


@needs_cpu_backend
def test_block_memo_checks_a_linear_once_per_weight_and_request(gen, monkeypatch):
    """Inside a weights_unchanged block ops.linear checks and resolves each (weights, biases,
    kind of x, backend request) once; a new weight object, a forced backend
    (EAGLE_KERNELS_BACKEND) or another x width is looked at again; after the block, every
    call is. A weight changed in place inside the block runs its old pack (the promise is the
    caller's); the next block re-packs."""
    from eagle_kernels.ops import _backend, decoder
    from eagle_kernels.ops._validate import _UNCHANGED

    resolved = []

    def counting(op, *args, **kwargs):
        resolved.append(op)
        return _backend.resolve(op, *args, **kwargs)

    monkeypatch.setattr(decoder, "resolve", counting)
    monkeypatch.delenv(_backend.BACKEND_ENV, raising=False)
    x = torch.randn(3, 16, generator=gen)
    w, b = torch.randn(8, 16, generator=gen), torch.randn(8, generator=gen)
    before = ops.linear(x, w, b)
    with ops.weights_unchanged():
        for _ in range(3):
            assert torch.equal(ops.linear(x, w, b), before)
        assert len(resolved) == 2  # the call before the block and the first inside
        ops.linear(x, w.clone(), b)
        ops.linear(x[:, :8].contiguous(), w[:, :8].contiguous())
        assert len(resolved) == 4
        monkeypatch.setenv(_backend.BACKEND_ENV, "torch")
        forced = ops.linear(x, w, b)
        assert len(resolved) == 5
        assert torch.allclose(forced, torch.nn.functional.linear(x, w, b), rtol=0, atol=0)
        monkeypatch.delenv(_backend.BACKEND_ENV)
        with torch.no_grad():
            w.mul_(2)
        assert torch.equal(ops.linear(x, w, b), before)  # stale by promise
        temporary = torch.randn(8, 16, generator=gen)
        ops.linear(x, temporary)
        entries = len(_UNCHANGED.memo)
        del temporary  # its check and its pack go with it
        assert len(_UNCHANGED.memo) == entries - 2
    assert len(resolved) == 6
    assert torch.equal(ops.linear(x, w, b), ops.linear(x, w.clone(), b))  # re-packed
    assert not torch.equal(ops.linear(x, w, b), before)


@needs_cpu_backend
def test_weights_unchanged_block_rechecks_after_a_failed_check(gen):
    """A check that fails inside a block fails again on the next call (the layer is not marked
    checked), and the weights that pass it next are the ones that run."""
    layer, bound = _bound_layer_case(gen)
    with torch.inference_mode():
        before = bound()
    down = layer.mlp.down_proj.weight
    # Kept alive: a new storage at the freed one's address with an equal version counter would
    # look unchanged (a .data write bumps neither, see LayerWeights.kernel_pointers).
    original = down.data
    with ops.weights_unchanged():
        with torch.no_grad():
            down.data = torch.randn(64, 95)  # a size the kernel would read wrongly
        for _ in range(2):
            with torch.inference_mode(), pytest.raises(ValueError, match="down"):
                bound()
        with torch.no_grad():
            down.data = torch.randn(64, 96)
        with torch.inference_mode():
            assert not torch.equal(bound(), before)
    assert original.shape == (64, 96)
