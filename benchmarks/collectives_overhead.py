"""Does the collectives harness report the bandwidth a bare loop gets? (target: within 3%)

    OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node=2 benchmarks/collectives_overhead.py
    torchrun --nproc_per_node=8 benchmarks/collectives_overhead.py --backend nccl --max-mib 256

For each size from 1 MiB up, in the same process group: burn-in, then alternating
rounds of (a) the suite's measurement (workloads.collectives.harness.Harness.measure,
all_reduce in place, check off) and (b) a minimal loop
`for _ in range(iters): dist.all_reduce(x)` between two synchronisations, timed the same
way and combined across ranks by the same mean. Alternation spreads machine noise over
both. Prints busbw per size for each, and the ratio suite/bare of the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from workloads.collectives import ops  # noqa: E402
from workloads.collectives.harness import Harness  # noqa: E402
from workloads.collectives.settings import Checks, Sweep, Timing  # noqa: E402
from workloads.core.dist import end_group_and_exit  # noqa: E402


def bare_busbw(x: torch.Tensor, iters: int, device: torch.device) -> float:
    n = dist.get_world_size()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    sec = float(t.item()) / n
    return x.numel() * x.element_size() / sec / 1e9 * 2 * (n - 1) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="gloo")
    p.add_argument("--min-mib", type=int, default=1)
    p.add_argument("--max-mib", type=int, default=16)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if a.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sizes = []
    s = a.min_mib << 20
    while s <= a.max_mib << 20:
        sizes.append(s)
        s *= 2
    sweep = Sweep(ops=("all_reduce",), sizes=tuple(sizes), datatype="float", redop="sum", root=0, out_of_place=False,
                  in_place=True)
    comm = ops.Comm(group=None, rank=rank, size=n, global_ranks=tuple(range(n)))
    harness = Harness(sweep, Timing(iters=a.iters, warmup_iters=5, average="mean"), Checks(elements=False), comm,
                      device, a.backend, rank)
    op = ops.get("all_reduce")
    harness.warmup(op)  # burn-in
    if rank == 0:
        print(f"# all_reduce busbw (GB/s), {a.backend}, {n} ranks, {a.iters} iters x {a.rounds} rounds, median")
        print(f"# {'size(B)':>10}  {'suite':>9}  {'bare':>9}  {'suite/bare':>10}")
    ratios = []
    for size in sizes:
        lay = op.layout(size, 4, n)
        x = torch.ones(lay.count, dtype=torch.float32, device=device)
        for _ in range(2):  # burn-in at this size, both paths
            harness.measure(op, lay, ops.IN_PLACE)
            bare_busbw(x, a.iters, device)
        suite, bare = [], []
        for _ in range(a.rounds):
            suite.append(harness.measure(op, lay, ops.IN_PLACE).busbw)
            bare.append(bare_busbw(x, a.iters, device))
        ms, mb = statistics.median(suite), statistics.median(bare)
        ratios.append(ms / mb)
        if rank == 0:
            print(f"  {lay.size:>10}  {ms:9.4f}  {mb:9.4f}  {ms / mb:10.3f}")
    if rank == 0:
        print(f"# geometric-mean ratio suite/bare over sizes >= 1 MiB: "
              f"{statistics.geometric_mean(ratios):.3f} (target 0.97..1.03)")
    end_group_and_exit()


if __name__ == "__main__":
    main()
