"""LoadGen's and mllog's logs read: `:::MLLOG` lines, and one LoadGen run folder's summary and
detail logs as its scenario's metric, validity and failed constraints (docs/mlperf.md). The mlperf
load mode reads its own run with it, and `fabricbench mlperf` (analysis/mlperf.py) the folders it is given.

The scenario's metric is the one MLPerf's submission checker reads (inference repository,
tools/submission/submission_checker.py v4.1: RESULT_FIELD_NEW and, for the LLM benchmarks,
RESULT_FIELD_BENCHMARK_OVERWRITE): Offline samples/s, Server completed samples/s, tokens/s in place
of samples/s where LoadGen logged token throughput (runs with use_token_latencies).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MLLOG = ":::MLLOG"
# The sentence the summary writes for each constraint, and the detail log's key for it
# (LoadGen's results.cc, as its logs show them).
CONSTRAINTS = (("result_perf_constraints_met", "Performance constraints satisfied", "latency constraint"),
               ("result_min_duration_met", "Min duration satisfied", "min duration"),
               ("result_min_queries_met", "Min queries satisfied", "min queries"),
               ("early_stopping_met", "Early stopping satisfied", "early stopping"))
# scenario -> [(detail key, summary line, metric name)], the first one present decides (see above)
SCENARIO_METRICS = {
    "Offline": [("result_tokens_per_second", "Tokens per second", "tokens_per_sec"),
                ("result_samples_per_second", "Samples per second", "samples_per_sec")],
    "Server": [("result_completed_tokens_per_second", "Completed tokens per second", "tokens_per_sec"),
               ("result_completed_samples_per_sec", "Completed samples per second", "samples_per_sec"),
               # summaries before LoadGen 4.1 name only the scheduled rate, the metric of their round
               ("result_scheduled_samples_per_sec", "Scheduled samples per second", "samples_per_sec")],
}


def mllog(text: str) -> list[dict]:
    """Every `:::MLLOG {json}` line of a log, in order; other lines (a launcher's output) skipped."""
    out = []
    for line in text.splitlines():
        at = line.find(MLLOG)
        if at < 0:
            continue
        try:
            obj = json.loads(line[at + len(MLLOG):])
        except ValueError:
            continue
        if isinstance(obj, dict) and "key" in obj:
            out.append(obj)
    return out


def _summary_fields(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep and k.strip() and k.strip() not in out:
            out[k.strip()] = v.strip()
    return out


@dataclass(frozen=True)
class InferenceRun:
    path: str
    scenario: str
    mode: str
    metric: str | None
    value: float | None
    valid: bool
    failed: tuple[str, ...]        # the constraints LoadGen says were not met
    results: dict = field(default_factory=dict)  # every result_* / early_stopping_* key of the detail log


def inference_run(folder: Path) -> InferenceRun:
    """One LoadGen run folder; the detail log's keys where it has them, else the summary's lines."""
    detail = {}
    if (folder / "mlperf_log_detail.txt").is_file():
        for e in mllog((folder / "mlperf_log_detail.txt").read_text(errors="replace")):
            detail.setdefault(e["key"], e.get("value"))
    summary = _summary_fields((folder / "mlperf_log_summary.txt").read_text(errors="replace")) \
        if (folder / "mlperf_log_summary.txt").is_file() else {}
    scenario = str(detail.get("effective_scenario") or summary.get("Scenario", "?"))
    mode = str(detail.get("effective_test_mode") or summary.get("Mode", "?"))
    metric = value = None
    for key, line, name in SCENARIO_METRICS.get(scenario, []):
        raw = detail.get(key, summary.get(line))
        if raw is not None:
            try:
                metric, value = name, float(raw)
            except (TypeError, ValueError):
                continue
            break
    validity = str(detail.get("result_validity") or summary.get("Result is", "")).upper()
    failed = tuple(words for key, line, words in CONSTRAINTS
                   if detail.get(key) is False or summary.get(line, "").upper() == "NO")
    results = {k: v for k, v in detail.items() if k.startswith(("result_", "early_stopping"))}
    return InferenceRun(str(folder), scenario, mode, metric, value, validity == "VALID", failed, results)
