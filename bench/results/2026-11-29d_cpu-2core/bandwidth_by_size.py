"""Read bandwidth by buffer size, 2 threads: a torch reduction and our one-row GEMV over random
fp32 buffers of 16 MiB .. 1 GiB, each read back to back (medians). Where the last-level cache
holds a decode step's bytes (123 MB = 118 MiB here), re-reading them is faster than DRAM:
bench_cpu's floor takes the faster of the two.

    python bench/results/2026-11-29d_cpu-2core/bandwidth_by_size.py > bandwidth_by_size.txt
"""
import statistics
import time

import torch

from eagle_kernels import ops

torch.set_num_threads(2)
for megabytes in (16, 64, 118, 128, 256, 1024):  # 118 MiB: a decode step's bytes
    data = torch.rand(megabytes << 18, generator=torch.Generator().manual_seed(0))
    weight, x = data.view(-1, 1024), torch.ones(1, 1024)
    for name, call in (("sum", lambda: data.sum()), ("gemv", lambda: ops.linear(x, weight))):
        call()
        seconds = []
        for _ in range(max(3, 2048 // megabytes)):
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
        print(f"{megabytes:5d} MiB {name:4s} {megabytes * 2**20 / statistics.median(seconds) / 1e9:5.1f} GB/s")
