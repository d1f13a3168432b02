"""Lossless by construction: on the cpu backend, and with the Triton kernels (linear, rms_norm,
tree_attention; on a GPU, or under the interpreter here), a token's logits do not depend on how
many tokens are computed with it.

The logits of every node of a verify pass over N tree nodes (batch 2, prefixes of different
lengths, random tree shapes, N 1..64) must equal, bit for bit, the logits of the same token
decoded one token at a time from an empty cache over the same prefix and the node's ancestors.
Prefill rows are checked the same way. With this, greedy speculative output equals greedy
autoregressive output for every prompt, not only for the prompts a test happens to run.
"""

from __future__ import annotations

import os

import pytest
import torch

from eagle_kernels import ops
from eagle_kernels.ops import BACKEND_ENV
from eagle_kernels.ops._backend import backend_status, resolve
from eagle_kernels.ops.decoder import pack_weight, round_to_q8_0
from eagle_kernels.runtime.drafting import causal_tree_mask

from conftest import SHAPES, random_parents
from cpu_support import needs_cpu_backend, q4_exact_layers
from cuda_support import gpu_when_present, seed_note
from runtime_helpers import tiny_target

PREFIXES = (23, 6)  # batch 2: sequences of different committed lengths
# interpreted cases cost ~1 s per decode step: one tree size per dtype here (33: a chain whose
# packed mask takes two words), every size on a GPU; and two layers where a GPU runs three
INTERPRETER_NODES = {torch.float32: 33, torch.bfloat16: 7}
INTERPRETER_LAYERS, LAYERS = 2, 3
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
_TRITON_MISSING = backend_status("triton")
needs_triton = pytest.mark.skipif(not _TRITON_MISSING.available,
                                  reason=f"triton backend: {_TRITON_MISSING.reason}")
CPU_OPS = ("linear", "rms_norm", "apply_rope", "silu_mul", "tree_attention")
# (backend forced, device, dtype, the ops that must run it, weights in GGUF block packs)
CASES = [
    pytest.param(("auto", torch.device("cpu"), torch.float32, CPU_OPS, "cpu", False, "fp32"),
                 marks=needs_cpu_backend, id="cpu-fp32"),
    # the default target's packs: layers Q4_1, lm_head Q8_0 (decoder_linear.h "block packs")
    pytest.param(("auto", torch.device("cpu"), torch.float32, CPU_OPS, "cpu", True, "fp32"),
                 marks=needs_cpu_backend, id="cpu-q4-q8"),
    # ... with quantized activations (ops.set_cpu_activations, csrc/cpu/linear_int8.h)
    pytest.param(("auto", torch.device("cpu"), torch.float32, CPU_OPS, "cpu", True, "int8"),
                 marks=needs_cpu_backend, id="cpu-q4-q8-int8"),
    pytest.param(("auto", torch.device("cpu"), torch.float32, CPU_OPS, "cpu", True, "int16"),
                 marks=needs_cpu_backend, id="cpu-q4-q8-int16"),
    pytest.param(("triton", TRITON_DEVICE, torch.float32,
                  ("linear", "rms_norm", "tree_attention"), "triton", False, "fp32"),
                 marks=[needs_triton, gpu_when_present], id="triton-fp32"),
    pytest.param(("triton", TRITON_DEVICE, torch.bfloat16,
                  ("linear", "rms_norm", "tree_attention"), "triton", False, "fp32"),
                 marks=[needs_triton, gpu_when_present], id="triton-bf16"),
]


@pytest.fixture(scope="module", params=CASES)
def target(request):
    forced, device, dtype, ops_checked, want, block_packs, activations = request.param
    with pytest.MonkeyPatch.context() as patch:  # for the module's tests, then restored
        if forced != "auto":
            patch.setenv(BACKEND_ENV, forced)  # the other ops run the torch reference: elementwise
        interpreted = forced == "triton" and device.type == "cpu"
        layers = INTERPRETER_LAYERS if interpreted else LAYERS
        model = tiny_target(seed=3, layers=layers).to(device, dtype)
        if block_packs:
            q4_exact_layers(model)
            with torch.no_grad():
                model.lm_head.weight.copy_(round_to_q8_0(model.lm_head.weight))
            for weight, dtype_wanted in ((model.model.layers[0].mlp.up_proj.weight, torch.uint8),
                                         (model.lm_head.weight, torch.int8)):
                assert pack_weight(weight).dtype == dtype_wanted
        for op in ops_checked:
            chosen, _ = resolve(op, "auto", device, dtype=dtype, head_dim=16)
            assert chosen == want, (op, chosen)  # the row-invariant kernels are what runs
        if activations != "fp32":
            ops.set_cpu_activations(activations)
        try:
            yield model
        finally:
            if activations != "fp32":
                ops.set_cpu_activations("fp32")


def _one(token: int, position: int, device):
    return (torch.tensor([[token]], device=device), torch.tensor([[position]], device=device))


class Decoder:
    """Token-by-token decoding of one sequence from an empty cache (the AR baseline's path)."""

    def __init__(self, target, prefix: list[int], room: int):
        self.target = target
        self.device = target.lm_head.weight.device
        self.cache = target.allocate_cache(1, len(prefix) + room)
        self.mask = torch.ones(1, 1, 1, dtype=torch.int32, device=self.device)
        self.logits = []
        for token in prefix:
            self.logits.append(self.step(token))

    def step(self, token: int) -> torch.Tensor:
        ids, positions = _one(token, int(self.cache.lens[0]), self.device)
        hidden, _ = self.target(ids, positions, self.cache, self.mask)
        self.cache.lens += 1
        return self.target.logits(hidden[0, 0])

    def fork(self) -> "Decoder":
        other = object.__new__(Decoder)
        other.target, other.mask, other.logits = self.target, self.mask, []
        other.device = self.device
        other.cache = type(self.cache)([k.clone() for k in self.cache.keys],
                                       [v.clone() for v in self.cache.values],
                                       self.cache.lens.clone())
        return other


@pytest.mark.parametrize("num_nodes", [1, 2, 7, 33, 64])
def test_verify_logits_equal_decode_logits_bit_for_bit(gen, target, num_nodes):
    interpreted = os.environ.get(BACKEND_ENV) == "triton" and target.lm_head.weight.is_cpu
    if interpreted and num_nodes != INTERPRETER_NODES[target.dtype]:
        pytest.skip("Triton interpreter: one tree size per dtype (a GPU runs every size)")
    vocab = target.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in PREFIXES]
    shape = SHAPES[num_nodes % len(SHAPES)]
    parents = random_parents(len(prompts), num_nodes, gen, shape)
    device = target.lm_head.weight.device
    # on the model's device: a forced backend runs build_tree there too
    depth, mask, _ = ops.build_tree(parents.to(device))
    tokens = torch.randint(0, vocab, (len(prompts), num_nodes), generator=gen).to(device)

    with torch.inference_mode():
        # the runtime's way: one padded prefill pass, then one verify pass over the tree
        width = max(PREFIXES)
        ids = torch.zeros(len(prompts), width, dtype=torch.int64)
        for b, prompt in enumerate(prompts):
            ids[b, :len(prompt)] = torch.tensor(prompt)
        cache = target.allocate_cache(len(prompts), width + num_nodes)
        positions = torch.arange(width, device=device).expand(len(prompts), -1)
        prefill_hidden, _ = target(ids.to(device), positions, cache,
                                   causal_tree_mask(2, width, device))
        prefill_logits = target.logits(prefill_hidden)
        cache.lens.copy_(torch.tensor(PREFIXES, dtype=torch.int32))
        tree_positions = cache.lens.to(torch.int64).unsqueeze(1) + depth.to(torch.int64)
        tree_hidden, _ = target(tokens, tree_positions, cache, mask)
        tree_logits = target.logits(tree_hidden)

        for b, prompt in enumerate(prompts):
            decoder = Decoder(target, prompt, room=num_nodes)
            for t in range(len(prompt)):
                assert torch.equal(prefill_logits[b, t], decoder.logits[t]), \
                    ("prefill row", b, t, seed_note(gen))
            decoded = []  # node i's decoder: its parent's, one token further
            for node in range(num_nodes):
                parent = int(parents[b, node])
                branch = (decoded[parent] if parent >= 0 else decoder).fork()
                logits = branch.step(int(tokens[b, node]))
                decoded.append(branch)
                assert torch.equal(tree_logits[b, node], logits), \
                    ("tree node", b, node, shape, seed_note(gen))
