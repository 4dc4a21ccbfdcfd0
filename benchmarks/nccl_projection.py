"""NCCL calibrations: fit on 2 and 4 nodes of 8 GPUs, project to 64 nodes (512 ranks), against
NCCL's own model there, before (the flat ring) and after (NCCL's cost model per level).

    uv run python benchmarks/nccl_projection.py                 # NCCL 2.30.7's constants
    uv run python benchmarks/nccl_projection.py --nccl 2.23.4

The records' times are NCCL's own predicted times (analysis.nccl_cost.choose, the ported
tuning.cc) for an assumed system: Hopper, 16 channels, 45 GB/s of bus bandwidth per GPU across
nodes, 360 GB/s inside one, Intel hosts, no NVLS and no CollNet; two blocks per scale, exact.
Prints the fit's and the projection's wall time (the NCCL block alone), then per size the
flat ring's and the per-level calibration's 512-rank all_reduce time over NCCL's own.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analysis import nccl_cost as nc  # noqa: E402
from analysis import projection as pj  # noqa: E402
from analysis.projection import hierarchy as hi  # noqa: E402

TRUE = nc.Measured(intra_busbw=360.0, inter_busbw=45.0)
SIZES = [1 << k for k in range(10, 29, 2)]
CHECK = (1 << 16, 1 << 20, 16 << 20, 256 << 20)


def record(nodes: int, gpn: int, block: int, nccl: str) -> dict:
    rows = hi.nccl_rows(nodes, gpn, nccl, TRUE, SIZES)
    return {"workload": "collectives", "status": "ok", "run_id": f"n{nodes}-{block}", "record_id": f"{nodes}-{block}",
            "created": "2026-12-01T10:00:00+0000", "config": {"trial": block, "fabric": {"name": "h100-ib"}},
            "fabric": {"name": "h100-ib", "backend": "nccl"}, "study": {"id": "bench", "block": block},
            "world": {"world_size": nodes * gpn, "nodes": nodes, "local_world_size": gpn},
            "collectives": {"pattern": "all", "ranks_per_node": gpn}, "rows": rows, "line_rate": {},
            "fingerprint": {"nccl": nccl, "git": {"commit": "bench", "dirty_hash": None}}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nccl", default="2.30.7", help="the NCCL release whose constants make the records [2.30.7]")
    args = ap.parse_args()
    version = nc.version_of(args.nccl)
    recs = [(Path(f"/bench/n{n}-{b}.json"), record(n, 8, b, args.nccl)) for n in (2, 4) for b in range(2)]
    flat = pj.fit(recs, boot=50)
    t0 = time.perf_counter()
    cal = {"nccl": hi.fit([r for _, r in recs]), "fabric": "h100-ib"}
    t1 = time.perf_counter()
    rows = [(s, pj.project(flat, "all_reduce", 512, s).time_s, hi.projection(cal, "all_reduce", s, 64, 8),
             nc.choose(hi.base_topology(64, 8), "all_reduce", s, version, TRUE)) for s in SIZES]
    t2 = time.perf_counter()
    print(f"NCCL {args.nccl}: fit (NCCL block) {t1 - t0:.2f} s, {len(rows)} projections {t2 - t1:.3f} s")
    print(f"{'size':>10} {'NCCL ms':>9} {'algo':>12} {'flat ring':>10} {'per level':>10}")
    for s, flat_s, ours, truth in rows:
        if s in CHECK:
            print(f"{s:>10} {truth.time_s * 1e3:9.4f} {truth.name:>12} {flat_s / truth.time_s:9.2f}x "
                  f"{ours['time_s'] / truth.time_s:9.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
