"""Static, preallocated KV cache in the layout every op shares.

The layout is part of the contract defined in the docstring of
:mod:`eagle_kernels.ops.reference` (the README gives the overview): a verify pass writes the
tree nodes' K/V at ``[lens, lens + N)`` and :func:`eagle_kernels.ops.compact_kv` moves the
accepted path next to the prefix.

Per layer one K and one V tensor ``[B, max_len, kv_heads, head_dim]`` ("NHD"), contiguous, and
one ``lens`` tensor ``[B]`` int32 with each sequence's committed length. Nothing is ever
reallocated, so CUDA graphs can capture passes that read and write it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from .. import ops


@dataclass
class KVCache:
    """K and V of every layer plus the committed length of every sequence."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lens: torch.Tensor

    @classmethod
    def allocate(cls, num_layers: int, batch: int, max_len: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str) -> "KVCache":
        """Zero-filled cache of ``num_layers`` layers for ``batch`` sequences of ``max_len``.
        On CPU one larger than the memory available is refused (ValueError): the allocator
        would hand it out (overcommit) and zero-filling it would get the process killed."""
        shape = (batch, max_len, kv_heads, head_dim)
        _check_fits(2 * num_layers * batch * max_len * kv_heads * head_dim * dtype.itemsize,
                    batch, max_len, torch.device(device))
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(keys, values, torch.zeros(batch, dtype=torch.int32, device=device))

    @property
    def batch(self) -> int:
        return self.lens.shape[0]

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[1]

    def all_tensors(self) -> list[torch.Tensor]:
        """Every K and V tensor, in the order :func:`eagle_kernels.ops.compact_kv` takes them."""
        return [*self.keys, *self.values]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, offset: int = 0) -> None:
        """Store ``k``/``v`` [B, T, Hkv, D] at positions ``[lens + offset, lens + offset + T)``.

        :func:`eagle_kernels.ops.write_kv` on a GPU (index arithmetic on the device: no host
        sync with value checks off, as in the decode loop, so graph-capturable; the positions
        checked against ``max_len`` with value checks on); its reference on CPU, unchecked:
        there the caller makes sure the positions fit.
        """
        # The reference directly: its indexed stores keep autograd, and on CPU it is the op's
        # only backend (the op's checks would cost ~25 us per layer for nothing).
        if k.requires_grad or v.requires_grad or k.device.type == "cpu":
            ops.reference.write_kv(k, v, self.keys[layer], self.values[layer], self.lens, offset)
            return
        ops.write_kv(k.contiguous(), v.contiguous(), self.keys[layer], self.values[layer],
                     self.lens, offset)

    def reset(self) -> None:
        """Forget every sequence (lengths to zero); the buffers are reused as they are."""
        self.lens.zero_()


def available_host_bytes() -> int | None:
    """Memory the host can still hand out without swapping (Linux MemAvailable; elsewhere
    free pages), less where a cgroup's limit leaves less (a container); None where nothing is
    known."""
    found = [value for value in (_meminfo_available(), _cgroup_room()) if value is not None]
    if not found:
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    return min(found)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """Limit minus usage of this process's memory cgroup (v2, else v1); None without one."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f_limit, open(usage) as f_usage:
                cap, used = f_limit.read().strip(), int(f_usage.read().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 2**60:  # "max" / a v1 huge number: no limit
            return max(int(cap) - used, 0)
    return None


def _check_fits(nbytes: int, batch: int, max_len: int, device: torch.device) -> None:
    """A CPU cache of ``nbytes`` within available_host_bytes(), or a ValueError saying what to
    lower (a CUDA allocation that does not fit raises torch's OutOfMemoryError itself)."""
    if device.type != "cpu":
        return
    available = available_host_bytes()
    if available is not None and nbytes > available:
        raise ValueError(f"max_len: a KV cache of {batch} sequence(s) x {max_len} positions needs "
                         f"{nbytes / 2**30:.1f} GiB, this host has {available / 2**30:.1f} GiB "
                         f"available; lower max_new_tokens / max_length or the batch")
