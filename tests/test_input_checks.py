"""Bad arguments to the public ops and the runtime API get a clear error naming the argument
(or, for sizes that are legal, the reference's result): the cases an audit of the public
surface found silent, wrong or failing deep inside torch."""

import math

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import reference
from eagle_kernels.ops._validate import check_eps, check_positive

from cpu_support import needs_cpu_backend


@needs_cpu_backend
def test_linear_of_width_zero_is_the_bias_on_every_backend():
    """K = 0: every output is its bias (zero without one); the cpu path returned uninitialised
    memory before."""
    x, w, bias = torch.randn(2, 0), torch.randn(3, 0), torch.tensor([1.0, 2.0, 3.0])
    for backend in ("cpu", "torch"):
        assert torch.equal(ops.linear(x, w, bias, backend=backend), bias.expand(2, 3))
        assert torch.equal(ops.linear(x, w, backend=backend), torch.zeros(2, 3))


def test_compact_kv_refuses_negative_cache_lens():
    cache = torch.arange(8.0).view(1, 8, 1, 1)
    args = (torch.tensor([-2], dtype=torch.int32), torch.tensor([[0, 3]], dtype=torch.int32),
            torch.tensor([1], dtype=torch.int32))
    for backend in ("cpu", "torch"):
        with pytest.raises(ValueError, match=r"cache_lens: expected values in \[0, 9\)"):
            ops.compact_kv([cache.clone()], *args, backend=backend)


@pytest.mark.parametrize("name,value,error", [
    ("temperature", math.nan, ValueError), ("temperature", math.inf, ValueError),
    ("top_p", math.nan, ValueError), ("top_k", 2.5, TypeError), ("temperature", "0.5", TypeError)])
def test_sampling_parameters_refuse_nan_and_wrong_types(name, value, error):
    """NaN passed `temperature <= 0` (every comparison with NaN is False): all-NaN probs."""
    with pytest.raises(error, match=name):
        ops.target_probs(torch.randn(2, 10), **{name: value})


@pytest.mark.parametrize("name", ["temperature", "top_p"])
def test_sampling_tensors_refuse_a_nan_entry(name):
    with pytest.raises(ValueError, match=name):
        ops.target_probs(torch.randn(2, 10), **{name: torch.tensor([0.5, math.nan])})


def test_float_scalars_refuse_nan_inf_and_non_numbers():
    for check in (check_eps, check_positive):
        for bad in (math.nan, math.inf, -1.0):
            with pytest.raises(ValueError, match="eps"):
                check("eps", bad)
        for bad in ("1e-6", True, torch.tensor(1e-6)):
            with pytest.raises(TypeError, match="eps"):
                check("eps", bad)
    assert check_eps("eps", 0) == 0.0 and check_positive("scale", 2) == 2.0
    with pytest.raises(ValueError, match="eps"):
        check_positive("eps", 0.0)


def test_tree_attention_refuses_bad_scales_and_zero_head_dim():
    q = torch.randn(1, 1, 2, 8)
    k = v = torch.randn(1, 4, 2, 8)
    lens, mask = torch.tensor([2], dtype=torch.int32), torch.ones(1, 1, 1, dtype=torch.int32)
    for scale, error in ((math.nan, ValueError), (True, TypeError), (-0.5, ValueError)):
        with pytest.raises(error, match="sm_scale"):
            ops.tree_attention(q, k, v, lens, mask, sm_scale=scale)
    empty = torch.randn(1, 4, 2, 0)
    with pytest.raises(ValueError, match="head_dim"):
        ops.tree_attention(torch.randn(1, 1, 2, 0), empty, empty, lens, mask)


@needs_cpu_backend
def test_max_depth_is_bounded_and_empty_batches_are_fine():
    parents = torch.tensor([[-1, 0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="max_depth"):
        ops.build_tree(parents, max_depth=10**15)
    scores = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="max_depth"):
        ops.eagle2_rerank(torch.zeros(1, dtype=torch.int64), torch.zeros(1, 2, dtype=torch.int64),
                          scores, torch.tensor([[-1, -1]], dtype=torch.int32), 3,
                          max_depth=10**15)
    assert ops.build_tree(parents, max_depth=40)[2].shape == (1, 3, 41)  # padding is allowed
    for backend in ("cpu", "torch"):
        depth, mask, paths = ops.build_tree(parents[:0], backend=backend)
        assert depth.shape == (0, 3) and mask.shape == (0, 3, 1) and paths.shape == (0, 3, 3)
    result = ops.stochastic_accept_tree(torch.zeros(0, 3, dtype=torch.int64), parents[:0],
                                        torch.randn(0, 3, 16), torch.rand(0, 3), torch.rand(0))
    assert result.num_accepted.shape == (0,)


def test_greedy_accept_tree_refuses_an_empty_path_list():
    tokens = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"paths.shape\[1\]"):
        ops.greedy_accept_tree(tokens, torch.zeros(1, 0, 3, dtype=torch.int32),
                               torch.randn(1, 3, 10))


def test_ops_name_a_tensor_on_a_device_they_cannot_run_on():
    # a meta tensor used to reach torch's "Tensor.item() cannot be called on meta tensors"
    meta = dict(device="meta")
    cases = [
        (lambda: ops.build_tree(torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32, **meta)),
         "parents"),
        (lambda: ops.rms_norm(torch.zeros(2, 8, **meta), torch.ones(8), 1e-6), "x"),
        (lambda: ops.greedy_accept_chain(torch.zeros(1, 3, dtype=torch.int64, **meta),
                                         torch.zeros(1, 3, 10, **meta)), "tokens"),
        (lambda: ops.topk_log_softmax(torch.zeros(2, 10, **meta), 3), "logits"),
    ]
    for call, name in cases:
        with pytest.raises(ValueError, match=f"{name}: expected a tensor on cpu or cuda, got "
                                             f"one on meta"):
            call()


def test_pack_and_unpack_tree_mask_check_their_arguments():
    with pytest.raises(ValueError, match="dense: expected dtype bool"):
        ops.pack_tree_mask(torch.tensor([[2, 0, 0]]))  # was packed as key 1 visible
    with pytest.raises(ValueError, match="dense"):
        ops.pack_tree_mask(torch.tensor(True))
    with pytest.raises(TypeError, match="dense"):
        ops.pack_tree_mask([[True]])
    words = ops.pack_tree_mask(torch.tensor([[True, False, True]]))
    assert torch.equal(ops.unpack_tree_mask(words, 3), torch.tensor([[True, False, True]]))
    for keys in (-1, 33):
        with pytest.raises(ValueError, match=r"num_keys: expected an int in \[0, 32\]"):
            ops.unpack_tree_mask(words, keys)
    assert torch.equal(ops.pack_tree_mask(torch.zeros(2, 40, dtype=torch.bool)),
                       reference.pack_tree_mask(torch.zeros(2, 40, dtype=torch.bool)))


# ------------------------------------------------------------------------------- runtime API


def test_tree_config_is_bounded_and_takes_ints_only():
    """An unbounded tree from the CLI (1000000,1000000,1000000) grew to 24 GB before the OOM
    killer stopped it; a bool passed as an int."""
    from eagle_kernels.runtime.drafting import TREE_MAX_TOKENS, TREE_MAX_TOP_K, TreeConfig

    for kwargs in ({"top_k": TREE_MAX_TOP_K + 1}, {"depth": TREE_MAX_TOKENS + 1},
                   {"total_tokens": TREE_MAX_TOKENS + 1}, {"top_k": 0}, {"depth": -1}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            TreeConfig(**{"top_k": 4, "depth": 2, "total_tokens": 8, **kwargs})
    with pytest.raises(TypeError, match="top_k: expected an int, got bool"):
        TreeConfig(True, 1, 2)
    assert TreeConfig(TREE_MAX_TOP_K, 1, 8).total_tokens == 8


@pytest.mark.parametrize("kwargs,error,match", [
    ({"temperature": "0.5"}, TypeError, "temperature"), ({"temperature": math.nan}, ValueError,
                                                         "temperature"),
    ({"top_p": "0.9"}, TypeError, "top_p"), ({"top_k": 10**30}, ValueError, "top_k"),
    ({"top_k": True}, TypeError, "top_k"), ({"seed": "abc"}, TypeError, "seed"),
    ({"seed": 1.5}, TypeError, "seed"), ({"seed": 2**70}, ValueError, "seed")])
def test_sampling_config_names_the_bad_setting(kwargs, error, match):
    from eagle_kernels.runtime.generation import SamplingConfig

    with pytest.raises(error, match=match):
        SamplingConfig(**kwargs)


def test_prompts_and_load_arguments_are_checked_before_anything_loads(tmp_path):
    from eagle_kernels.runtime.api import _check_load_args, _prompt_list

    assert _prompt_list(("a", "b")) == ["a", "b"]
    for prompts, match in ((123, "prompts: expected a str or a sequence"),
                           (b"Hi", "prompts: expected a str or a sequence"),
                           (["a", None], r"prompts\[1\]: expected a str, got NoneType")):
        with pytest.raises(TypeError, match=match):
            _prompt_list(prompts)
    for kwargs, error, match in (
            ({"target": str(tmp_path / "absent")}, ValueError, "target: .*no such file"),
            ({"target": 12}, TypeError, "target: expected a path"),
            ({"device": "gpu"}, ValueError, "device: expected cpu, cuda or cuda:N"),
            ({"device": "meta"}, ValueError, "device: expected cpu, cuda or cuda:N"),
            ({"device": 1.5}, TypeError, "device: expected a str"),
            ({"dtype": "float32"}, TypeError, "dtype: expected a torch.dtype"),
            ({"dtype": torch.float64}, ValueError, "dtype: expected one of")):
        args = {"target": None, "dtype": torch.float32, "device": "cpu", **kwargs}
        with pytest.raises(error, match=match):
            _check_load_args(args["target"], args["dtype"], args["device"])
    assert _check_load_args(None, torch.float32, "cpu") == torch.device("cpu")


def test_token_lists_refuse_floats_and_strings_instead_of_truncating():
    """Engine.generate([[1.7, 2.2]]) ran prompt [1, 2]; eos_token_ids="2" failed in torch."""
    import numpy as np

    from eagle_kernels.runtime.generation import _token_list

    assert _token_list("p", [1, 2]) == [1, 2] and _token_list("p", (3,)) == [3]
    assert _token_list("p", torch.tensor([4, 5])) == [4, 5]
    assert _token_list("p", np.array([6, 7])) == [6, 7]
    assert _token_list("eos", {2}, ordered=False) == [2]  # a set only where order is no matter
    assert _token_list("p", list(torch.tensor([8, 9]))) == [8, 9]  # 0-d integer tensors
    for ids, error, match in (([1.7, 2.2], TypeError, r"p\[0\]: expected an int token id"),
                              ("2", TypeError, "p: expected a sequence of token ids"),
                              ([True], TypeError, r"p\[0\]"),
                              (np.array([1.5]), TypeError, r"p\[0\]"),
                              (torch.tensor([1.0]), ValueError, "1-D integer tensor"),
                              (torch.tensor([True]), ValueError, "1-D integer tensor")):
        with pytest.raises(error, match=match):
            _token_list("p", ids)


def test_decoder_step_and_from_hf_name_wrong_types():
    from eagle_kernels.ops.layer import DecoderStep
    from eagle_kernels.runtime.hf import from_hf

    def step(**change):
        args = dict(batch=1, count=1, positions=torch.zeros(1, 1, dtype=torch.int64),
                    cos=torch.ones(4, 8), sin=torch.ones(4, 8), cache_shape=(1, 4, 1, 8),
                    cache_lens=torch.zeros(1, dtype=torch.int32),
                    tree_mask=torch.ones(1, 1, 1, dtype=torch.int32), tree_offset=0,
                    dtype=torch.float32, device="cpu")
        return DecoderStep(**{**args, **change})

    step()
    for change, match in (({"batch": "1"}, "batch: expected an int"),
                          ({"cache_shape": None}, "cache_shape")):
        with pytest.raises(TypeError, match=match):
            step(**change)
    for kwargs, error, match in (({"tokenizer": None}, TypeError, "tokenizer"),
                                 ({"dtype": "float32"}, TypeError, "dtype: expected a torch"),
                                 ({"device": "gpu"}, ValueError, "device: expected")):
        args = {"model": torch.nn.Linear(1, 1), "tokenizer": lambda text: text, **kwargs}
        with pytest.raises(error, match=match):
            from_hf(**args)


def test_engine_settings_and_call_inputs_name_themselves():
    """An engine's settings are read when a call starts, and a wrong one failed deep inside
    (tree="auto": "'str' object has no attribute 'max_depth'"; a head made for another target
    drafted with that target's tables); prompts and EOS ids name the entry that came
    (generate(5): "'int' object is not iterable"; an EOS id of 2**63: torch's overflow)."""
    from eagle_kernels.runtime import Engine
    from eagle_kernels.runtime.draft_heads import EAGLE3, new_draft_head

    from runtime_helpers import tiny_target

    target = tiny_target()
    engine = Engine(target, new_draft_head(EAGLE3, target))
    vocab = target.vocab_size
    for setting, value, error, match in (
            ("tree", "auto", TypeError, "tree: expected a TreeConfig, got str"),
            ("tree_policy", "auto", TypeError, "tree_policy: expected an AdaptiveTree"),
            ("prompt_lookup", "no", TypeError, "prompt_lookup: expected a bool, got str"),
            ("cuda_graphs", 0, TypeError, "cuda_graphs: expected a bool, got int"),
            ("head", new_draft_head(EAGLE3, tiny_target(seed=1)), ValueError,
             "head: expected a head loaded for this engine's target"),
            ("head", "eagle", TypeError, "head: expected a DraftHead or None")):
        saved = getattr(engine, setting)
        setattr(engine, setting, value)
        with pytest.raises(error, match=match):
            engine.generate([[1, 2]], 2)
        setattr(engine, setting, saved)
    for prompts, eos, error, match in (
            (5, [0], TypeError, "prompts: expected a sequence of token lists, got int"),
            (None, [0], TypeError, "prompts: expected a sequence of token lists, got NoneType"),
            ([[1, 2], [3, vocab]], [0], ValueError,
             rf"prompts\[1\]: expected token ids in \[0, {vocab}\), got {vocab} at index 1"),
            ([[1, 2]], [2**63], ValueError, f"eos_token_ids: expected token ids in .*got {2**63}"),
            ([[1, 2]], [vocab], ValueError, "eos_token_ids: expected token ids in")):
        with pytest.raises(error, match=match):
            engine.generate(prompts, 2, eos_token_ids=eos)
    assert engine.generate([[1, 2]], 2).tokens  # the settings restored: a call runs
    import numpy as np

    for prompts in (torch.tensor([[1, 2]]), np.array([[1, 2]]), ([1, 2],)):  # rows of ids
        assert engine.generate(prompts, 2, speculative=False).tokens


def test_generator_eos_ids_are_those_the_target_can_produce():
    """A tokenizer paired with another model (from_hf) may name an EOS id past the target's
    vocabulary: never sampled, so it is left out rather than failing every call's id check."""
    from types import SimpleNamespace

    from eagle_kernels.runtime.api import EagleGenerator

    target = SimpleNamespace(config=SimpleNamespace(eos_token_id=[2, 10**6, None]), vocab_size=100)
    generator = SimpleNamespace(tokenizer=SimpleNamespace(eos_token_id=5),
                                engine=SimpleNamespace(target=target))
    assert EagleGenerator.eos_token_ids(generator) == [2, 5]
