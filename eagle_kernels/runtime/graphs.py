"""CUDA-graph capture of one decoding cycle, replayed for the rest of a generate call.

A speculative cycle launches hundreds of small kernels (draft steps, a 30-layer verify pass,
top-k, tree construction, acceptance, compaction); at batch 1 their launch overhead is as
large as their work. :class:`GraphedStep` records the whole cycle once and replays it with one
launch. Everything the cycle touches lives in static buffers (KV caches, lengths, output
buffer); the per-cycle inputs (root token, the head's root hidden state, the acceptance
uniforms) are copied into captured input tensors before each replay.

Capture needs every op on a kernel backend without host syncs: the torch reference ops read
values on the host (loops over the batch), so with them capture fails and the runtime falls
back to eager execution, saying why (``GraphedStep.try_capture`` returns None and a reason).
Warm-up runs (which compile Triton kernels and settle allocations) mutate the state, so the
caller passes the mutable tensors to snapshot; they are restored before capture (which records
kernels without running them).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


class GraphedStep:
    """A callable ``fn(*inputs) -> tuple of tensors`` captured in a CUDA graph."""

    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[torch.Tensor],
                 outputs: tuple[torch.Tensor, ...]):
        self.graph, self.inputs, self.outputs = graph, inputs, outputs

    @classmethod
    def try_capture(cls, fn: Callable, inputs: Sequence[torch.Tensor],
                    mutable_state: Sequence[torch.Tensor], warmup: int = 2):
        """(GraphedStep, None) on success, (None, reason) when capture is not possible.

        ``mutable_state`` tensors are saved before the warm-up runs and restored afterwards,
        so capturing leaves the generation exactly where it was.
        """
        saved = [t.clone() for t in mutable_state]
        static_inputs = [t.clone() for t in inputs]
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    fn(*static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            for tensor, value in zip(mutable_state, saved):
                tensor.copy_(value)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = fn(*static_inputs)
        except Exception as error:  # capture is an optimisation: say why and run eagerly
            torch.cuda.synchronize()
            for tensor, value in zip(mutable_state, saved):
                tensor.copy_(value)
            return None, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return cls(graph, static_inputs, tuple(outputs)), None

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for static, value in zip(self.inputs, inputs):
            if static.data_ptr() != value.data_ptr():
                static.copy_(value)
        self.graph.replay()
        return self.outputs
