"""Make a pool of real A/A runs for tests/fixtures/aa_runs/: N runs of the real A/A study's
collectives configuration (tests/analysis/test_aa.py), one fabric, one label, then one CSV row a
run of the 36 metrics that study judges, read through analysis.load as `compare` reads them.

    .venv/bin/python tools/aa_pool.py OUT_DIR N > tests/fixtures/aa_runs/NAME.csv

N = 0 writes the CSV of the runs already in OUT_DIR.

Runs are exchangeable (nothing differs but time), so any 12 of them make a 6-block A/A study:
the test draws thousands and measures how often the study's statistics call a difference.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.compare import expand  # noqa: E402
from analysis.load import run_from_record  # noqa: E402
from workloads.core.records import iter_records  # noqa: E402

OVERRIDES = ("fabric=loopback", "collectives.ops=[all_reduce,all_gather,reduce_scatter,broadcast,alltoall,sendrecv]",
             "collectives.minbytes=1K", "collectives.maxbytes=256K", "collectives.stepfactor=4",
             "collectives.iters=5", "collectives.warmup_iters=1")
METRICS = ("*/busbw@*(GB/s)", "*/avg_busbw(GB/s)")


def main(out: Path, n: int) -> None:
    for i in range(n):
        cmd = [sys.executable, str(REPO / "launch" / "collectives.py"), *OVERRIDES, f"output_root={out}",
               f"run_id=pool-{i}", f"trial={i}"]
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                             env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"})
        if res.returncode:
            sys.exit(f"aa_pool: run {i} failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
        print(f"aa_pool: run {i + 1} of {n}", file=sys.stderr)
    found = iter_records(out, "pool-*/records/*.json")
    recs = [rec for _, rec in sorted(found, key=lambda pr: int(pr[0].parts[-3].removeprefix("pool-")))]
    runs = [run_from_record(r) for r in recs]
    names = expand(METRICS, runs[0].metrics)
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(["run", "created", *names])
    for run, rec in zip(runs, recs):
        w.writerow([rec["run_id"], rec["created"], *(f"{run.metric(m):.6g}" for m in names)])


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)  # usage, as docs/reliability.md's exit codes say
    main(Path(sys.argv[1]).resolve(), int(sys.argv[2]))
