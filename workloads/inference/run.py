"""The inference workload: validate, start the server, run every load point, one record each.

`run_sweep(cfg)` is what launch/infer.py calls. Order: everything checkable without a
server (config, dataset, tokenizer, TP vs heads) is checked first; points that already
have an ok record in <run dir>/records are skipped (resume with the same run_id=); the
server is started once for the remaining points and always stopped.
"""

from __future__ import annotations

import importlib.util
import copy
import json
import math
import os
import signal
from types import SimpleNamespace
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from workloads.core import rundir
from workloads.core.errors import TransportMismatch, UsageError
from workloads.fabric.profile import FabricProfile
from workloads.inference.loadgen.arrivals import Arrival
from workloads.inference.loadgen.backends import get_backend
from workloads.inference.loadgen.datasets import PromptPlan, load_tokenizer
from workloads.inference.metrics import parse_slo, summarize
from workloads.inference.loadgen.point import LoadPoint, planned_requests, run_point
from workloads.core.loggers import build_loggers, flatten
from workloads.fabric.preflight import preflight
from workloads.core.records import check_writable, write_record
from workloads.core.session import base_record
from workloads.fabric.verify import TRANSPORT_FILE_ENV, group_members, server_transport
from workloads.inference.adapters import get_adapter
from workloads.inference.adapters.base import ServerSpec, check_tp_divides
from workloads.inference.adapters.orchestrator import ManagedServer, log_tail

WORKLOAD = "inference"
# server.* keys that belong to the orchestrator, not to the reference engine's own config.
_ORCHESTRATOR_KEYS = {"adapter", "host", "port", "nnodes", "node_rank", "dist_init_addr", "model_path", "extra_args",
                      "env", "url", "health_path", "ready_timeout_s", "stop_timeout_s"}


def arrivals(load: DictConfig) -> list[Arrival]:
    kind = str(load.arrival)
    pts = list(load.points or [])
    if not pts:
        raise UsageError("load.points is empty; give the concurrencies (closed loop) or rates (open loop) to sweep")
    cap = int(load.max_concurrency) if load.get("max_concurrency") else None
    out = []
    for v in pts:
        if kind == "closed":
            out.append(Arrival("closed", concurrency=int(v)))
        else:
            out.append(Arrival(kind, rate=float(v), burstiness=float(load.burstiness), max_concurrency=cap))
    return out


def _reference_overrides(overrides: list[str]) -> tuple[str, ...]:
    """CLI overrides the reference engine must see too (its model shape, its server knobs)."""
    keep = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        if key.startswith("model.") or key == "seed" or key.startswith("dist."):
            keep.append(o)
        elif key.startswith("server.") and key.split(".")[1] not in _ORCHESTRATOR_KEYS | {"tp"}:
            keep.append(o)
    return tuple(keep)


def validate(cfg: DictConfig, overrides: list[str]):
    fabric = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    scfg = OmegaConf.to_container(cfg.server, resolve=True)
    if scfg.get("name") == "reference" and not scfg.get("tp"):
        scfg["tp"] = 1
    spec = ServerSpec.from_config(scfg)
    adapter = get_adapter(spec.adapter)
    if spec.adapter != "external":  # a server started here runs on this host's fabric
        preflight(fabric)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    if spec.adapter != "external":
        check_tp_divides(spec.tp, model)
    if spec.adapter == "sglang" and not spec.python and importlib.util.find_spec("sglang") is None:
        raise UsageError("server=sglang: SGLang is not installed in this Python; run in the sglang container "
                         "(Dockerfile target sglang) or set server.python (FB_ENGINE_PYTHON) to an interpreter that has it")
    launch = adapter.command(spec, model, fabric.name,
                             _reference_overrides(overrides) if spec.adapter == "reference" else ())
    load = cfg.load
    backend = get_backend(str(load.backend))
    points = arrivals(load)
    if load.num_requests is None and load.duration_s is None:
        raise UsageError("set load.num_requests (requests per point) or load.duration_s (seconds per point)")
    if load.num_requests is not None and int(load.num_requests) <= 0:
        raise UsageError(f"load.num_requests={load.num_requests} must be positive")
    if load.duration_s is not None and load.num_requests is None and any(
            not a.open_loop or math.isinf(a.rate) for a in points) and str(load.arrival) == "burst":
        raise UsageError("load.arrival=burst sends a fixed batch: use load.num_requests, not load.duration_s")
    slo = parse_slo(load.get("slo"))
    if float(load.request_timeout_s) <= 0:
        raise UsageError(f"load.request_timeout_s={load.request_timeout_s} must be positive")
    tokenizer = load_tokenizer(load.get("tokenizer"))
    nreq = int(load.num_requests) if load.num_requests is not None else None
    dur = float(load.duration_s) if load.duration_s is not None else None
    plan = PromptPlan(OmegaConf.to_container(load.dataset, resolve=True), tokenizer,
                      int(model.get("vocab_size") or 1000), int(load.seed), int(load.warmup_requests),
                      [planned_requests(a, nreq, dur) for a in points], warn=lambda m: print(m, flush=True))
    first = plan.point(0)
    specs = first.warmup + first.measured
    flush = load.get("flush_cache_path")
    if flush is not None and not str(flush).startswith("/"):
        raise UsageError(f"load.flush_cache_path={flush!r} must be a path on the server starting with '/' "
                         "(e.g. /flush_cache for SGLang) or null")
    limit = model.get("max_position_embeddings")
    if limit and spec.adapter != "external":
        longest = max(s.prompt_len + s.output_len for s in specs)
        if longest > int(limit):
            raise UsageError(
                f"the longest request needs {longest} positions (prompt + output) but model {model.get('name')} "
                f"allows {limit}; lower load.dataset.input_len/output_len (e.g. load=cpu_sweep for the tiny "
                "reference model) or choose a larger model=")
    if backend.name == "chat" and not isinstance(specs[0].prompt, str):
        raise UsageError("load.backend=chat needs text prompts: set load.tokenizer=<local tokenizer dir>")
    check_writable(cfg.output_root)
    return fabric, spec, launch, backend, points, slo, plan


# Config keys a resumed sweep may change without invalidating the points already measured.
_RESUMABLE = ("load.points", "trial", "logger", "run_id", "output_root")


def _done_points(records_dir: Path, cfg: DictConfig) -> set[str]:
    """Points this run directory already measured for this trial. A record measured with
    another configuration (other than the sweep's point list) is an error, not a resume:
    reusing it would silently mix two experiments under one run_id."""
    mine = flatten(OmegaConf.to_container(cfg, resolve=True), sep=".")
    done = set()
    for p in sorted(records_dir.glob("*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if rec.get("workload") != WORKLOAD:
            continue
        theirs = flatten(rec.get("config") or {}, sep=".")
        differ = sorted(k for k in set(mine) | set(theirs)
                        if not k.startswith(_RESUMABLE) and mine.get(k) != theirs.get(k))
        if differ:
            shown = ", ".join(f"{k}: {theirs.get(k)!r} -> {mine.get(k)!r}" for k in differ[:6])
            more = f" and {len(differ) - 6} more" if len(differ) > 6 else ""
            raise UsageError(f"run_id={records_dir.parent.name} already holds points measured with another "
                             f"configuration ({shown}{more}); pass a new run_id= to measure this one")
        if rec.get("status") == "ok" and theirs.get("trial", 0) == mine.get("trial", 0):
            done.add(rec.get("point"))
    return done


class _Terminated(Exception):
    pass


def _on_sigterm(signum, frame):
    raise _Terminated(f"received signal {signum}")


def run_sweep(cfg: DictConfig, overrides: list[str] | None = None) -> int:
    overrides = list(overrides or [])
    fabric, spec, launch, backend, points, slo, plan = validate(cfg, overrides)
    run_dir = Path(rundir.run_dir(cfg.output_root, cfg.get("run_id")))
    records = run_dir / "records"
    done = _done_points(records, cfg)
    todo = [a for a in points if a.label() not in done]
    for a in points:
        if a.label() in done:
            print(f"point {a.label()}: already recorded in {records}, skipped", flush=True)
    if not todo:
        print("every point of this sweep is recorded; nothing to do", flush=True)
        return 0
    env = dict(os.environ)
    applied = fabric.apply(run_dir, env)  # the server's environment, not this process's
    reported = run_dir / "server" / f"transport-{os.getpid()}.json"
    env[TRANSPORT_FILE_ENV] = str(reported)  # the reference engine writes its own verdict here
    load = cfg.load
    base = base_record(WORKLOAD, cfg, fabric, applied, run_dir.name, overrides,
                model=OmegaConf.to_container(cfg.model, resolve=True),
                server={"adapter": spec.adapter, "tp": spec.tp, "nnodes": spec.nnodes, "url": spec.base_url,
                        "argv": launch.argv, "log": str(run_dir / "server" / f"{spec.adapter}.log") if launch.argv else None})
    failed = 0
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from workloads.core.records import fingerprint

        fp = fingerprint()
        with ManagedServer(spec, launch, run_dir, env) as srv:
            # The server runs in its own session: its process group is every process it started.
            pids = group_members(srv.proc.pid) if srv.proc else []
            transport = server_transport(fabric, run_dir, reported, pids, spec.tp)
            base["fabric"]["transport"] = transport
            if transport.get("message"):
                if transport["verdict"] == "mismatch" and fabric.verify == "fail":
                    raise TransportMismatch(transport["message"] + " (fabric.verify=warn records it and goes on)")
                print(f"warning: {transport['message']}", flush=True)
            for k, a in enumerate(points):
                if a.label() in done:
                    continue
                failed += not _run_one(a, srv, backend, launch.model_name, plan.point(k), slo, load, base, fp,
                                       records, cfg)
                plan.release(k)
                if not srv.alive():
                    raise UsageError(f"server={spec.adapter} exited during point {a.label()}; the end of its log "
                                     f"({srv.log_path}):\n{log_tail(srv.log_path)}")
    except _Terminated as e:
        raise UsageError(f"stopped ({e}); the server was shut down and finished points are kept in {records}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 1 if failed else 0


def flush_cache(base_url: str, path: str, timeout_s: float = 60.0) -> None:
    """POST <server><path> (SGLang: /flush_cache) so this point starts with an empty prefix cache."""
    import urllib.error
    import urllib.request

    url = base_url.rstrip("/") + path
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=timeout_s) as r:
            r.read()
    except urllib.error.HTTPError as e:
        raise UsageError(f"load.flush_cache_path: POST {url} answered HTTP {e.code}; give the server's cache-flush "
                         "endpoint (SGLang: /flush_cache) or null") from None
    except (OSError, urllib.error.URLError) as e:
        raise UsageError(f"load.flush_cache_path: POST {url} failed ({e}); give the server's cache-flush endpoint "
                         "(SGLang: /flush_cache) or null") from None


def _run_one(a: Arrival, srv, backend, model_name, prompts, slo, load, base, fp, records: Path, cfg) -> bool:
    flush = load.get("flush_cache_path")
    if flush:
        flush_cache(srv.base_url, str(flush), float(load.request_timeout_s))
    # Each point's record starts from the sweep's shared fields, stamped when the point starts.
    rec = copy.deepcopy(base) | dict(
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), point=a.label(),
        arrival={"kind": a.kind, "rate": a.rate, "burstiness": a.burstiness, "concurrency": a.concurrency,
                 "max_concurrency": a.max_concurrency},
        dataset=prompts.info | {"cache_flushed": bool(flush)}, fingerprint=fp, metrics={}, samples={})
    stem = f"{WORKLOAD}-{cfg.fabric.name}-{cfg.model.name}-{base['server']['adapter']}-tp{base['server']['tp']}-{a.label()}"
    point = LoadPoint(srv.base_url, backend, model_name, prompts.measured, a,
                      num_requests=int(load.num_requests) if load.num_requests is not None else None,
                      duration_s=float(load.duration_s) if load.duration_s is not None else None,
                      warmup_requests=int(load.warmup_requests), timeout_s=float(load.request_timeout_s),
                      seed=int(load.seed), extra_body=dict(load.extra_body or {}), lag_warn_ms=float(load.lag_warn_ms),
                      warmup_specs=prompts.warmup)
    try:
        res = run_point(point, warn=lambda m: print(m, flush=True))
        m = summarize(res.results, res.duration_s, slo)
        rec["metrics"] = m | res.lag_stats() | {"warmup_failed": sum(not r.ok for r in res.warmup)}
        rec["dataset"]["repeats_within_point"] = res.prompt_repeats
        rec["samples"] = {"requests": [r.as_row() for r in res.results], "cap_wait_s": res.cap_wait_s}
        rec["status"] = "ok" if m["completed"] > 0 else "failed"
        if m["completed"] == 0:
            rec["error"] = f"no request completed; errors: {m['errors'][:3]}"
    except KeyboardInterrupt:
        rec["status"], rec["error"] = "failed", "interrupted"
        raise
    except Exception as e:
        rec["status"], rec["error"] = "failed", f"{type(e).__name__}: {e}"
        rec["traceback"] = traceback.format_exc()
    finally:
        path = write_record(records, rec, stem)
        # One W&B run per point, as one record per point (after the record is on disk).
        loggers = build_loggers(cfg, SimpleNamespace(is_main=True, world_size=base["server"]["tp"],
                                                     nodes=base["server"]["nnodes"]), label=a.label())
        loggers.log_summary(rec)
        loggers.close()
    _print_point(rec, path)
    return rec["status"] == "ok"


def _print_point(rec: dict[str, Any], path: Path) -> None:
    m = rec["metrics"]
    if rec["status"] != "ok":
        print(f"point {rec['point']}: FAILED ({rec['error']}); record: {path}", flush=True)
        return

    def f(k, spec=".1f"):
        return "n/a" if m.get(k) is None else format(m[k], spec)

    print(f"point {rec['point']}: {m['completed']} ok / {m['failed']} failed in {m['duration']:.2f} s | "
          f"req/s {f('request_throughput', '.2f')} | out tok/s {f('output_throughput')} | "
          f"TTFT median {f('median_ttft_ms')} p99 {f('p99_ttft_ms')} ms | TPOT median {f('median_tpot_ms')} ms | "
          f"ITL median {f('median_itl_ms')} ms | send lag p99 {f('p99_send_lag_ms', '.3f')} ms | {path}", flush=True)
    if m["errors"]:
        print(f"  errors: {m['errors'][:3]}", flush=True)
