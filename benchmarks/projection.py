"""How long do `fabricbench model fit` and `model project` take? (ratio to reading the records)

    uv run python benchmarks/projection.py                 # 3 rounds, records built in a temp folder
    uv run python benchmarks/projection.py --rounds 5 --sizes 17 --blocks 8
    uv run python benchmarks/projection.py --backend gloo   # Gloo's form: its robust fit iterates
    uv run python benchmarks/projection.py --backend ring   # the ring form alone (no NCCL version)

The records are synthetic collectives records, 64 KiB up, `--blocks` blocks per scale, times from
the model with a +-3% block effect, written as JSON files as a run writes them: by default NCCL
2.30.7's own model's all_reduce, all_gather and reduce_scatter on 2, 4 and 8 nodes of 8 GPUs, so
the fit is `model fit`'s (the ring terms and the per-level NCCL block, fitted through NCCL's
algorithm choice) and the projection NCCL's model at 64 and 512 ranks; --backend ring or gloo:
all_reduce and all_gather at 2, 4 and 8 ranks in that form. Each round, in alternating order so machine drift hits all alike:
(a) the baseline: reading and parsing every record (what any analysis of them costs); (b) the fit
(analysis.projection.fit: selection, 400 block resamples per op, the held-out scales); (c) one
projection of every op and size to 64 and 512 ranks. Prints per round the three times, then the
medians and the ratios fit / read and project / read.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from analysis import nccl_cost as nc  # noqa: E402
from analysis import projection as pj  # noqa: E402
from analysis.projection import hierarchy as hi  # noqa: E402
from workloads.core.records import iter_records  # noqa: E402

NCCL, GPN = "2.30.7", 8


def write_records(root: Path, sizes: int, blocks: int, backend: str = "nccl") -> None:
    """Records at 2, 4 and 8 ranks (ring, gloo) or 2, 4 and 8 nodes of 8 GPUs (nccl: NCCL 2.30.7's
    own model's times, so the fit runs NCCL's algorithm choice per cell as `model fit` does)."""
    form = "gloo" if backend == "gloo" else "ring"
    for p in (2, 4, 8):
        for b in range(blocks):
            rows = []
            wobble = lambda k: 1 + 0.03 * math.sin(1.7 * b + p + k)  # noqa: E731
            if backend == "nccl":
                rows = hi.nccl_rows(p, GPN, NCCL, nc.Measured(intra_busbw=360.0, inter_busbw=45.0),
                                    [65536 << k for k in range(sizes)])
                for k, row in enumerate(rows):
                    row["in_place"] = {"time_us": row["in_place"]["time_us"] * wobble(k % sizes)}
                    row["out_of_place"] = None
            for op in ("all_reduce", "all_gather") if backend != "nccl" else ():
                for k in range(sizes):
                    s = 65536 << k
                    t = pj.model_time(op, p, s, 2e-4, 1 / 12.5e6, 1e-4, form) * wobble(k)
                    rows.append({"op": op, "size": s, "group_size": p, "in_place": {"time_us": t * 1e6},
                                 "out_of_place": None})
            rec = {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "record_id": f"{p}-{b}",
                   "config": {"trial": b, "fabric": {"name": "bench"}},
                   "fabric": {"name": "bench", "backend": "gloo" if backend == "gloo" else "nccl"},
                   "world": {"world_size": p}, "rows": rows, "study": {"id": "bench", "block": b},
                   "fingerprint": {"git": {"commit": "bench", "dirty_hash": None}}}
            if backend == "nccl":
                rec |= {"world": {"world_size": p * GPN, "nodes": p, "local_world_size": GPN},
                        "collectives": {"pattern": "all", "ranks_per_node": GPN}}
                rec["fingerprint"]["nccl"] = NCCL
            d = root / f"n{p}" / "records"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"collectives-{b}.json").write_text(json.dumps(rec))


def fit(records, boot: int = pj.BOOTSTRAP) -> dict:
    """What `model fit` does: the ring terms, and on NCCL records the per-level NCCL block too."""
    cal = pj.fit(records, boot=boot)
    chosen = [r for _, r in pj.select(records)]
    if hi.is_nccl(chosen):
        cal["nccl"] = hi.fit(chosen)
    return cal


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=9, help="sizes per op, 64 KiB x 2^k [9: up to 16 MiB]")
    ap.add_argument("--blocks", type=int, default=4, help="blocks per scale [4]")
    ap.add_argument("--backend", choices=("nccl", "ring", "gloo"), default="nccl",
                    help="the records: nccl, NCCL 2.30.7 on 2, 4, 8 nodes of 8 (the per-level NCCL fit, projected "
                         "to 8 and 64 nodes); ring, an NCCL fabric without a version (the ring form); gloo, Gloo's "
                         "form [nccl]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_records(root, args.sizes, args.blocks, args.backend)
        n_recs = len(list(root.rglob("*.json")))
        times: dict[str, list[float]] = {"read": [], "fit": [], "project": []}
        cal = None
        for r in range(args.rounds):
            order = ["read", "fit", "project"] if r % 2 == 0 else ["project", "fit", "read"]
            for what in order:
                t0 = time.perf_counter()
                if what == "read":
                    list(iter_records(root, "**/records/*.json"))
                elif what == "fit":
                    cal = fit(list(iter_records(root, "**/records/*.json")))
                else:
                    c = cal or fit(list(iter_records(root, "**/records/*.json")), boot=50)
                    if cal is None:
                        t0 = time.perf_counter()  # the first round's projection times only the projection
                    for op in c["ops"]:
                        for s in c["ops"][op]["sizes"]:
                            for p in (64, 512):
                                if "nccl" in c:   # NCCL's model through the levels, on p/8 nodes of 8
                                    hi.projection(c, op, s, p // GPN, GPN)
                                else:
                                    pj.project(c, op, p, s)
                times[what].append(time.perf_counter() - t0)
            print(f"round {r}: read {times['read'][-1] * 1e3:.1f} ms, fit {times['fit'][-1] * 1e3:.1f} ms, "
                  f"project {times['project'][-1] * 1e3:.1f} ms ({n_recs} records)", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median: read {med['read'] * 1e3:.1f} ms, fit {med['fit'] * 1e3:.1f} ms, project {med['project'] * 1e3:.1f} ms "
          f"({2 * sum(len(c['sizes']) for c in cal['ops'].values())} projections)")
    print(f"ratio fit/read {med['fit'] / med['read']:.1f}, project/read {med['project'] / med['read']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
