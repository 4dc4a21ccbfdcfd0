"""The inference workload: validate, start the server, run every load point, one record each.

`run_sweep(cfg)` is what launch/infer.py calls. Order: everything checkable without a
server (config, dataset, tokenizer, TP vs heads) is checked first; points that already
have an ok record in <run dir>/records are skipped (resume with the same run_id=); the
server is started once for the remaining points and always stopped.

A point is `ok` only when it ran as asked: more failed requests than
`load.max_failed_fraction` (default 0: any) make it `partial` (some completed) or
`failed`, with the counts in its error; a server that died during it makes it `failed`
with the server's exit code. Only `ok` points count as done on resume.
"""

from __future__ import annotations

import copy
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from workloads import session
from workloads.core import hostmem, rundir, timeline
from workloads.core.errors import Fault, RecordNotWritten, TransportMismatch, UsageError
from workloads.core.records import flatten, iter_records, json_safe
from workloads.fabric.netns import emulated_nodes
from workloads.fabric.noisemeter import PointMeter
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify_server import TRANSPORT_FILE_ENV, server_transport
from workloads.inference.adapters import Adapter, get_adapter
from workloads.inference.adapters.base import Launch, ServerSpec, check_weights
from workloads.inference.adapters.orchestrator import ManagedServer, log_tail
from workloads.inference.loadgen.arrivals import Arrival
from workloads.inference.loadgen.backends import get_backend
from workloads.inference.loadgen.datasets import PromptPlan, load_tokenizer, run_salt
from workloads.inference.loadgen.mlperf import MlperfSettings, mlperf_section, run_mlperf
from workloads.inference.loadgen.point import LoadPoint, loop_factory, planned_requests, run_load
from workloads.inference.metrics import parse_slo, summarize
from workloads.models.tp import check_tp_divides

WORKLOAD = "inference"


@dataclass(frozen=True)
class LoadSettings:
    """How every point of the sweep is driven (conf/load/*.yaml), validated once."""

    num_requests: int | None
    duration_s: float | None
    warmup_requests: int
    timeout_s: float
    seed: int
    extra_body: dict
    lag_warn_ms: float
    flush_cache_path: str | None
    max_failed_fraction: float  # a point is ok only when at most this share of its requests failed
    event_loop: str           # auto | uvloop | asyncio (loadgen/point.py loop_factory)
    max_requests: int | None = None  # the memory bound of a point (check_memory); None: unknown
    mlperf: MlperfSettings | None = None  # load.arrival=mlperf: LoadGen drives each point

    def point(self, base_url: str, backend, model_name: str, prompts, arrival: Arrival) -> LoadPoint:
        return LoadPoint(base_url, backend, model_name, prompts.measured, arrival, num_requests=self.num_requests,
                         duration_s=self.duration_s, warmup_requests=self.warmup_requests, timeout_s=self.timeout_s,
                         seed=self.seed, extra_body=self.extra_body, lag_warn_ms=self.lag_warn_ms,
                         warmup_specs=prompts.warmup, event_loop=self.event_loop, max_requests=self.max_requests)


@dataclass(frozen=True)
class SweepPlan:
    """One inference sweep, validated before any server starts; below run_sweep nothing
    reads the Hydra config."""

    fabric: FabricProfile
    spec: ServerSpec
    adapter: Adapter
    launch: Launch
    backend: Any              # loadgen.backends.Backend
    points: tuple[Arrival, ...]
    slo: dict
    prompts: PromptPlan       # per-point prompts, never reused within the sweep
    load: LoadSettings
    model_name: str           # the config's model label (records and file names)
    model: dict               # the model: section, resolved (the record's `model`, an adapter's observer)
    run: session.RunContext

    def stem(self, a: Arrival) -> str:
        return f"{WORKLOAD}-{self.fabric.name}-{self.model_name}-{self.spec.adapter}-tp{self.spec.tp}-{a.label()}"


def arrivals(load: DictConfig) -> list[Arrival]:
    kind = str(load.arrival)
    pts = list(load.points or [])
    if not pts:
        raise UsageError("load.points is empty; give the concurrencies (closed loop) or rates (open loop) to sweep")
    cap = int(load.max_concurrency) if load.get("max_concurrency") else None
    out = []
    for v in pts:
        if kind == "closed":
            if v != int(v):
                raise UsageError(f"load.points={pts}: a closed loop's points are concurrencies, whole numbers")
            out.append(Arrival("closed", concurrency=int(v)))
        elif kind == "mlperf":
            out.append(Arrival("mlperf", rate=float(v)))  # Server's target QPS, Offline's expected QPS
        else:
            out.append(Arrival(kind, rate=float(v), burstiness=float(load.burstiness), max_concurrency=cap))
    return out


def _load_settings(load: DictConfig, points: list[Arrival]) -> LoadSettings:
    if load.num_requests is None and load.duration_s is None:
        raise UsageError("set load.num_requests (requests per point) or load.duration_s (seconds per point)")
    if load.num_requests is not None and int(load.num_requests) <= 0:
        raise UsageError(f"load.num_requests={load.num_requests} must be positive")
    if load.duration_s is not None and load.num_requests is None and any(
            not a.open_loop or math.isinf(a.rate) for a in points) and str(load.arrival) == "burst":
        raise UsageError("load.arrival=burst sends a fixed batch: use load.num_requests, not load.duration_s")
    if float(load.request_timeout_s) <= 0:
        raise UsageError(f"load.request_timeout_s={load.request_timeout_s} must be positive")
    flush = load.get("flush_cache_path")
    if flush is not None and not str(flush).startswith("/"):
        raise UsageError(f"load.flush_cache_path={flush!r} must be a path on the server starting with '/' "
                         "(e.g. /flush_cache for SGLang) or null")
    event_loop = str(load.get("event_loop") or "auto")
    loop_factory(event_loop)  # a bad load.event_loop fails before the server starts
    return LoadSettings(
        num_requests=int(load.num_requests) if load.num_requests is not None else None,
        duration_s=float(load.duration_s) if load.duration_s is not None else None,
        warmup_requests=int(load.warmup_requests), timeout_s=float(load.request_timeout_s), seed=int(load.seed),
        extra_body=dict(load.extra_body or {}), lag_warn_ms=float(load.lag_warn_ms),
        flush_cache_path=None if flush is None else str(flush),
        max_failed_fraction=float(load.get("max_failed_fraction", 0.0)), event_loop=event_loop,
        mlperf=MlperfSettings.from_keys(str(load.get("scenario") or "Offline"), dict(load.get("mlperf") or {}))
        if str(load.arrival) == "mlperf" else None)


def request_bytes(input_len: int, output_len: int) -> int:
    """Host memory one measured request holds until its point's record is written: its prompt
    (~40 B a token as Python ints, and its digest in the sweep's seen-set), its result (~40 B
    a streamed token: one ITL float each) and its row of the record, as objects and as JSON.
    Measured: 4.6 KiB at 64+16 tokens, 48 KiB at 1024+128; this rounds up."""
    return 48 * (input_len + output_len) + 2048


def check_memory(settings: LoadSettings, points: list[Arrival], dataset: dict, room=None) -> int | None:
    """A point keeps every request's prompt and samples in memory until its record is written,
    so an impossible request count is refused here, with what it would need, rather than
    growing until the kernel's OOM killer picks a process (on a shared node, maybe another
    job's). A point may use half of what this process can still allocate: the other half is
    the server's (the reference engine runs on this host) and everyone else's."""
    room = room or hostmem.headroom()
    if room is None:
        return None
    most = max(planned_requests(a, settings.num_requests, settings.duration_s) for a in points)

    def tokens(key: str) -> int:  # sharegpt caps a pair at 1024 prompt and 2048 total tokens
        try:
            return int(dataset.get(key) or 1024)
        except (TypeError, ValueError):
            return 1024

    n_in, n_out = tokens("input_len"), tokens("output_len")
    per, budget = request_bytes(n_in, n_out), room.bytes // 2
    if most * per > budget:
        rates = [a.rate for a in points if a.open_loop and a.rate is not None and not math.isinf(a.rate)]
        what = (f"load.num_requests={settings.num_requests}" if settings.num_requests is not None
                else f"load.duration_s={settings.duration_s:g}" + (f" at rate {max(rates):g}/s" if rates else ""))
        raise UsageError(f"{what}: a point keeps {most} requests' prompts and samples ({n_in}+{n_out} tokens each) in "
                         f"memory, about {most * per / 2**30:.1f} GiB, but a point may use half of the "
                         f"{room.gib()} this process may allocate ({room.where}); at most {budget // per} requests per point "
                         "fit: lower it, or repeat the point as trials (-m trial=0,1,...)")
    return budget // per  # a closed loop run for a time stops there (its count is not known before)


def _check_prompts(plan: PromptPlan, model: dict, adapter: Adapter, backend) -> None:
    first = plan.point(0)
    specs = first.warmup + first.measured
    limit = model.get("max_position_embeddings")
    if limit and adapter.starts_process:
        longest = max(s.prompt_len + s.output_len for s in specs)
        if longest > int(limit):
            raise UsageError(
                f"the longest request needs {longest} positions (prompt + output) but model {model.get('name')} "
                f"allows {limit}; lower load.dataset.input_len/output_len (e.g. load=cpu_sweep for the tiny "
                "reference model) or choose a larger model=")
    if backend.name == "chat" and not isinstance(specs[0].prompt, str):
        raise UsageError("load.backend=chat needs text prompts: set load.tokenizer=<local tokenizer dir>")


def validate(cfg: DictConfig, overrides: list[str]) -> SweepPlan:
    """Everything checkable before a server starts. Raises UsageError."""
    spec = replace(ServerSpec.from_config(OmegaConf.to_container(cfg.server, resolve=True)),
                   run_dir=rundir.run_dir(cfg.output_root, cfg.get("run_id")))
    adapter = get_adapter(spec.adapter)
    # A server started here runs on this host's fabric; an external one is not ours to check,
    # nor is one whose ranks run in emulated nodes (they check their namespaces themselves).
    # The engine's own interpreter (its torch, its NCCL) runs the backend, not this one.
    fabric = session.prepare(cfg, local=adapter.starts_process and emulated_nodes() is None, backend=False)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    if adapter.starts_process:
        check_tp_divides(spec.tp, model)
    adapter.check_available(spec, OmegaConf.to_container(cfg.server, resolve=True))
    launch = adapter.command(spec, model, _chosen("fabric", fabric.name), adapter.forwarded_overrides(overrides))
    if adapter.loads_weights and launch.argv and shutil.which(launch.argv[0]):  # one not installed says so at start
        check_weights(spec, model)
    load = cfg.load
    backend = get_backend(str(load.backend))
    points = arrivals(load)
    settings = _load_settings(load, points)
    settings = replace(settings, max_requests=check_memory(settings, points,
                                                           OmegaConf.to_container(load.dataset, resolve=True)))
    slo = parse_slo(load.get("slo"))
    tokenizer = load_tokenizer(load.get("tokenizer"))
    plan = PromptPlan(OmegaConf.to_container(load.dataset, resolve=True), tokenizer,
                      int(model.get("vocab_size") or 1000), settings.seed, settings.warmup_requests,
                      [planned_requests(a, settings.num_requests, settings.duration_s) for a in points],
                      warn=lambda m: print(m, flush=True),
                      salt=run_salt(Path(spec.run_dir).name, int(cfg.get("trial") or 0)))
    _check_prompts(plan, model, adapter, backend)
    return SweepPlan(fabric, spec, adapter, launch, backend, tuple(points), slo, plan, settings, str(cfg.model.name),
                     model, session.context(cfg))


def _chosen(group: str, default: str) -> str:
    """The config group option this job chose (fabric=emu-100m), which an engine started with
    our configs must choose too; a `name` inside it may differ (fabric.name=emu-100mbit)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return HydraConfig.get().runtime.choices.get(group) or default
    except ValueError:  # composed outside a Hydra run (tests, the study planner)
        return default


# Config keys a resumed sweep may change without invalidating the points already measured.
_RESUMABLE = ("load.points", "load.max_failed_fraction", "trial", "logger", "run_id", "output_root")


def _done_points(records_dir: Path, config: dict) -> set[str]:
    """Points this run directory already measured for this trial. A record measured with
    another configuration (other than the sweep's point list) is an error, not a resume:
    reusing it would silently mix two experiments under one run_id. `config` is the resolved
    config (session.RunContext.config)."""
    mine = flatten(json_safe(config), sep=".")  # as records store it
    done = set()
    for p, rec in iter_records(records_dir):
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


def run_sweep(cfg: DictConfig, overrides: list[str] | None = None) -> int:
    overrides = list(overrides or [])
    plan = validate(cfg, overrides)
    run = plan.run
    run_dir = Path(rundir.run_dir(run.output_root, run.run_id))
    records = run_dir / "records"
    done = _done_points(records, run.config)
    for a in plan.points:
        if a.label() in done:
            print(f"point {a.label()}: already recorded in {records}, skipped", flush=True)
    if all(a.label() in done for a in plan.points):
        print("every point of this sweep is recorded; nothing to do", flush=True)
        return 0
    env = dict(os.environ)
    applied = plan.fabric.apply(run_dir, env)  # the server's environment, not this process's
    reported = run_dir / "server" / f"transport-{os.getpid()}.json"
    env[TRANSPORT_FILE_ENV] = str(reported)  # the reference engine writes its own verdict here
    spec, launch = plan.spec, plan.launch
    base = session.base_record(
        WORKLOAD, run, plan.fabric, applied, run_dir.name, overrides,
        model=copy.deepcopy(plan.model),  # the record's own; the plan's stays as validated
        server={"adapter": spec.adapter, "tp": spec.tp, "nnodes": spec.nnodes, "url": spec.base_url,
                "argv": launch.argv, "env": launch.env,  # what the adapter added (SGLang's CPU recipe)
                "log": str(run_dir / "server" / f"{spec.adapter}.log") if launch.argv else None})

    # what each point's tracker run is told (one run per point, as one record per point): the
    # server's ranks, since this process is the one writer and in no process group
    trackers = SimpleNamespace(is_main=True, world_size=spec.tp, nodes=spec.nnodes)

    from workloads.core.fingerprint import fingerprint
    from workloads.core.records import with_tuned
    from workloads.inference.engine_info import engine_versions

    # the engine's own torch/NCCL (its image's interpreter), beside this process's
    fp = with_tuned({**fingerprint(), "engine": engine_versions(launch.engine_argv or launch.argv)}, run.config)
    failed = 0
    started = time.time()  # logs older than this are an earlier server's (a resumed run id)
    obs = plan.adapter.observer(spec, copy.deepcopy(plan.model)) if plan.adapter.observer \
        else None
    with ManagedServer(spec, launch, run_dir, env) as srv:
        _verify_server(plan.fabric, run_dir, reported, base, plan.spec.tp, started, srv.pids())
        if obs is not None:
            _verify_observed(plan.fabric, obs, base)
        for k, a in enumerate(plan.points):
            if a.label() in done:
                continue
            failed += not _run_one(plan, k, srv, base, fp, records, trackers, obs)
            plan.prompts.release(k)
            if not srv.alive():
                raise Fault(f"{_server_death(srv, a)}; its record is kept as failed; {_log_reason(srv.log_path)}")
    return 1 if failed else 0


def _verify_server(fabric: FabricProfile, run_dir: Path, reported: Path, base: dict, tp: int, since: float,
                   pids: list[int]) -> None:
    """The transport the server's ranks used (every one of the `tp` ranks: the sockets of its
    processes `pids`, or logs written since this server started), into every point's record;
    a mismatch stops the sweep under fabric.verify=fail."""
    transport = server_transport(fabric, run_dir, reported, ranks=tp, since=since, pids=pids)
    base["fabric"]["transport"] = transport
    if transport.get("message"):
        if transport["verdict"] == "mismatch" and fabric.verify == "fail":
            raise TransportMismatch(transport["message"] + " (fabric.verify=warn records it and goes on)")
        print(f"warning: {transport['message']}", flush=True)


def _verify_observed(fabric: FabricProfile, obs, base: dict) -> None:
    """The adapter's own verdict (server=vllm-pd: which UCX transports carried the KV cache),
    beside the transport's in every record; a mismatch stops the sweep under fabric.verify=fail."""
    for key, v in (obs.verify(fabric) or {}).items():
        base["fabric"][key] = v
        if v.get("message"):
            if v["verdict"] == "mismatch" and fabric.verify == "fail":
                raise TransportMismatch(v["message"] + " (fabric.verify=warn records it and goes on)")
            print(f"warning: {v['message']}", flush=True)


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


def _run_one(plan: SweepPlan, k: int, srv, base: dict, fp: dict, records: Path, trackers: Any,
             obs=None) -> bool:
    """Measure point `k` in session.run_point, as every workload measures a point: its record
    written however it ends, then its line, then its tracker run. A point that fails is
    recorded and the sweep goes on; a stop, or a record the filesystem refused, ends it."""
    a, prompts, flush = plan.points[k], plan.prompts.point(k), plan.load.flush_cache_path
    if flush:
        flush_cache(srv.base_url, flush, plan.load.timeout_s)
    # Each point's record starts from the sweep's shared fields, stamped when the point starts.
    rec = copy.deepcopy(base) | dict(
        created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), point=a.label(),
        arrival={"kind": a.kind, "rate": a.rate, "burstiness": a.burstiness, "concurrency": a.concurrency,
                 "max_concurrency": a.max_concurrency},
        dataset=prompts.info | {"cache_flushed": bool(flush)}, fingerprint=fp, metrics={}, samples={})
    point = plan.load.point(srv.base_url, plan.backend, plan.launch.model_name, prompts, a)

    def measure() -> None:
        # An emulated run's background traffic (fabric/noise.py), counted around the load alone:
        # not the summary and sample rows built after it, which would dilute its rate.
        noise = PointMeter()
        mark = obs.begin() if obs is not None else None
        res, lg_run = _drive(plan, point, records / f"{plan.stem(a)}.loadgen")
        done = time.time()
        # the point's measured requests (its warm-up came before them) on the run's clock: the
        # study's duty cycle and a report's time to the verdict count a sweep's points by it
        timeline.window(done - res.duration_s, done)
        noise.stamp(rec)
        m = summarize(res.results, res.duration_s, plan.slo)
        # the engine's own account of the point (vllm-pd: its KV transfers), its headline figures
        # among the metrics (so comparisons see them), the rest in fields of its own
        extra = obs.end(mark, res.results, res.warmup) if obs is not None else {}
        rec["metrics"] = m | res.lag_stats() | {"warmup_failed": sum(not r.ok for r in res.warmup)} | \
            extra.pop("metrics", {})
        rec.update(extra)
        rec["dataset"]["repeats_within_point"] = res.prompt_repeats
        rec["dataset"] |= cache_report(res.results, a.label(), warn=lambda m: print(m, flush=True))
        rec["samples"] = {"requests": [r.as_row() for r in res.results], "cap_wait_s": res.cap_wait_s}
        rec["client"] = {"event_loop": res.event_loop}
        rec["status"], rec["error"] = point_status(m, plan.load.max_failed_fraction)
        if lg_run is not None:
            _add_mlperf(rec, lg_run, plan.load.mlperf, records / f"{plan.stem(a)}.loadgen", records)
        if res.capped and rec["status"] == "ok":  # it did not run for as long as asked
            rec["status"], rec["error"] = "partial", (
                f"stopped after {len(res.results)} requests in {res.duration_s:.1f} s of load.duration_s="
                f"{plan.load.duration_s:g}: the most whose samples fit in memory; lower load.duration_s")
        if srv.died(within_s=2.0 if m["failed"] else 0.0):
            rec["status"], rec["error"] = "failed", _server_death(srv, a)

    try:
        session.run_point(session.Point(rec, records, plan.stem(a), trackers), measure, plan.run.tracking, summarize=_print_point,
                          group=False, label=a.label(), describe=_point_failure, noise=False)
    except RecordNotWritten:
        raise  # the filesystem refused the record: its one line says where it is kept
    except Exception:  # noqa: BLE001 - recorded (error and traceback); the next point may well run
        pass
    return rec["status"] == "ok"


def _drive(plan: SweepPlan, point: LoadPoint, logs: Path):
    """(the point's requests, LoadGen's run or None): LoadGen drives it under load=mlperf, writing
    its logs to `logs`; the project's own generator otherwise."""
    if plan.load.mlperf is None:
        return run_load(point, warn=lambda m: print(m, flush=True)), None
    return run_mlperf(point, plan.load.mlperf, logs)


def _add_mlperf(rec: dict, lg_run, ms: MlperfSettings, logs: Path, records: Path) -> None:
    """LoadGen's verdict and figures beside the project's own metrics of the same requests."""
    rec["mlperf"] = mlperf_section(lg_run, ms, logs, records)
    if lg_run.value is not None:
        rec["metrics"][f"mlperf_{lg_run.metric}"] = lg_run.value


def _point_failure(exc: BaseException, tb) -> tuple[str, str | None]:
    """A point's error as sweeps record it (session.Recorded's `describe`): "interrupted" for
    Ctrl-C or SIGTERM; anything else, a UsageError included, with its type and traceback, since
    inside a point it is the server's or the client's doing, not a config line to fix."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", None
    return session.traced(exc, tb)


def cache_report(results, label: str, warn: Callable[[str], None] = print) -> dict[str, Any]:
    """What the server says it answered from its prefix cache, where it says it (`cached_tokens`
    of the requests' usage): a point served from cache had less prefill, and less of the
    prefill traffic a fabric comparison measures, than its prompts' lengths suggest."""
    told = [r.cached_tokens for r in results if r.cached_tokens is not None]
    if not told:
        return {"cached_prompt_tokens": None, "served_from_cache": None}  # the server does not report it
    cached = sum(told)
    if cached:
        warn(f"warning: point {label}: the server answered {cached} prompt tokens of {sum(1 for t in told if t)} "
             f"requests from its prefix cache; their TTFT and prefill traffic are lower than a cold run's. Flush it "
             "before each point (load.flush_cache_path) or use a server that has not seen these prompts.")
    return {"cached_prompt_tokens": cached, "served_from_cache": cached > 0}


def point_status(m: dict[str, Any], max_failed_fraction: float) -> tuple[str, str | None]:
    """ok only when the point ran as asked; `failed` when nothing completed, else `partial`."""
    done, bad = m["completed"], m["failed"]
    errors = f"; errors: {m['errors'][:3]}" if m.get("errors") else ""
    if done == 0:
        return "failed", f"no request completed ({bad} failed){errors}"
    if bad > max_failed_fraction * (done + bad):
        return "partial", (f"{bad} of {done + bad} requests failed, more than load.max_failed_fraction="
                           f"{max_failed_fraction:g} allows{errors}")
    return "ok", None


_REASON = re.compile(r"^(?:[\w.]*(?:Error|Exception|Exit)\w*: .+|error: .+)")


def _log_reason(path: Path | None) -> str:
    """The server's own last error line (an exception's message, an `error:` line), not its
    traceback or torchrun's ChildFailedError block: the console gets one line, the log has all."""
    tail = log_tail(path, lines=400)
    found = [line.strip() for line in tail.splitlines() if _REASON.match(line.strip())]
    why = f"its last error line: {found[-1][:300]}; " if found else ""
    return f"{why}the whole story is in its log, {path}"


def _server_death(srv, a: Arrival) -> str:
    return f"server={srv.spec.adapter} exited with code {srv.exit_code()} during point {a.label()}"


def _print_point(rec: dict[str, Any], path: Path) -> None:
    m = rec["metrics"]
    if rec["status"] != "ok":
        print(f"point {rec['point']}: {rec['status'].upper()} ({rec['error']}); record: {path}", flush=True)
        return

    def f(k, spec=".1f"):
        return "n/a" if m.get(k) is None else format(m[k], spec)

    print(f"point {rec['point']}: {m['completed']} ok / {m['failed']} failed in {m['duration']:.2f} s | "
          f"req/s {f('request_throughput', '.2f')} | out tok/s {f('output_throughput')} | "
          f"TTFT median {f('median_ttft_ms')} p99 {f('p99_ttft_ms')} ms | TPOT median {f('median_tpot_ms')} ms | "
          f"ITL median {f('median_itl_ms')} ms | send lag p99 {f('p99_send_lag_ms', '.3f')} ms | {path}", flush=True)
    if m["errors"]:
        print(f"  errors: {m['errors'][:3]}", flush=True)
