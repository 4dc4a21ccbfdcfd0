"""MLPerf's LoadGen (load=mlperf, Offline) against fabricbench's own load generator, side by side on
one scripted server that answers instantly, so the clients are the limit: what LoadGen's SUT bridge
(LoadGen's C++ issue thread -> the asyncio client, FirstTokenComplete/QuerySamplesComplete back)
costs against the project's client sending the same requests at once.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/loadgen_vs_mlperf.py [--rounds 3] [--requests 2000]
        [--output-len 16]

Both sides send the same prompts all at once (LoadGen's Offline: one query of every sample; the
project: Poisson at an infinite rate) through the same streaming function, and both are timed on
the project's clock, first send to last answer (LoadGen's own samples/s is printed beside it).
Burn-in, then ABBA rounds (driven_client.abba_rounds); the ratio of the medians.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from driven_client import abba_rounds  # noqa: E402
from loadgen_vs_vllm import word_tokenizer  # noqa: E402

from workloads.inference.loadgen.arrivals import Arrival  # noqa: E402
from workloads.inference.loadgen.backends import get_backend  # noqa: E402
from workloads.inference.loadgen.datasets import RandomDataset, load_tokenizer  # noqa: E402
from workloads.inference.loadgen.mlperf import MlperfSettings, run_mlperf  # noqa: E402
from workloads.inference.loadgen.point import LoadPoint, run_load  # noqa: E402
from workloads.testing.scripted_server import Running  # noqa: E402


def _rate(res) -> dict:
    ok = sum(r.ok for r in res.results)
    return {"failed": len(res.results) - ok, "request_throughput": ok / res.duration_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    srv = Running(ttft_ms=0, itl_ms=0, cpu=cpus[-1], instant=True)
    with tempfile.TemporaryDirectory() as tmp, srv as url:
        tok = Path(tmp) / "tokenizer"
        word_tokenizer(tok)
        specs = RandomDataset(a.requests, a.input_len, a.output_len).load(load_tokenizer(str(tok)))
        os.sched_setaffinity(0, {cpus[0]})
        backend = get_backend("completions")
        # one query of exactly every sample: min_query_count = the library, a 1 ms minimum duration
        ms = MlperfSettings("Offline", min_duration_ms=1, min_query_count=a.requests)
        lg_rates: list[float] = []

        def ours() -> dict:
            p = LoadPoint(url, backend, "m", specs, Arrival("poisson", rate=math.inf), num_requests=a.requests,
                          timeout_s=60)
            return _rate(run_load(p, warn=lambda s: None))

        def loadgen() -> dict:
            p = LoadPoint(url, backend, "m", specs, Arrival("mlperf", rate=1.0), num_requests=a.requests, timeout_s=60)
            res, run = run_mlperf(p, ms, Path(tmp) / "loadgen")
            lg_rates.append(run.results.get("result_samples_per_second", float("nan")))
            return _rate(res)

        rates: dict[str, list[float]] = {"fabricbench": [], "loadgen": []}
        print(f"{'round':>5} {'client':>12} {'req/s':>9}", flush=True)
        for k, n, r in abba_rounds({"fabricbench": ours, "loadgen": loadgen}, a.rounds):
            if r["failed"]:
                raise SystemExit(f"{n}: {r['failed']} requests failed in round {k + 1}; the comparison is void")
            rates[n].append(r["request_throughput"])
            print(f"{k + 1:5d} {n:>12} {r['request_throughput']:9.0f}", flush=True)
    fb, lg = statistics.median(rates["fabricbench"]), statistics.median(rates["loadgen"])
    print(f"\nall at once, {a.requests} requests, {a.input_len} in / {a.output_len} out tokens; clients on CPU "
          f"{cpus[0]}, instant scripted server on CPU {cpus[-1]}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")
    print(f"fabricbench: median {fb:.0f} req/s; LoadGen Offline through its SUT: median {lg:.0f} req/s "
          f"(LoadGen's own samples/s, measured rounds: {', '.join(f'{x:.0f}' for x in lg_rates[1:])})")
    print(f"LoadGen / fabricbench: {lg / fb:.2f}x (median of {a.rounds} alternating rounds each)")


if __name__ == "__main__":
    main()
