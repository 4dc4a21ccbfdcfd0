"""fabricbench's load generator vs SGLang's own benchmark client (`python -m sglang.bench_serving`,
now `sglang.benchmark.serving`), side by side against one real SGLang server on this CPU.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/loadgen_vs_sglang.py [--rounds 4] [--requests 64]
        [--concurrency 4] [--input-len 32] [--output-len 16] [--tp 1] [--sglang-python PATH] [--url URL --model DIR]

Unlike benchmarks/loadgen_vs_vllm.py (a scripted server that answers instantly, so the clients
are the limit), this one measures the same real engine twice: the two clients should agree
on what the server does. Both run closed loop (`--concurrency` requests in flight; SGLang:
--max-concurrency with --request-rate inf), `--requests` requests of `--input-len` random
token ids in (SGLang: --dataset-name random-ids --random-range-ratio 1.0; fabricbench: its
random dataset at range ratio 1) and `--output-len` tokens out (ignore_eos), completions
endpoint, streaming. Each side reports its own req/s and median TTFT over its measured
requests (SGLang: "request_throughput", "median_ttft_ms"; fabricbench: docs/metrics.md's
definitions, workloads/inference/metrics.py), as each would in use. SGLang's client draws its
own prompts (seed 42), fabricbench draws its own, so the prompts differ; their shapes do not.

The server: a tiny Llama (tests/hf_tiny.py: hidden 128, 2 layers, random weights, local
tokenizer; nothing downloaded) started through fabricbench's SGLang adapter (its CPU
recipe) and orchestrator, in .engines/sglang (`make engines`); or `--url` an SGLang server
already running (then `--model` is its model directory, for SGLang's tokenizer).
Burn-in: one unreported round each. Then `--rounds` rounds in ABBA order (fabricbench,
SGLang, SGLang, fabricbench, ...), SGLang's /flush_cache before every round of either side
(SGLang's client: --flush-cache), so no round finds its prompts cached. The figure is the
ratio of the medians. SGLang's client runs in the engine's venv, kept alive between rounds
so its import is paid once.
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # helpers.hf_tiny builds the tiny model

from driven_client import DrivenClient, abba_rounds  # noqa: E402

from helpers.hf_tiny import model_dir  # noqa: E402
from workloads.core.dist import free_port  # noqa: E402
from workloads.inference.adapters import sglang  # noqa: E402
from workloads.inference.adapters.base import ServerSpec  # noqa: E402
from workloads.inference.adapters.orchestrator import ManagedServer  # noqa: E402
from workloads.inference.loadgen.arrivals import Arrival  # noqa: E402
from workloads.inference.loadgen.backends import get_backend  # noqa: E402
from workloads.inference.loadgen.datasets import RandomDataset, load_tokenizer  # noqa: E402
from workloads.inference.loadgen.point import LoadPoint, run_load  # noqa: E402
from workloads.inference.metrics import summarize  # noqa: E402
from workloads.inference.run import flush_cache  # noqa: E402

# Runs in SGLang's venv: one `sglang.benchmark.serving` run (its own CLI, its own argv) per
# "go" line on stdin, answering with the JSON line it appended to its --output-file.
SGLANG_DRIVER = """
import json, sys, warnings
warnings.simplefilter("ignore", FutureWarning)
from sglang.benchmark.serving import cli_main
argv, out = sys.argv[1:], sys.argv[sys.argv.index("--output-file") + 1]
print("READY", flush=True)
for _ in sys.stdin:
    sys.argv = ["sglang.bench_serving", *argv]
    cli_main()
    with open(out) as f:
        r = json.loads(f.read().splitlines()[-1])
    print("FBJSON " + json.dumps({k: r[k] for k in ("completed", "duration", "request_throughput", "median_ttft_ms")}),
          flush=True)
"""

LLAMA = {"num_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 256, "max_position_embeddings": 256}


def sglang_client(python: Path, url: str, model: str, out: Path, a) -> DrivenClient:
    """SGLang's benchmark client in its own process, one round per `round()` call."""
    args = ["--backend", "sglang-oai", "--base-url", url, "--model", model, "--tokenizer", model,
            "--dataset-name", "random-ids", "--random-input-len", str(a.input_len),
            "--random-output-len", str(a.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(a.requests), "--request-rate", "inf", "--max-concurrency", str(a.concurrency),
            "--warmup-requests", "0", "--flush-cache", "--disable-tqdm", "--output-file", str(out)]
    return DrivenClient("SGLang", python, SGLANG_DRIVER, args)


def fabricbench_round(url: str, model: str, specs, a) -> dict:
    flush_cache(url, "/flush_cache")
    p = LoadPoint(url, get_backend("completions"), model, specs, Arrival("closed", concurrency=a.concurrency),
                  num_requests=a.requests, timeout_s=600)
    res = run_load(p, warn=lambda s: None)
    m = summarize(res.results, res.duration_s)
    return {"completed": m["completed"], "duration": res.duration_s, "request_throughput": m["request_throughput"],
            "median_ttft_ms": m["median_ttft_ms"]}


def run_rounds(sides: dict, rounds: int, requests: int) -> dict[str, list[dict]]:
    """Burn-in, then ABBA-ordered rounds; each side's results per round."""
    out: dict[str, list[dict]] = {n: [] for n in sides}
    print(f"{'round':>5} {'client':>12} {'req/s':>8} {'TTFT med ms':>12} {'completed':>9}", flush=True)
    for k, n, r in abba_rounds(sides, rounds):
        if r["completed"] != requests:
            raise SystemExit(f"{n}: {r['completed']} of {requests} requests completed in round {k + 1}; "
                             "the comparison is void")
        out[n].append(r)
        print(f"{k + 1:5d} {n:>12} {r['request_throughput']:8.2f} {r['median_ttft_ms']:12.1f} "
              f"{r['completed']:9d}", flush=True)
    return out


def report(res: dict[str, list[dict]], a, where: str) -> None:
    print(f"\nclosed loop, concurrency {a.concurrency}, {a.requests} requests, {a.input_len} in / {a.output_len} out "
          f"tokens; {where}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("request_throughput", "median_ttft_ms")}
           for n, rs in res.items()}
    for n, m in med.items():
        rounds = ", ".join(f"{r['request_throughput']:.2f}" for r in res[n])
        print(f"{n:>12}: median {m['request_throughput']:.2f} req/s, TTFT median {m['median_ttft_ms']:.1f} ms  "
              f"(rounds: {rounds} req/s)")
    if len(med) == 2:
        fb, sg = med["fabricbench"], med["sglang"]
        print(f"fabricbench / sglang.bench_serving: req/s {fb['request_throughput'] / sg['request_throughput']:.2f}x, "
              f"TTFT {fb['median_ttft_ms'] / sg['median_ttft_ms']:.2f}x (medians of {a.rounds} alternating rounds)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--tp", type=int, default=1, help="the server's tensor-parallel degree (started here)")
    ap.add_argument("--sglang-python", default=str(sglang.ENGINE_ENV / "bin" / "python"),
                    help="python of a venv with SGLang (default .engines/sglang, `make engines`)")
    ap.add_argument("--url", help="an SGLang server already running (default: start one here)")
    ap.add_argument("--model", help="with --url: the model directory it serves (SGLang's client loads its tokenizer)")
    a = ap.parse_args()
    if not Path(a.sglang_python).is_file():
        print(f"error: --sglang-python {a.sglang_python}: no such file; run `make engines`", file=sys.stderr)
        return 2
    if a.url and not a.model:
        print("error: --url needs --model <the served model's directory>", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model = a.model or str(model_dir(Path(tmp) / "llama", "llama", LLAMA))
        if a.url:
            return compare(a.url.rstrip("/"), model, a, Path(tmp), f"the server at {a.url}")
        spec = ServerSpec("sglang", port=free_port(), tp=a.tp, model_path=model, python=a.sglang_python,
                          ready_timeout_s=900)
        launch = sglang.command(spec, {"name": "llama-tiny"})
        print(f"starting SGLang (TP={a.tp}) on {spec.base_url}; its log: {tmp}/server/sglang.log", flush=True)
        with ManagedServer(spec, launch, tmp, dict(os.environ)) as srv:
            return compare(srv.base_url, model, a, Path(tmp), f"SGLang TP={a.tp} (tiny Llama) on this CPU")


def compare(url: str, model: str, a, tmp: Path, where: str) -> int:
    tok = load_tokenizer(model)
    specs = RandomDataset(a.requests, a.input_len, a.output_len, range_ratio=1.0).load(tok)
    client = sglang_client(Path(a.sglang_python), url, model, tmp / "sglang.jsonl", a)
    try:
        res = run_rounds({"fabricbench": lambda: fabricbench_round(url, model, specs, a), "sglang": client.round},
                         a.rounds, a.requests)
    finally:
        client.close()
    report(res, a, where)
    return 0


if __name__ == "__main__":
    sys.exit(main())
