"""The mlperf load mode: MLPerf's own LoadGen drives the serving engine (docs/mlperf.md).

LoadGen (mlcommons-loadgen) issues the queries of its scenario (Offline: all at once; Server:
Poisson at the target QPS) from its own threads; this system under test sends each one to the
engine's OpenAI endpoint through the one streaming function (client.stream_request), tells LoadGen
the first token the moment it is stamped (FirstTokenComplete) and the whole answer with its token
count at the end (QuerySamplesComplete), so LoadGen's TTFT, TPOT and throughput are its own. The
query sample library is the point's prompts from the project's datasets.

Settings: LoadGen's built-in mlperf.conf for `benchmark` (llama2-70b by default: TTFT <= 2 s and
TPOT <= 200 ms at p99 in Server, 10 min minimum duration, as LoadGen 6.0.17 sets them; the MLPerf
Inference rules' LLM latency table, the same 2 s / 200 ms the v4.1 results' logs carry), then a
overrides.user.conf written beside the logs with this run's overrides, then the user's own user.conf, read
by LoadGen itself; a file it rejects is one line.
"""

from __future__ import annotations

import array
import asyncio
import threading
from dataclasses import dataclass
from pathlib import Path

from workloads.core.errors import UsageError
from workloads.inference.loadgen.client import RequestResult, make_session, stream_request
from workloads.inference.loadgen.mlperf_logs import InferenceRun, inference_run
from workloads.inference.loadgen.point import LoadPoint, PointResult

SCENARIOS = ("Offline", "Server")  # the two LoadGen scenarios whose metric is a throughput


@dataclass(frozen=True)
class MlperfSettings:
    """load.mlperf: what LoadGen is told beyond its mlperf.conf."""

    scenario: str
    benchmark: str = "llama2-70b"
    min_duration_ms: int | None = None
    min_query_count: int | None = None
    ttft_latency_ms: int | None = None       # Server's TTFT constraint, whole ms (default: mlperf.conf's)
    tpot_latency_ms: int | None = None       # Server's TPOT constraint, whole ms
    latency_percentile: float | None = None  # the percentile they hold at (mlperf.conf: 99)
    user_conf: str | None = None             # the user's own user.conf, read last
    mode: str = "PerformanceOnly"            # PerformanceOnly | AccuracyOnly

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            import mlperf_loadgen as lg

            have = ", ".join(lg.TestScenario.__members__)
            raise UsageError(f"load.scenario={self.scenario!r}: {'LoadGen has it, but' if self.scenario in have else 'LoadGen has no such scenario;'} "
                             f"the mlperf load mode runs {' or '.join(SCENARIOS)} (LoadGen's scenarios: {have})")
        if self.mode not in ("PerformanceOnly", "AccuracyOnly"):
            raise UsageError(f"load.mlperf.mode={self.mode!r}: write PerformanceOnly or AccuracyOnly")
        for name in ("ttft_latency_ms", "tpot_latency_ms"):
            v = getattr(self, name)
            if v is not None and (v != int(v) or v < 1):
                raise UsageError(f"load.mlperf.{name}={v}: write a whole number of ms, at least 1 (LoadGen's "
                                 "user.conf takes whole ms)")
        if self.latency_percentile is not None and not 0 < self.latency_percentile < 100:
            raise UsageError(f"load.mlperf.latency_percentile={self.latency_percentile}: write a percentile "
                             "between 0 and 100, e.g. 99")
        if self.user_conf is not None and not Path(self.user_conf).is_file():
            raise UsageError(f"load.mlperf.user_conf={self.user_conf}: no such file; give a LoadGen user.conf or null")

    @classmethod
    def from_keys(cls, scenario: str, keys: dict) -> MlperfSettings:
        """From load.scenario and the load.mlperf keys; an unknown key is named."""
        known = [k for k in cls.__dataclass_fields__ if k != "scenario"]
        unknown = sorted(set(keys) - set(known))
        if unknown:
            raise UsageError(f"load.mlperf.{unknown[0]}: no such setting; the mlperf load mode takes {', '.join(known)}")
        return cls(scenario=scenario, **keys)

    def conf_lines(self, rate: float) -> list[str]:
        """This run's overrides in user.conf's syntax (model.scenario.key = value)."""
        s = self.scenario
        # one key for both: Server's target QPS, Offline's expected QPS (which sizes its one query)
        out = [f"*.{s}.target_qps = {rate:g}"] if rate > 0 else []
        if self.min_duration_ms is not None:
            out.append(f"*.{s}.min_duration = {int(self.min_duration_ms)}")
        if self.min_query_count is not None:
            out.append(f"*.{s}.min_query_count = {int(self.min_query_count)}")
        # LoadGen reads both in ms (its mlperf.conf: llama2-70b ttft_latency = 2000)
        if self.ttft_latency_ms is not None:
            out.append(f"*.{s}.ttft_latency = {int(self.ttft_latency_ms)}")
        if self.tpot_latency_ms is not None:
            out.append(f"*.{s}.tpot_latency = {int(self.tpot_latency_ms)}")
        if self.latency_percentile is not None:
            out.append(f"*.{s}.target_latency_percentile = {self.latency_percentile:g}")
        return out


def settings(ms: MlperfSettings, rate: float, outdir: Path):
    import mlperf_loadgen as lg

    ts = lg.TestSettings()
    ts.scenario = getattr(lg.TestScenario, ms.scenario)
    ts.mode = getattr(lg.TestMode, ms.mode)
    if ts.FromConfig("", ms.benchmark, ms.scenario, 0) != 0:
        raise UsageError(f"load.mlperf.benchmark={ms.benchmark!r}: LoadGen's mlperf.conf has no settings for it; "
                         "write an MLPerf benchmark name, e.g. llama2-70b")
    ours = outdir / "overrides.user.conf"
    ours.write_text("# this run's overrides (fabricbench load.mlperf), read after LoadGen's mlperf.conf\n"
                    + "\n".join(ms.conf_lines(rate)) + "\n")
    for path, what in ((ours, "the generated overrides.user.conf"), (ms.user_conf, "load.mlperf.user_conf")):
        if path is not None and ts.FromConfig(str(path), ms.benchmark, ms.scenario, 1) != 0:
            raise UsageError(f"{what} {path}: LoadGen rejected it (a line is not `model.scenario.key = value`, or a "
                             "value is not a number); fix the file")
    ts.use_token_latencies = True
    return ts


def run_mlperf(p: LoadPoint, ms: MlperfSettings, outdir: Path) -> tuple[PointResult, InferenceRun]:
    """One LoadGen test of `ms.scenario` against p.base_url; its logs written to `outdir`."""
    import mlperf_loadgen as lg

    outdir.mkdir(parents=True, exist_ok=True)
    ts = settings(ms, p.arrival.rate, outdir)
    specs = list(p.specs)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="mlperf-sut", daemon=True)
    thread.start()
    session = asyncio.run_coroutine_threadsafe(_session(), loop).result()
    results: list[RequestResult] = []
    pending: set = set()
    lock = threading.Lock()

    def first_token(qid: int) -> None:
        one = array.array("i", [0])
        addr, n = one.buffer_info()
        lg.FirstTokenComplete([lg.QuerySampleResponse(qid, addr, n * one.itemsize, 1)])

    async def answer(q) -> None:
        r = await stream_request(session, p.base_url, p.backend, specs[q.index], p.model, p.timeout_s, p.extra_body,
                                 on_first=lambda: first_token(q.id))
        tokens = array.array("i", [0] * max(r.output_tokens, 1))
        addr, n = tokens.buffer_info()
        with lock:
            results.append(r)
        # a failed request still completes its query (LoadGen waits for every one); its row says it failed
        lg.QuerySamplesComplete([lg.QuerySampleResponse(q.id, addr, n * tokens.itemsize, r.output_tokens if r.ok else 0)])

    def issue(queries) -> None:
        for q in queries:
            fut = asyncio.run_coroutine_threadsafe(answer(q), loop)
            with lock:
                pending.add(fut)
            fut.add_done_callback(lambda f: pending.discard(f))

    sut = lg.ConstructSUT(issue, lambda: None)
    qsl = lg.ConstructQSL(len(specs), len(specs), lambda s: None, lambda s: None)
    log = lg.LogOutputSettings()
    log.outdir, log.copy_summary_to_stdout = str(outdir), False
    log_settings = lg.LogSettings()
    log_settings.log_output = log
    try:
        lg.StartTestWithLogSettings(sut, qsl, ts, log_settings)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
        asyncio.run_coroutine_threadsafe(session.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
    # the project's own clock over the same requests: first send to last answer
    done = [r for r in results if r.ok]
    duration = max(r.start + r.latency for r in done) - min(r.start for r in done) if done else 0.0
    return PointResult(results, duration), inference_run(outdir)


async def _session():
    return make_session()


def mlperf_section(run: InferenceRun, ms: MlperfSettings, logs: Path, records: Path) -> dict:
    """The record's `mlperf`: LoadGen's verdict on the run, its numbers, where its logs are."""
    return {"scenario": ms.scenario, "benchmark_settings": ms.benchmark, "mode": run.mode,
            "result": "VALID" if run.valid else "INVALID", "failed": list(run.failed), "metric": run.metric,
            "value": run.value, "summary": run.results, "logs": str(logs.relative_to(records)),
            "note": "LoadGen's own figures for this run; not an MLPerf result (MLCommons has not reviewed it)"}
