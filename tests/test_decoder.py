"""Decoder-layer ops (linear, rms_norm, silu_mul, apply_rope): every backend against the fp64
reference, row invariance of the cpu kernels on every instruction set this processor has, and
clear errors for bad input."""

import functools
import warnings

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.runtime.drafting import causal_tree_mask
from eagle_kernels.runtime.layers import layer_step
from eagle_kernels.ops import reference
from eagle_kernels.ops._validate import no_value_checks

from conftest import assert_as_close_as_torch
from cpu_support import (each_cpu_isa, needs_cpu_backend, q4_exact_layers, q4_exact_weight,
                         q8_exact_weight)


LINEAR_SHAPES = [(1, 576, 1536), (16, 576, 192), (61, 1536, 576), (5, 577, 13), (4, 576, 1000),
                 (6, 33, 50), (3, 5, 7), (1, 1, 1), (2, 33, 0), (0, 8, 4)]


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", LINEAR_SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_cpu_matches_reference(gen, rows, width, out, bias):
    x = torch.randn(rows, width, generator=gen)
    w = torch.randn(out, width, generator=gen)
    b = torch.randn(out, generator=gen) if bias else None
    exact = reference.linear_group(x.double(), [w.double()], [None if b is None else b.double()])[0]
    for isa in each_cpu_isa():
        ours = ops.linear(x, w, b, backend="cpu")
        assert ours.shape == (rows, out) and ours.dtype == torch.float32, isa
        assert_as_close_as_torch(ours, torch.nn.functional.linear(x, w, b), exact)


@needs_cpu_backend
def test_linear_group_is_one_linear_per_weight(gen):
    x = torch.randn(2, 7, 64, generator=gen)
    weights = [torch.randn(n, 64, generator=gen) for n in (40, 8, 8)]
    biases = [torch.randn(40, generator=gen), None, torch.randn(8, generator=gen)]
    for isa in each_cpu_isa():
        group = ops.linear_group(x, weights, biases, backend="cpu")
        for y, w, b in zip(group, weights, biases):
            assert y.shape == (2, 7, w.shape[0]), isa
            assert torch.equal(y, ops.linear(x, w, b, backend="cpu")), isa


@needs_cpu_backend
@pytest.mark.parametrize("op", ["linear", "linear_bf16_pack", "rms_norm", "silu_mul",
                                "apply_rope"])
def test_cpu_rows_do_not_depend_on_their_neighbours(gen, op):
    """Row invariance: each row computed alone equals, bit for bit, the same row computed among
    up to 80 others, whatever its place, on every instruction set (linear: every tiling, up to
    and past the row groups' 64 rows, over fp32 and bf16 packs)."""
    width, most = 576, 80
    x = torch.randn(most, width, generator=gen)
    w = torch.randn(200, width, generator=gen)
    if op == "linear_bf16_pack":  # every element a bf16 value: packed in bf16
        w = w.bfloat16().float()
    norm_weight = torch.randn(width, generator=gen)
    up = torch.randn(most, width, generator=gen)
    cos, sin = torch.randn(300, 64, generator=gen), torch.randn(300, 64, generator=gen)
    positions = torch.randint(0, 300, (1, most), generator=gen)

    def run(rows):
        if op.startswith("linear"):
            return ops.linear(x[rows], w, backend="cpu")
        if op == "rms_norm":
            return ops.rms_norm(x[rows], norm_weight, 1e-5, residual=up[rows], backend="cpu")[0]
        if op == "silu_mul":
            return ops.silu_mul(x[rows], up[rows], backend="cpu")
        heads = x[rows].view(1, -1, 9, 64)
        return ops.apply_rope(heads, positions[:, rows].contiguous(), cos, sin, backend="cpu")[0]

    for isa in each_cpu_isa():
        for count in (1, 2, 3, 4, 5, 6, 7, 13, 16, 37, 64, 65, 80):
            rows = torch.randperm(most, generator=gen)[:count]
            together = run(rows)
            for place in range(count):
                alone = run(rows[place:place + 1])
                assert torch.equal(alone.reshape(together[place].shape), together[place]), \
                    (isa, count, place)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width", [(1, 576), (7, 577), (3, 1), (0, 16)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_cpu_matches_reference(gen, rows, width, with_residual):
    x = torch.randn(rows, width, generator=gen) * 3
    weight = torch.randn(width, generator=gen)
    residual = torch.randn(rows, width, generator=gen) if with_residual else None
    exact = reference.rms_norm(x.double(), weight.double(), 1e-6,
                               None if residual is None else residual.double())
    torch_low = reference.rms_norm(x, weight, 1e-6, residual)
    for isa in each_cpu_isa():
        ours = ops.rms_norm(x, weight, 1e-6, residual=residual, backend="cpu")
        if with_residual:
            assert torch.equal(ours[1], torch_low[1]), isa  # x + residual: one exact add
            ours, exact_y, torch_y = ours[0], exact[0], torch_low[0]
        else:
            exact_y, torch_y = exact, torch_low
        assert_as_close_as_torch(ours, torch_y, exact_y)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width", [(1, 1536), (5, 1537), (2, 3)])
def test_silu_mul_cpu_matches_reference(gen, rows, width):
    gate = torch.randn(rows, width, generator=gen) * 8
    gate[0, :3] = torch.tensor([-100.0, 100.0, 0.0])[: min(3, width)]  # saturated and zero
    up = torch.randn(rows, width, generator=gen)
    exact = reference.silu_mul(gate.double(), up.double())
    for isa in each_cpu_isa():
        assert_as_close_as_torch(ops.silu_mul(gate, up, backend="cpu"),
                                 reference.silu_mul(gate, up), exact)


@needs_cpu_backend
@pytest.mark.parametrize("heads,dim", [(9, 64), (2, 80), (1, 2), (4, 128)])
def test_apply_rope_cpu_is_the_reference_bit_for_bit(gen, heads, dim):
    x = torch.randn(2, 5, heads, dim, generator=gen)
    positions = torch.randint(0, 50, (2, 5), generator=gen)
    cos, sin = torch.randn(50, dim, generator=gen), torch.randn(50, dim, generator=gen)
    expected = reference.apply_rope(x, positions, cos, sin)
    for isa in each_cpu_isa():
        assert torch.equal(ops.apply_rope(x, positions, cos, sin, backend="cpu"), expected), isa


@needs_cpu_backend
def test_apply_rope_cpu_stays_in_bounds_for_out_of_range_positions(gen):
    """Positions outside the table are a caller bug: refused with value checks on (every
    backend), and with checks off the cpu kernel clamps them (no OOB read)."""
    x = torch.randn(1, 3, 2, 8, generator=gen)
    cos, sin = torch.randn(4, 8, generator=gen), torch.randn(4, 8, generator=gen)
    positions = torch.tensor([[-5, 2, 1000]])
    for backend in ("cpu", "torch"):
        with pytest.raises(ValueError, match=r"positions: expected values in \[0, 4\)"):
            ops.apply_rope(x, positions, cos, sin, backend=backend)
    with no_value_checks():
        out = ops.apply_rope(x, positions, cos, sin, backend="cpu")
    clamped = reference.apply_rope(x, positions.clamp(0, 3), cos, sin)
    assert torch.equal(out, clamped)


def test_torch_backend_handles_low_precision(gen):
    x = torch.randn(3, 32, generator=gen).to(torch.bfloat16)
    w = torch.randn(8, 32, generator=gen).to(torch.bfloat16)
    assert ops.linear(x, w).dtype == torch.bfloat16  # auto falls back to torch for bf16
    with pytest.raises(ValueError, match="float32"):
        ops.linear(x, w, backend="cpu")


@pytest.mark.parametrize("call,message", [
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 5)), r"weights\[0\]: expected shape"),
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 4).double()), "dtype"),
    (lambda: ops.linear(torch.randn(4, 2).t(), torch.randn(3, 4)), "contiguous"),
    (lambda: ops.linear_group(torch.randn(2, 4), []), "weights"),
    (lambda: ops.linear_group(torch.randn(2, 4), [torch.randn(3, 4)], [None, None]), "biases"),
    (lambda: ops.linear(torch.randn(2, 4), torch.randn(3, 4), torch.randn(4)), "biases"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(5), 1e-6), "weight"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), -1.0), "eps"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), True), "eps"),
    (lambda: ops.rms_norm(torch.randn(2, 4), torch.randn(4), 1e-6, torch.randn(3, 4)), "residual"),
    (lambda: ops.silu_mul(torch.randn(2, 4), torch.randn(2, 5)), "up"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 3), torch.zeros(1, 2, dtype=torch.int64),
                            torch.randn(4, 3), torch.randn(4, 3)), r"\[B, T, H, D\]"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 1, 4), torch.zeros(1, 2, dtype=torch.int32),
                            torch.randn(4, 4), torch.randn(4, 4)), "positions"),
    (lambda: ops.apply_rope(torch.randn(1, 2, 1, 4), torch.zeros(1, 2, dtype=torch.int64),
                            torch.randn(4, 4), torch.randn(5, 4)), "sin"),
])
def test_bad_input_raises_naming_the_argument(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


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


def _narrow_pack_gives_the_fp32_bits(monkeypatch, x, exact, pack_dtype, flag: str) -> None:
    """``exact`` packs as ``pack_dtype``, the same weight with one value moved off the grid
    packs in fp32, and ops.linear over the narrow pack equals it over the fp32 pack
    (``decoder.<flag>`` off) bit for bit on every instruction set."""
    from eagle_kernels.ops import decoder

    assert decoder.pack_weight(exact).dtype == pack_dtype
    inexact = exact.clone()
    inexact[exact.shape[0] // 2, exact.shape[1] // 2] += 2.0**-20
    assert decoder.pack_weight(inexact).dtype == torch.float32
    for isa in each_cpu_isa():
        ours = ops.linear(x, exact.clone(), backend="cpu")
        with monkeypatch.context() as patch:
            patch.setattr(decoder, flag, False)
            fp32_pack = ops.linear(x, exact.clone(), backend="cpu")
        assert torch.equal(ours, fp32_pack), isa


def _block_pack_contract(x, exact, pack_dtype, levels, scales, offsets) -> None:
    """``exact`` [N, K] packs as ``pack_dtype`` (one value moved off the grid: fp32), and
    ops.linear over the block pack (decoder_linear.h "block packs": per block of 32 k, S = sum x L in
    an FMA chain, X = sum x, T = fma(d, S, fma(o, X, T))) is, on every instruction set:
    row-invariant (each row equals its one-row GEMM: every GEMM path agrees), the same bits on
    every instruction set, and within the worst-case rounding error of that formula of the exact
    product: a term d x L passes through at most 32 roundings in S, one in its block's outer fma
    and 2 per later block; a term o x at most 31 in X, 2 in its block and 2 per later block: at
    most 32 + 2 B (B = K / 32 blocks), so |y - x w^T| <= gamma_(32 + 2B) * sum_k |x_k|
    (|d| |L_k| + |o|) with gamma_n = n u / (1 - n u), u = 2^-24 (a proven bound: no false
    failure). ``levels`` [N, K], ``scales`` / ``offsets`` [N, K / 32] are the weight's L, d, o."""
    from eagle_kernels.ops import decoder

    assert decoder.pack_weight(exact).dtype == pack_dtype
    inexact = exact.clone()
    inexact[exact.shape[0] // 2, exact.shape[1] // 2] += 2.0**-20
    assert decoder.pack_weight(inexact).dtype == torch.float32
    per_k = (scales.abs().repeat_interleave(32, 1) * levels.abs()
             + offsets.abs().repeat_interleave(32, 1)).double()
    terms = 32 + 2 * (exact.shape[1] // 32)
    bound = terms * 2.0**-24 / (1 - terms * 2.0**-24) * (x.double().abs() @ per_k.T)
    exact_product = x.double() @ exact.double().T
    results = []
    for isa in each_cpu_isa():
        ours = ops.linear(x, exact.clone(), backend="cpu")
        one_row = torch.cat([ops.linear(x[i:i + 1], exact.clone(), backend="cpu")
                             for i in range(x.shape[0])])
        assert torch.equal(ours, one_row), isa
        assert ((ours.double() - exact_product).abs() <= bound).all(), isa
        results.append(ours)
    assert all(torch.equal(results[0], other) for other in results[1:])


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 300, 40), (3, 576, 100),
                                            (4, 577, 37), (5, 64, 16), (9, 96, 37),
                                            (13, 64, 40), (61, 1536, 200), (70, 96, 33)])
def test_bf16_exact_weights_pack_in_bf16_with_the_fp32_packs_bits(gen, monkeypatch, rows, width,
                                                                  out):
    """A weight whose every element is a bf16 value (a bf16 checkpoint run in fp32) is packed in
    bf16, half the bytes, and gives the fp32 pack's results bit for bit, on every instruction
    set; any other weight keeps an fp32 pack."""
    x = torch.randn(rows, width, generator=gen)
    exact = torch.randn(out, width, generator=gen).bfloat16().float()
    _narrow_pack_gives_the_fp32_bits(monkeypatch, x, exact, torch.bfloat16, "PACK_BF16_EXACT")


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 576, 100),
                                            (5, 96, 37), (6, 576, 100), (9, 96, 37),
                                            (13, 64, 16), (61, 1536, 200), (70, 96, 33)])
def test_q4_exact_weights_pack_in_4_bits_and_sum_in_blocks(gen, rows, width, out):
    """A weight whose every block of 32 k is exactly a GGUF Q4_1 block (d * q + m, fp16 d and
    m) is packed in 4 bits plus its scales, and its GEMM keeps the block-pack contract
    (_block_pack_contract) on every instruction set and every GEMM path (one row, one row tile,
    row groups, widened blocks: which row counts take which path differs per instruction set,
    see decoder_linear.h); a weight with one other value, or K not a multiple of 32, keeps a wider
    pack."""
    from eagle_kernels.ops import decoder

    x = torch.randn(rows, width, generator=gen)
    exact = q4_exact_weight(gen, out, width)
    packed = decoder.pack_weight(exact)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-out // 16) * width // 32 * 384
    q, d, m = decoder.q4_blocks(exact)
    assert int(q.max()) <= 15 and torch.equal(d.half().float(), d)
    assert decoder.pack_weight(exact[:, :width - 1].contiguous()).dtype != torch.uint8
    zero = decoder.Q4_ZERO_LEVEL
    _block_pack_contract(x, exact, torch.uint8, q.float() - zero, d, m + zero * d)


@needs_cpu_backend
@pytest.mark.parametrize("rows,width,out", [(1, 576, 1000), (2, 64, 40), (3, 96, 37),
                                            (6, 576, 100), (9, 96, 37), (13, 64, 16),
                                            (70, 96, 33)])
def test_q8_exact_weights_pack_in_8_bits_and_sum_in_blocks(gen, rows, width, out):
    """A weight whose every block of 32 k is exactly a GGUF Q8_0 block (d * q, fp16 d, the
    default target's tied embedding / lm_head) is packed in 8 bits plus its scales, and its
    GEMM keeps the block-pack contract (o = 0) on every instruction set and GEMM path; one
    changed value keeps an fp32 pack."""
    from eagle_kernels.ops import decoder

    x = torch.randn(rows, width, generator=gen)
    exact = q8_exact_weight(gen, out, width)
    packed = decoder.pack_weight(exact)
    assert packed.dtype == torch.int8 and packed.numel() == -(-out // 16) * width // 32 * 576
    assert decoder.q8_blocks(torch.randn(16, 64, generator=gen)) is None
    q, d = decoder.q8_blocks(exact)
    _block_pack_contract(x, exact, torch.int8, q.float(), d, torch.zeros_like(d))


@needs_cpu_backend
def test_q4_pack_layout_is_the_kernels(gen):
    """The packer's zero level (ops/decoder.py Q4_ZERO_LEVEL) is the kernels' (kernels.h
    kQ4ZeroLevel), and a pack's block holds d[16], o[16] = m + 8 d, then 16 row pairs of 16 bytes,
    byte j holding column j's q of the even row in its low nibble and of the odd row in its
    high nibble (decoder_linear.h "block packs", simd.h vq4_level_pair)."""
    from eagle_kernels import _cpu
    from eagle_kernels.ops import decoder

    assert decoder.Q4_ZERO_LEVEL == _cpu.Q4_ZERO_LEVEL == 8
    exact = q4_exact_weight(gen, 16, 32)
    q, d, m = decoder.q4_blocks(exact)
    block = decoder.pack_q4_exact(exact)[0, 0]
    assert torch.equal(block[:64].view(torch.float32), d[:, 0])
    assert torch.equal(block[64:128].view(torch.float32), m[:, 0] + 8 * d[:, 0])
    pairs = block[128:].view(16, 16)  # [row pair, column]
    assert torch.equal(pairs & 15, q[:, 0::2].T) and torch.equal(pairs >> 4, q[:, 1::2].T)


@needs_cpu_backend
def test_q4_block_that_rounds_keeps_a_wider_pack(gen, monkeypatch):
    """A block pack's GEMM works with the exact d q + m (decoder_linear.h "block packs"), so a
    Q4_1 block whose fp32 values are d q + m rounded must not be packed in 4 bits: d = 1 + 2^-10
    beside m = 32768 (d q + m needs up to 26 significant bits; m + 8 d is exact, so only the
    values tell), and m = 2^-24 beside d = 1 (m + 8 d rounds too). The wider pack gives the fp32
    pack's results bit for bit."""
    from eagle_kernels.ops import decoder

    x = torch.randn(3, 64, generator=gen)
    for d, m in ((1 + 2.0**-10, 32768.0), (1.0, 2.0**-24)):
        exact = q4_exact_weight(gen, 16, 64)
        q = torch.arange(32.0) % 16
        exact[5, :32] = q * d + m  # fp32: d q exact, + m rounded
        assert not torch.equal(exact[5, :32].double(), q.double() * d + m)
        assert decoder.q4_blocks(exact) is None
        assert decoder.pack_weight(exact).dtype != torch.uint8
        ours = ops.linear(x, exact.clone(), backend="cpu")
        with monkeypatch.context() as patch:
            for flag in ("PACK_Q4_EXACT", "PACK_Q8_EXACT", "PACK_BF16_EXACT"):
                patch.setattr(decoder, flag, False)
            assert torch.equal(ours, ops.linear(x, exact.clone(), backend="cpu"))


def test_q4_q8_recovery_in_row_chunks_equals_the_whole(gen, monkeypatch):
    """Large weights are recovered RECOVERY_CHUNK_ROWS rows at a time (bounded temporaries):
    the same (q, d, m) as in one piece, and one off-grid value in a later chunk refuses all."""
    from eagle_kernels.ops import decoder

    for exact, recover in ((q4_exact_weight(gen, 300, 64), decoder.q4_blocks),
                           (q8_exact_weight(gen, 300, 64), decoder.q8_blocks)):
        whole = recover(exact)
        with monkeypatch.context() as patch:
            patch.setattr(decoder, "RECOVERY_CHUNK_ROWS", 70)
            chunked = recover(exact)
            broken = exact.clone()
            broken[290, 3] += 2.0**-20
            assert recover(broken) is None
        assert all(torch.equal(a, b) for a, b in zip(whole, chunked))


def test_q4_recovery_refuses_what_is_not_exactly_q4(gen):
    """Random fp32 values, non-finite values and a negative zero where d * 0 + m gives +0 are
    not Q4_1 blocks: no 4-bit pack (its weights would not be the tensor's)."""
    from eagle_kernels.ops import decoder

    assert decoder.q4_blocks(torch.randn(16, 64, generator=gen)) is None
    exact = q4_exact_weight(gen, 16, 64)
    for bad in (float("nan"), float("inf")):
        broken = exact.clone()
        broken[3, 5] = bad
        assert decoder.q4_blocks(broken) is None
    zeros = torch.zeros(16, 64)
    zeros[2, 7] = -0.0
    assert decoder.q4_blocks(zeros) is None
    assert decoder.q4_blocks(torch.zeros(16, 64)) is not None  # d = 0, q = 0, m = 0


def _narrow_packs_run_the_fp32_bits(gen, monkeypatch, flag: str, convert) -> None:
    """A tiny target whose weights ``convert`` makes exactly representable in a narrow pack
    gives the same hidden states and K/V with ``decoder.<flag>`` on (narrow packs) and off
    (fp32 packs), bit for bit."""
    from runtime_helpers import tiny_target

    from eagle_kernels.ops import decoder

    seed = int(torch.randint(1000, (1,), generator=gen))
    tokens = torch.randint(0, 300, (2, 5), generator=gen)
    mask = ops.pack_tree_mask(torch.tril(torch.ones(2, 5, 5, dtype=torch.bool)))
    results = []
    for narrow in (True, False):
        target = tiny_target(seed=seed)
        with torch.no_grad():
            convert(target)
        cache = target.allocate_cache(2, 16)
        positions = torch.arange(5).repeat(2, 1)
        with monkeypatch.context() as patch, torch.inference_mode():
            patch.setattr(decoder, flag, narrow)
            hidden, _ = target(tokens, positions, cache, mask)
            packed = decoder._PACKS.get(target.model.layers[0].mlp.down_proj.weight)
            assert (packed.dtype != torch.float32) == narrow
        results.append((hidden, cache))
    (h1, c1), (h2, c2) = results
    assert torch.equal(h1, h2)
    assert all(torch.equal(a, b) for a, b in zip(c1.keys + c1.values, c2.keys + c2.values))


@needs_cpu_backend
def test_bf16_exact_target_runs_the_fp32_bits(gen, monkeypatch):
    """The fused layers over bf16 packs (a bf16 checkpoint loaded in fp32) give the hidden states
    and K/V of the same layers over fp32 packs, bit for bit."""
    def to_bf16(target):
        for parameter in target.parameters():
            parameter.copy_(parameter.bfloat16().float())

    _narrow_packs_run_the_fp32_bits(gen, monkeypatch, "PACK_BF16_EXACT", to_bf16)


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
