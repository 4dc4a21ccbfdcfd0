"""Client capacity: the highest Poisson request rate the load generator sustains with
p99 scheduling lag < 1 ms, against a server that answers instantly (one token, no delay).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/loadgen_capacity.py [--seconds 3] [--max-rate 6400]
        [--event-loop auto|uvloop|asyncio] [--realtime]

The server runs in its own process pinned to CPU 1 and the client to CPU 0 (2 cores in
all). Burn-in: one point at the lowest rate, not reported. Then rates double until the
p99 lag passes 1 ms or requests fail. The baseline in the same run is the lowest rate:
each row prints its achieved/offered ratio and its p99 lag against the baseline's.
A busy machine lowers the figure; the lag the client records is the honest measure.
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.inference.loadgen.arrivals import Arrival  # noqa: E402
from workloads.inference.loadgen.backends import get_backend  # noqa: E402
from workloads.inference.loadgen.datasets import RandomDataset  # noqa: E402
from workloads.inference.loadgen.point import LoadPoint, run_load  # noqa: E402
from workloads.inference.metrics import summarize  # noqa: E402
from workloads.testing.scripted_server import Running  # noqa: E402


def capacity(url: str, seconds: float = 3.0, start_rate: float = 100.0, max_rate: float = 12800.0,
             lag_ms: float = 1.0, event_loop: str = "auto") -> float | None:
    """Burn in at `start_rate`, then double the Poisson rate until p99 send lag reaches
    `lag_ms` or a request fails; print a row per rate and return the last rate that passed."""
    specs = RandomDataset(64, input_len=16, output_len=1, vocab_size=1000).load(None)

    def point(rate):
        p = LoadPoint(url, get_backend("completions"), "m", specs, Arrival("poisson", rate=rate),
                      num_requests=int(max(rate * seconds, 200)), timeout_s=30, seed=int(rate), event_loop=event_loop)
        res = run_load(p, warn=lambda s: None)
        return res, summarize(res.results, res.duration_s)

    point(start_rate)  # burn-in
    best, base_lag = None, None
    print(f"{'offered req/s':>13} {'achieved':>9} {'ratio':>6} {'failed':>6} {'mean lag ms':>11} "
          f"{'p99 lag ms':>10} {'p99/base':>8}")
    rate = start_rate
    while rate <= max_rate:
        res, m = point(rate)
        lag = res.lag_stats()
        base_lag = base_lag or lag["p99_send_lag_ms"]
        print(f"{rate:13.0f} {m['request_throughput']:9.1f} {m['request_throughput'] / rate:6.2f} "
              f"{m['failed']:6d} {lag['mean_send_lag_ms']:11.3f} {lag['p99_send_lag_ms']:10.3f} "
              f"{lag['p99_send_lag_ms'] / base_lag:8.1f}", flush=True)
        if lag["p99_send_lag_ms"] >= lag_ms or m["failed"]:
            break
        best = rate
        rate *= 2
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0, help="measured seconds per rate")
    ap.add_argument("--start-rate", type=float, default=100.0)
    ap.add_argument("--max-rate", type=float, default=12800.0)
    ap.add_argument("--lag-ms", type=float, default=1.0)
    ap.add_argument("--event-loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    ap.add_argument("--realtime", action="store_true",
                    help="run client and server SCHED_FIFO (root): measures the client, not other jobs on a shared box")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    srv = Running(cpu=cpus[-1], instant=True)
    with srv as url:
        os.sched_setaffinity(0, {cpus[0]})
        if a.realtime:
            for pid in (0, srv.proc.pid):
                os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))
        best = capacity(url, a.seconds, a.start_rate, a.max_rate, a.lag_ms, a.event_loop)
    best_s = "none (even the lowest rate lagged)" if best is None else f"{best:.0f} req/s"
    print(f"\nhighest rate with p99 send lag < {a.lag_ms:g} ms: {best_s} "
          f"(client on 1 core, instant server on the other; {os.cpu_count()} cores, this machine)")


if __name__ == "__main__":
    main()
