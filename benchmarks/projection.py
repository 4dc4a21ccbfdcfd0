"""How long do `fabricbench model fit` and `model project` take? (ratio to reading the records)

    uv run python benchmarks/projection.py                 # 3 rounds, records built in a temp folder
    uv run python benchmarks/projection.py --rounds 5 --sizes 17 --blocks 8
    uv run python benchmarks/projection.py --backend gloo   # Gloo's form: its robust fit iterates

The records are synthetic collectives records (all_reduce and all_gather at 2, 4 and 8 ranks,
64 KiB up, `--blocks` blocks per scale, times from the model with a +-3% block effect), written as
JSON files as a run writes them. Each round, in alternating order so machine drift hits all alike:
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

from analysis import projection as pj  # noqa: E402
from workloads.core.records import iter_records  # noqa: E402


def write_records(root: Path, sizes: int, blocks: int, backend: str = "nccl") -> None:
    form = "gloo" if backend == "gloo" else "ring"
    for p in (2, 4, 8):
        for b in range(blocks):
            rows = []
            for op in ("all_reduce", "all_gather"):
                for k in range(sizes):
                    s = 65536 << k
                    t = pj.model_time(op, p, s, 2e-4, 1 / 12.5e6, 1e-4, form) * (1 + 0.03 * math.sin(1.7 * b + p + k))
                    rows.append({"op": op, "size": s, "group_size": p, "in_place": {"time_us": t * 1e6},
                                 "out_of_place": None})
            rec = {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "record_id": f"{p}-{b}",
                   "config": {"trial": b, "fabric": {"name": "bench"}}, "fabric": {"name": "bench", "backend": backend},
                   "world": {"world_size": p}, "rows": rows, "study": {"id": "bench", "block": b},
                   "fingerprint": {"git": {"commit": "bench", "dirty_hash": None}}}
            d = root / f"n{p}" / "records"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"collectives-{b}.json").write_text(json.dumps(rec))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=9, help="sizes per op, 64 KiB x 2^k [9: up to 16 MiB]")
    ap.add_argument("--blocks", type=int, default=4, help="blocks per scale [4]")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                    help="the records' backend: gloo fits Gloo's form of all_reduce and all_gather [nccl]")
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
                    cal = pj.fit(list(iter_records(root, "**/records/*.json")))
                else:
                    c = cal or pj.fit(list(iter_records(root, "**/records/*.json")), boot=50)
                    if cal is None:
                        t0 = time.perf_counter()  # the first round's projection times only the projection
                    for op in c["ops"]:
                        for s in c["ops"][op]["sizes"]:
                            for p in (64, 512):
                                pj.project(c, op, p, s)
                times[what].append(time.perf_counter() - t0)
            print(f"round {r}: read {times['read'][-1] * 1e3:.1f} ms, fit {times['fit'][-1] * 1e3:.1f} ms, "
                  f"project {times['project'][-1] * 1e3:.1f} ms ({n_recs} records)", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median: read {med['read'] * 1e3:.1f} ms, fit {med['fit'] * 1e3:.1f} ms, project {med['project'] * 1e3:.1f} ms "
          f"({2 * args.sizes * 2} projections)")
    print(f"ratio fit/read {med['fit'] / med['read']:.1f}, project/read {med['project'] / med['read']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
