"""GPU acceptance check: `make gpu-check` (or fabricbench gpu-check [--fabric F] [--out DIR]).

On one CUDA machine with 1-8 GPUs, in under 10 minutes, it runs the real workloads on NCCL
and checks what they report:

  train/ddp     GPT-NeoX 125M, bf16, DDP        MFU in its band, TFLOPS/GPU = the FLOPs formula over the
                                                timed steps, transport verdict, gradients moved as float32
  train/zero1   the same under DeepSpeed ZeRO-1 the same, gradients moved as bfloat16
  train/moe     neox-moe-125m (8 experts, top-2), TFLOPS/GPU = the active-expert FLOPs formula over the
                bf16, DDP, EP = gcd(GPUs, 8)        timed steps; all-to-all busbw under this GPU class's link
                                                ceiling (ceiling.py's top); routing skew shown, no band
  collectives   all_reduce sweep (1 MiB-256 MiB) no wrong element, verdict, busbw at the largest size
                                                within the band of this GPU's NVLink (workloads/fabric/
                                                ceiling.py), and, when all_reduce_perf is on PATH, our busbw
                                                there >= 0.75 x its busbw
  serve/tp<k>   the reference engine at TP=min(2, GPUs), bf16, a short closed-loop sweep: every request
                completed, transport verdict
  serve/pd      only with --pd-python and --pd-model (a vLLM for CUDA with nixl, and a local model):
                server=vllm-pd on this node, prefill on GPU 0 and decode on GPU 1, every request
                completed, the KV bytes a transfer moved = the model's KV size, the KV path's verdict and
                no tcp among its UCX transports (a GPU's KV cache over sockets is the silent fallback)

Every figure is compared with a value or a band whose source the row names (MFU bands:
workloads/training/expected.py; busbw: workloads/fabric/ceiling.py), never with "> 0".
It prints one table and exits 0 when every row is ok, 1 on any mismatch, 2 when it cannot run
(no GPU: one line says so). Each step's log and records stay under --out. Steps are separate
processes (one torchrun each), with a time limit each.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from workloads import REPO_ROOT as REPO  # the steps run launch/*.py from the checkout
from workloads.core.records import iter_records

EXTERNAL_MIN_RATIO = 0.75  # ours vs all_reduce_perf at the largest size: below this is a mismatch
# NCCL's SHM transport and the CUDA-IPC handles live in /dev/shm; Docker's default 64 MB makes
# NCCL segfault in ncclShmOpen (pytorch/tutorials 0ba3e39 added --shm-size=2gb for exactly
# that); NVIDIA's NGC containers document --shm-size=1g. Below 1 GiB is a mismatch.
SHM_MIN_BYTES = 1 << 30
GRAD_DTYPE = {"ddp": "float32", "zero1": "bfloat16"}  # what the gradient collectives must move at bf16


@dataclass
class Row:
    check: str
    result: str
    expected: str
    status: str  # ok | MISMATCH | n/a
    source: str = ""  # where `expected` comes from: printed as a numbered note under the table

    @property
    def failed(self) -> bool:
        return self.status == "MISMATCH"


def row(check: str, result, expected: str, ok: bool | None, source: str = "") -> Row:
    return Row(check, str(result), expected, "n/a" if ok is None else "ok" if ok else "MISMATCH", source)


# ---- what each step's records must say (pure: records in, rows out) ----

SHM_SOURCE = ("Docker's 64 MB default crashes NCCL in ncclShmOpen (pytorch/tutorials 0ba3e39); "
              "docker run --ipc=host or --shm-size=16g")


def shm_row(total_bytes: int | None) -> Row:
    if total_bytes is None:
        return row("host /dev/shm", "not mounted", ">= 1 GiB", False, SHM_SOURCE)
    return row("host /dev/shm", f"{total_bytes / 2**30:.2f} GiB", ">= 1 GiB", total_bytes >= SHM_MIN_BYTES,
               SHM_SOURCE)


def missing(step: str, exit_code: int | None, limit_s: float | None) -> Row:
    """A step that left no record: say whether it ran out of time, failed, or never ran."""
    if exit_code == 124:
        return row(step, f"timeout: killed after {limit_s:g}s, no record", "a record within the step's limit", False)
    if exit_code is not None:
        return row(step, f"exit {exit_code}, no record (see its log)", "a record", False)
    return row(step, "no record", "a record", False)


def _verdict_row(step: str, rec: dict) -> Row:
    t = (rec.get("fabric") or {}).get("transport") or {}
    v = t.get("verdict")
    return row(f"{step} transport", v if not t.get("message") else f"{v}: {t['message']}", "ok", v == "ok")


def train_rows(step: str, engine: str, rec: dict | None, exit_code: int | None = None,
               limit_s: float | None = None) -> list[Row]:
    if rec is None:
        return [missing(step, exit_code, limit_s)]
    from workloads.training.expected import mfu_check, tflops_check

    rows = [row(f"{step} status", rec.get("status"), "ok", rec.get("status") == "ok")]
    rows.append(row(f"{step} MFU", *mfu_check(rec)))
    rows.append(row(f"{step} TFLOPS/GPU", *tflops_check(rec)))
    rows.append(_verdict_row(step, rec))
    dtype = (rec.get("comm") or {}).get("dtype")
    alone = (rec.get("world") or {}).get("world_size") == 1 and dtype is None  # one GPU: nothing to reduce
    rows.append(row(f"{step} gradient dtype", dtype or "no collective (1 GPU)" if alone else dtype,
                    GRAD_DTYPE[engine], None if alone else dtype == GRAD_DTYPE[engine]))
    return rows


def moe_rows(step: str, rec: dict | None, exit_code: int | None = None, limit_s: float | None = None) -> list[Row]:
    """The MoE training step: status, TFLOPS/GPU (active-expert FLOPs), transport, the
    all-to-all's busbw against this GPU class's link ceiling, and the routing skew (measured,
    no band). The busbw is not recomputed from the record's bytes and time: metrics.py computed
    it from those same sums, so that check could never fail; a timer that missed the exchange
    (events on the wrong stream, a host clock around an async call) reads too short a time, and
    a busbw above what the GPUs' links carry is what shows it."""
    if rec is None:
        return [missing(step, exit_code, limit_s)]
    from workloads.fabric.ceiling import all_reduce_ceiling
    from workloads.training.expected import tflops_check

    m = rec.get("metrics") or {}
    rows = [row(f"{step} status", rec.get("status"), "ok", rec.get("status") == "ok"),
            row(f"{step} TFLOPS/GPU", *tflops_check(rec)), _verdict_row(step, rec)]
    ep, share, busbw = m.get("expert_parallel"), m.get("alltoall_share"), m.get("alltoall_busbw(GB/s)")
    name = f"{step} all-to-all"
    if ep == 1:
        world = (rec.get("world") or {}).get("world_size")
        rows.append(row(name, f"EP=1 (gcd({world}, 8) = 1): no all-to-all", "EP > 1", None,
                        "gpu-check trains at EP = gcd(GPUs, 8)"))
    elif share is None or busbw is None:
        rows.append(row(name, "not measured", "a share of step time and a busbw", False,
                        "workloads/training/metrics.py summarize_moe"))
    else:
        # The all_reduce ceiling's class (NVLink rate, PCIe wire, the line rate across nodes):
        # an all-to-all crosses the same links, and its top (1.2 x line) is what none can beat.
        c = all_reduce_ceiling(rec)
        result = (f"{share:.1%} of step (dispatch {m['dispatch_share']:.1%}, combine {m['combine_share']:.1%}), "
                  f"{busbw:.2f} GB/s busbw, EP={ep}")
        if c.high_gbps is None:
            rows.append(row(name, result, "n/a", None, f"no link ceiling for this class: {c.source}"))
        else:
            rows.append(row(name, result, f"share in (0, 1), busbw <= {c.high_gbps:.0f} GB/s, no floor",
                            0 < share < 1 and busbw <= c.high_gbps,
                            f"the all_reduce ceiling's top for this class ({c.source}); no sourced floor for "
                            "an all-to-all at these sizes"))
    skew = m.get("routing_skew")
    experts = int((((rec.get("model") or {}).get("moe")) or {}).get("num_experts") or 0)
    rows.append(row(f"{step} routing skew", "none" if skew is None else f"{skew:.2f} max/mean tokens per expert",
                    f"measured, no band (1 balanced, {experts} all on one expert)", None,
                    "max/mean of per-expert counts; between 1 and E by arithmetic, so not a check"))
    return rows


def collectives_rows(rec: dict | None, exit_code: int | None = None, limit_s: float | None = None) -> list[Row]:
    if rec is None:
        return [missing("collectives", exit_code, limit_s)]
    m = rec.get("metrics") or {}
    rows = [row("collectives status", rec.get("status"), "ok", rec.get("status") == "ok"),
            row("collectives wrong elements", m.get("wrong_elements"), "0", m.get("wrong_elements") == 0),
            ceiling_row(rec),
            _verdict_row("collectives", rec)]
    return rows + [external_row(rec.get("rows") or [], rec.get("external") or {})]


def _largest_all_reduce(rows: list[dict]) -> tuple[int, float] | None:
    cells = [(r["size"], c["busbw"]) for r in rows if r.get("op") == "all_reduce"
             for c in (r.get("in_place"), r.get("out_of_place")) if c and c.get("busbw") is not None]
    if not cells:
        return None
    size = max(s for s, _ in cells)
    return size, max(b for s, b in cells if s == size)


def ceiling_row(rec: dict) -> Row:
    """all_reduce busbw at the largest size against the band of this machine's class."""
    from workloads.fabric.ceiling import all_reduce_ceiling

    name = "collectives busbw vs ceiling"
    got = _largest_all_reduce(rec.get("rows") or [])
    if got is None:
        return row(name, "no all_reduce row", "a row", False)
    size, busbw = got
    c = all_reduce_ceiling(rec)
    share = f" = {busbw / c.line_gbps:.0%} of line" if c.line_gbps else ""
    return row(name, f"{busbw:.1f} GB/s at {size} B{share}", c.expected(), c.judge(busbw), c.source)


def external_row(ours: list[dict], ext: dict) -> Row:
    """Our all_reduce busbw at the largest size against all_reduce_perf's at the same size."""
    name = "collectives vs all_reduce_perf"
    if ext.get("status") != "ok":
        return row(name, ext.get("reason") or ext.get("status") or "not run", "all_reduce_perf on PATH", None)
    theirs = {r["size"]: r for r in ext.get("rows") or [] if (r.get("in_place") or r.get("out_of_place"))}
    mine = {r["size"]: r for r in ours if r.get("op") == "all_reduce" and r.get("in_place")}
    common = sorted(set(theirs) & set(mine))
    if not common:
        return row(name, "no size in common", "a common size", False)
    size = common[-1]
    a = mine[size]["in_place"]["busbw"]
    b = (theirs[size].get("in_place") or theirs[size]["out_of_place"])["busbw"]
    ratio = a / b if b else 0.0
    return row(name, f"{a:.2f} vs {b:.2f} GB/s at {size} B ({ratio:.2f}x)", f">= {EXTERNAL_MIN_RATIO}x",
               ratio >= EXTERNAL_MIN_RATIO)


PD_NOT_RUN = ("not run: add --pd-python <a Python with vLLM for CUDA and nixl> --pd-model <a local HF model "
              "directory> (docs/gpu.md)")


def pd_rows(step: str, recs: list[dict], exit_code: int | None = None, limit_s: float | None = None) -> list[Row]:
    """server=vllm-pd on one node: the serving rows, then what the KV cache's crossing must show."""
    if not recs:
        return [missing(step, exit_code, limit_s)]
    rows = serve_rows(step, recs, exit_code, limit_s)
    kv = recs[0].get("kv") or {}
    got, want = kv.get("bytes_per_transfer"), kv.get("expected_bytes_per_transfer")
    rows.append(row(f"{step} KV bytes", f"{got} B a transfer over {kv.get('transfers')} transfers (model: {want} B)",
                    "the model's KV size for the prompt, in whole blocks", kv.get("matches_model") is True,
                    "2 x layers x KV heads x head_dim x dtype bytes a token (docs/metrics.md)"))
    path = (recs[0].get("fabric") or {}).get("kv_path") or {}
    used = (path.get("summary") or {}).get("kv_transports") or []
    rows.append(row(f"{step} KV path", f"{path.get('verdict')}: {', '.join(used) or 'no UCX transport logged'}",
                    "ok, not tcp", path.get("verdict") == "ok" and bool(used) and "tcp" not in used,
                    "UCX's own protocol table in the instance's log (docs/verification.md)"))
    share = recs[0].get("metrics", {}).get("kv_ttft_share")
    rows.append(row(f"{step} KV transfer", f"{kv.get('xfer_ms_mean')} ms mean"
                    + (f", {share:.1%} of mean TTFT" if share is not None else ""), "(measured)", None))
    return rows


def serve_rows(step: str, recs: list[dict], exit_code: int | None = None, limit_s: float | None = None) -> list[Row]:
    if not recs:
        return [missing(step, exit_code, limit_s)]
    rows = []
    for rec in recs:
        m = rec.get("metrics") or {}
        ok = rec.get("status") == "ok" and m.get("failed") == 0 and (m.get("completed") or 0) > 0
        rows.append(row(f"{step} point {rec.get('point', '?')}", f"{rec.get('status')}, {m.get('completed')} done, "
                        f"{m.get('failed')} failed, {m.get('output_throughput') or 0:.0f} tok/s",
                        "ok, none failed", ok))
    return rows + [_verdict_row(step, recs[0])]


def render(rows: list[Row], machine: str) -> str:
    notes: dict[str, int] = {}  # source -> its number, in order of first use
    expected = []
    for r in rows:
        if r.source:
            expected.append(f"{r.expected} [{notes.setdefault(r.source, len(notes) + 1)}]")
        else:
            expected.append(r.expected)
    w = [max(len(r.check) for r in rows), min(70, max(len(r.result) for r in rows)), max(len(e) for e in expected)]
    lines = [f"# gpu-check on {machine}", f"{'check':<{w[0]}}  {'result':<{w[1]}}  {'expected':<{w[2]}}  status"]
    for r, e in zip(rows, expected):
        lines.append(f"{r.check:<{w[0]}}  {r.result[:w[1]]:<{w[1]}}  {e:<{w[2]}}  {r.status}")
    lines += [f"# [{n}] {source}" for source, n in notes.items()]
    bad = sum(r.failed for r in rows)
    lines.append(f"# {len(rows) - bad} of {len(rows)} checks ok" + (f", {bad} MISMATCH" if bad else ""))
    return "\n".join(lines)


def exit_code(rows: list[Row]) -> int:
    return 1 if any(r.failed for r in rows) else 0


# ---- running the steps ----

def gpus() -> tuple[int, str]:
    """(visible CUDA GPUs, a description of the machine); with 0, why not, in one line."""
    import torch

    if not torch.cuda.is_available():
        from workloads.core.driver import driver_problem, nvidia_driver

        problem = driver_problem(nvidia_driver(), torch.version.cuda)
        return 0, problem or (f"no GPU here (torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA "
                              "GPU); run it on a CUDA machine with 1-8 GPUs")
    n = torch.cuda.device_count()
    return n, f"{n} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def shm_bytes(path: str = "/dev/shm") -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def records(out: Path, run_id: str) -> list[dict]:
    """The step's records, read the one way every reader meets them (core/records.iter_records)."""
    return [rec for _, rec in iter_records(out / run_id / "records")]


def run_step(name: str, argv: list[str], out: Path, timeout_s: float) -> int:
    log = out / f"{name.replace('/', '-')}.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([sys.executable, *argv], cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    print(f"# {name}: exit {rc} after {time.monotonic() - t0:.0f}s (log {log})", flush=True)
    return rc


PD_LIMIT_S = 300  # two vLLM start-ups of a real model (weights from local disk) and a short sweep


def pd_step(fabric: str, out: Path, python: str, model: str, model_config: str) -> tuple[str, list[str], float]:
    return ("serve/pd", ["launch/infer.py", "server=vllm-pd", f"server.python={python}", f"model={model_config}",
                         f"server.model_path={model}", f"fabric={fabric}", f"output_root={out}",
                         "run_id=gpu-check-pd", "load=concurrency_sweep", "load.points=[1,4]", "load.num_requests=16",
                         "load.warmup_requests=1", "load.dataset.input_len=1024", "load.dataset.output_len=16"],
            PD_LIMIT_S)


def steps(n: int, fabric: str, out: Path) -> list[tuple[str, list[str], float]]:
    common = [f"fabric={fabric}", f"output_root={out}", f"launcher.nproc_per_node={n}"]
    # micro-batch 16: at 4, ZeRO-1's step is host-bound (DeepSpeed's per-step Python), and MFU
    # would measure the CPU, not the GPU path (docs/gpu.md, "The first runs")
    train = ["launch/train.py", "model=neox-125m", "train.precision=bf16", "train.micro_batch_size=16",
             "train.steps=8", "train.warmup_steps=2", *common]
    tp = min(2, n)
    moe = ["launch/train.py", "model=neox-moe-125m", "train.precision=bf16", "train.micro_batch_size=2",
           "train.steps=8", "train.warmup_steps=2", "parallel=ddp", f"parallel.expert_parallel={math.gcd(n, 8)}",
           "run_id=gpu-check-moe", *common]
    return [
        ("train/ddp", [*train, "parallel=ddp", "run_id=gpu-check-ddp"], 120),
        ("train/zero1", [*train, "parallel=zero1", "run_id=gpu-check-zero1"], 150),
        ("train/moe", moe, 80),
        ("collectives", ["launch/collectives.py", "collectives.ops=[all_reduce]", "collectives.minbytes=1M",
                         "collectives.maxbytes=256M", "collectives.iters=20", "run_id=gpu-check-coll", *common], 90),
        (f"serve/tp{tp}", ["launch/infer.py", "server=reference", f"server.tp={tp}", "server.dtype=bf16",
                           "model=neox-125m", f"fabric={fabric}", f"output_root={out}", "run_id=gpu-check-serve",
                           "load=concurrency_sweep", "load.points=[1,8]", "load.num_requests=32", "load.warmup_requests=2",
                           "load.dataset.input_len=256", "load.dataset.output_len=32"], 150),
    ]


def _positive(text: str) -> float:
    x = float(text)
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {x:g}")
    return x


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fabric", default="intranode", help="fabric profile (conf/fabric/); default intranode")
    p.add_argument("--out", default=str(REPO / "results" / f"gpu-check-{time.strftime('%Y%m%d-%H%M%S')}"))
    # the limits fit a warm node; a cold one (torch and DeepSpeed imported by 8 ranks from a
    # shared filesystem) may need more, and a killed step would read as a timeout row
    p.add_argument("--limits-x", type=_positive, default=1.0, help="multiply every step's time limit (default 1)")
    p.add_argument("--pd-python", help="a Python with vLLM for CUDA and nixl: adds the one-node P/D step (2+ GPUs)")
    p.add_argument("--pd-model", help="the P/D step's model: a local Hugging Face directory (nothing is downloaded)")
    p.add_argument("--pd-model-config", default="llama-3.1-8b",
                   help="the conf/model entry --pd-model is (its name and shape in the record; default llama-3.1-8b)")


def run(a: argparse.Namespace) -> int:
    n, machine = gpus()
    if n == 0:
        print(f"gpu-check: {machine}", file=sys.stderr)
        return 2
    n = min(n, 8)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    pd = bool(a.pd_python and a.pd_model)
    if bool(a.pd_python) != bool(a.pd_model):
        print("gpu-check: the P/D step needs both --pd-python and --pd-model", file=sys.stderr)
        return 2
    todo = steps(n, a.fabric, out)
    if pd and n >= 2:
        todo.append(pd_step(a.fabric, out, a.pd_python, a.pd_model, a.pd_model_config))
    done = {name: (run_step(name, args, out, limit * a.limits_x), limit * a.limits_x) for name, args, limit in todo}
    serve = f"serve/tp{min(2, n)}"
    rows = ([shm_row(shm_bytes())]
            + train_rows("train/ddp", "ddp", next(iter(records(out, "gpu-check-ddp")), None), *done["train/ddp"])
            + train_rows("train/zero1", "zero1", next(iter(records(out, "gpu-check-zero1")), None),
                         *done["train/zero1"])
            + moe_rows("train/moe", next(iter(records(out, "gpu-check-moe")), None), *done["train/moe"])
            + collectives_rows(next(iter(records(out, "gpu-check-coll")), None), *done["collectives"])
            + serve_rows(serve, records(out, "gpu-check-serve"), *done[serve]))
    if "serve/pd" in done:
        rows += pd_rows("serve/pd", records(out, "gpu-check-pd"), *done["serve/pd"])
    else:
        rows.append(row("serve/pd", PD_NOT_RUN if not pd else "not run: one GPU (prefill and decode need one each)",
                        "P and D on two GPUs of this node", None))
    print(render(rows, f"{machine}, fabric={a.fabric}"))
    return exit_code(rows)


def main(argv: list[str] | None = None) -> int:
    """`fabricbench gpu-check ARGS`, also as `python -m workloads.commands.gpu_check ARGS`."""
    from workloads.commands.cli import main as fabricbench

    return fabricbench(["gpu-check", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
