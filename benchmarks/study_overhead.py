"""What does the study runner add between two arms' runs? (ratio to the bare entry point)

    OMP_NUM_THREADS=1 uv run python benchmarks/study_overhead.py            # CPU, loopback A/A, 3 rounds
    uv run python benchmarks/study_overhead.py --rounds 5 --out bench-results/study

Each round, alternating so machine drift hits both alike: (a) the bare entry point, the
exact command the study would run for one cell minus its `study=` override, started with
subprocess and timed from start to exit; (b) one study of one trial of two arms
(loopback and its A/A twin, a small all_reduce), run in this process with the runner's
own functions (workloads.study.run.execute) and timed from the first run's start to the
second run's start: the gap between arms is from the first process's exit to the second's
start (the resume check of what ran, the next command, the progress line).
A burn-in round (not counted) warms the page cache first.

Prints per round: bare seconds, the study's per-run seconds and the gap; then the ratio
median(study run + gap) / median(bare run). The gap is the runner's own cost (resume
check, the command, the progress line); it does not include compare and the report,
which run once per study.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads import REPO_ROOT  # noqa: E402
from workloads.study.run import cell_argv, execute, plan  # noqa: E402
from workloads.study.spec import load_spec  # noqa: E402

STUDY = """name: overhead
arms:
  - {label: loopback, fabric: loopback}
control: true
workloads:
  - name: ar
    entry: collectives
    overrides: ["collectives.ops=[all_reduce]", collectives.minbytes=64K, collectives.maxbytes=64K,
                collectives.iters=5, collectives.warmup_iters=1]
blocks: 1
"""


def bare(spec, job) -> float:
    argv = [a for a in cell_argv(spec, job, "local") if not a.startswith("study=")]
    argv = [a if not a.startswith("run_id=") else f"run_id=bare-{time.time_ns()}" for a in argv]
    t0 = time.monotonic()
    subprocess.run(argv, cwd=REPO_ROOT, check=True, capture_output=True)
    return time.monotonic() - t0


def one_study(root: Path, k: int) -> tuple[float, float]:
    """(the first run's own seconds, the gap from its exit to the second run's start)."""
    from workloads.study.run import _manifest

    spec = load_spec(root / "study.yaml", f"overhead-{k}", str(root))
    jobs = plan(spec)
    _manifest(spec)
    timings: list = []
    ran, failed, failures = execute(spec, jobs, "local", say=lambda line: None, timings=timings)
    assert failed == 0, failures
    (_, s0, e0), (_, s1, _) = timings
    return e0 - s0, s1 - e0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", help="keep the records here (default: a temp dir, removed)")
    a = p.parse_args()
    root = Path(a.out or tempfile.mkdtemp(prefix="fb-study-overhead-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "study.yaml").write_text(STUDY)
    spec = load_spec(root / "study.yaml", "overhead-bare", str(root))
    job = plan(spec)[0]
    try:
        bare(spec, job)
        one_study(root, -1)  # burn-in
        rows = []
        for k in range(a.rounds):
            b = bare(spec, job)
            run_s, gap = one_study(root, k)
            rows.append((b, run_s, gap))
            print(f"round {k}: bare {b:.2f} s | study run {run_s:.2f} s + gap to the next arm {gap:.3f} s", flush=True)
        bare_m = statistics.median(r[0] for r in rows)
        study_m = statistics.median(r[1] + r[2] for r in rows)
        gap_m = statistics.median(r[2] for r in rows)
        print(f"median: bare {bare_m:.2f} s, study run + gap {study_m:.2f} s (gap {gap_m:.3f} s); "
              f"ratio study/bare {study_m / bare_m:.3f}")
    finally:
        if not a.out:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
