"""MLPerf result folders read as scores and trials, and two systems compared with the project's
verdicts (`fabricbench mlperf`; docs/mlperf.md says what is read and how it is judged).

Training: a benchmark folder of `result_*.txt` files, each one run logged as `:::MLLOG {json}`
lines (mlperf-logging's mllog format). A run's time to train is run_stop - run_start; it converged
when run_stop's metadata carries status "success". MLPerf's score is the olympic mean: the
fastest and slowest runs dropped, the rest averaged; one non-converging run may be the dropped
slowest, and more than one makes the result invalid (unet3d: 4 and 4) -- MLPerf Training rules,
training_rules.adoc "Benchmark Results" (mlcommons/training_policies), as mlperf-logging 4.1.68's
result_summarizer computes it (_compute_olympic_average). The runs a benchmark needs come from
mlperf_logging.benchmark_meta, not from a table here.

Inference: a run folder holding LoadGen's mlperf_log_summary.txt and/or mlperf_log_detail.txt
(performance mode). The scenario's metric is the one MLPerf's submission checker reads (inference
repository, tools/submission/submission_checker.py v4.1: RESULT_FIELD_NEW and, for the LLM
benchmarks, RESULT_FIELD_BENCHMARK_OVERWRITE): Offline samples/s, Server completed samples/s, and
tokens/s in place of samples/s where LoadGen logged token throughput (the LLM benchmarks, run with
use_token_latencies). An INVALID run is kept in the table with the constraints it failed, never
among the trials a verdict tests.

A verdict tests the trials (every converged run; every VALID run folder), not the score: each run
is one trial, and dropping the extremes would shrink the spread the test needs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from analysis import stats
from workloads.core.errors import UsageError
from workloads.inference.loadgen.mlperf_logs import MLLOG, InferenceRun, inference_run, mllog

TRAINING_METRIC = "time_to_train(s)"


@dataclass(frozen=True)
class Entry:
    """One benchmark (training) or one benchmark and scenario (inference) of one system."""

    kind: str                      # "training" | "inference"
    benchmark: str
    scenario: str                  # "" for training
    metric: str                    # time_to_train(s), tokens_per_sec, samples_per_sec
    score: float | None            # MLPerf's own figure; None when MLPerf would not give one
    trials: tuple[float, ...]      # what a verdict tests
    system: str
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()    # why a run is not a trial, why there is no score

    @property
    def key(self) -> tuple[str, str, str]:
        return self.kind, self.benchmark, self.scenario

    @property
    def higher_is_better(self) -> bool:
        return self.kind == "inference"


def _first(events: list[dict], key: str) -> dict | None:
    return next((e for e in events if e.get("key") == key), None)


@dataclass(frozen=True)
class TrainingRun:
    path: str
    seconds: float | None          # run_stop - run_start; None without both
    status: str                    # run_stop's status ("success", "aborted", ...) or what is missing

    @property
    def converged(self) -> bool:
        return self.status == "success" and self.seconds is not None


def training_run(path: Path) -> TrainingRun:
    events = mllog(path.read_text(errors="replace"))
    start, stop = _first(events, "run_start"), _first(events, "run_stop")
    if start is None or stop is None:
        return TrainingRun(str(path), None, "no run_start" if start is None else "no run_stop")
    status = str((stop.get("metadata") or {}).get("status", "no status"))
    return TrainingRun(str(path), (float(stop["time_ms"]) - float(start["time_ms"])) / 1000.0, status)


def dropped_per_side(benchmark: str) -> int:
    return 4 if benchmark == "unet3d" else 1


def olympic_mean(converged: Iterable[float], non_converged: int, drop: int = 1) -> float | None:
    """MLPerf's benchmark result from its runs' times: `drop` fastest and slowest dropped, the
    non-converged runs counted as the slowest; None when more runs failed than may be dropped, or
    nothing is left to average."""
    times = sorted(converged)
    if non_converged > drop:
        return None
    kept = times[drop:len(times) - (drop - non_converged)]
    return sum(kept) / len(kept) if kept else None


def runs_required(benchmark: str) -> int | None:
    from mlperf_logging import benchmark_meta

    return benchmark_meta.get_result_file_counts("training").get(benchmark)


def training_entry(folder: Path, files: list[Path]) -> Entry:
    runs = [training_run(f) for f in files]
    events = mllog(files[0].read_text(errors="replace"))
    bench_ev, platform = _first(events, "submission_benchmark"), _first(events, "submission_platform")
    benchmark = str(bench_ev["value"]) if bench_ev else folder.name
    ok = [r.seconds for r in runs if r.converged]
    failed = [r for r in runs if not r.converged]
    drop = dropped_per_side(benchmark)
    notes = [f"{Path(r.path).name}: not converged ({r.status})" for r in failed]
    score = olympic_mean(ok, len(failed), drop)
    if len(failed) > drop:
        notes.append(f"no score: {len(failed)} runs did not converge, the rules allow {drop}")
    need = runs_required(benchmark)
    if need and len(runs) < need:
        notes.append(f"{len(runs)} runs, the rules ask for {need}: the score is not MLPerf's")
    # a results tree names the system by its folder (results/<system>/<benchmark>); the logs'
    # submission_platform where it is not one (some submitters left it a placeholder)
    system = folder.parent.name if folder.parent.parent.name == "results" or not platform else str(platform["value"])
    return Entry("training", benchmark, "", TRAINING_METRIC, score, tuple(ok), system, tuple(r.path for r in runs),
                 tuple(notes))


def _benchmark_of(folder: Path, scenario: str) -> tuple[str, str]:
    """(benchmark, system) from a results tree's layout results/<system>/<benchmark>/<Scenario>/
    performance/run_N; the folder's own name where the layout is not that."""
    parts = folder.parts
    if scenario in parts:
        i = len(parts) - 1 - parts[::-1].index(scenario)
        bench = parts[i - 1] if i >= 1 else folder.name
        system = parts[i - 2] if i >= 2 else folder.name
        return bench, system
    return "loadgen", folder.name


def inference_entries(folders: list[Path]) -> list[Entry]:
    groups: dict[tuple[str, str], list[InferenceRun]] = {}
    systems: dict[tuple[str, str], str] = {}
    for f in folders:
        run = inference_run(f)
        if run.mode != "PerformanceOnly":
            continue  # an accuracy run: its log is kept, no throughput of it is compared
        bench, system = _benchmark_of(f, run.scenario)
        groups.setdefault((bench, run.scenario), []).append(run)
        systems[(bench, run.scenario)] = system
    out = []
    for (bench, scenario), runs in sorted(groups.items()):
        good = [r for r in runs if r.valid and r.value is not None]
        notes = tuple(f"{Path(r.path).name}: INVALID ({', '.join(r.failed) or 'LoadGen gave no reason'} not met)"
                      for r in runs if not r.valid) + \
            tuple(f"{Path(r.path).name}: no {scenario} metric in its logs" for r in runs if r.valid and r.value is None)
        metric = next((r.metric for r in runs if r.metric), "samples_per_sec")
        trials = tuple(float(r.value) for r in good)
        # several VALID runs of one scenario: their mean stands for the system (MLPerf publishes one)
        score = sum(trials) / len(trials) if trials else None
        out.append(Entry("inference", bench, scenario, metric, score, trials, systems[(bench, scenario)],
                         tuple(r.path for r in runs), notes))
    return out


_SKIP = {"accuracy", "compliance"}  # accuracy logs and audit runs are not the performance result


def collect(path: str | Path) -> list[Entry]:
    """Every training benchmark folder and inference run folder under `path`; UsageError naming
    the folder when it holds neither."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"{root}: no such folder; pass an MLPerf result folder (a Training benchmark folder of "
                         "result_*.txt, or an Inference folder holding mlperf_log_summary.txt)")
    entries, inference = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d.lower() not in _SKIP)
        here = Path(dirpath)
        results = sorted((here / f for f in filenames if re.fullmatch(r"result_.*\.txt", f)), key=_natural)
        results = [f for f in results if MLLOG in f.read_text(errors="replace")]
        if results:
            entries.append(training_entry(here, results))
        if "mlperf_log_summary.txt" in filenames or "mlperf_log_detail.txt" in filenames:
            inference.append(here)
    entries += inference_entries(inference)
    if not entries:
        raise UsageError(f"{root}: not an MLPerf result folder (no result_*.txt with {MLLOG} lines, no performance-mode "
                         "mlperf_log_summary.txt or mlperf_log_detail.txt under it); pass a Training benchmark folder "
                         "or an Inference results folder")
    return entries


def _natural(p: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name))


@dataclass(frozen=True)
class Row:
    """One line of the table: a benchmark both systems hold, their scores, and the verdict."""

    a: Entry
    b: Entry
    comparison: stats.Comparison | None
    why: str = ""                   # why there is no verdict

    @property
    def ratio(self) -> float | None:
        return self.a.score / self.b.score if self.a.score and self.b.score else None


@dataclass
class Comparison:
    label_a: str
    label_b: str
    rows: list[Row] = field(default_factory=list)
    only: list[str] = field(default_factory=list)   # what one side holds and the other not


def judge(a: list[Entry], b: list[Entry], label_a: str, label_b: str, alpha: float = 0.05,
          margin: float = stats.MARGIN) -> Comparison:
    """A against B on every benchmark (and scenario) both hold; the verdicts are one family,
    corrected together (Holm), as a study's primary verdicts are."""
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha:g}: write a level between 0 and 1, e.g. 0.05")
    by_a, by_b = _one_system(a, label_a), _one_system(b, label_b)
    out = Comparison(label_a, label_b)
    out.only = [f"only {label}: {_name(e)}" for label, mine, theirs in ((label_a, by_a, by_b), (label_b, by_b, by_a))
                for k, e in mine.items() if k not in theirs]
    pending: list[tuple[int, stats.Comparison]] = []
    for k in sorted(set(by_a) & set(by_b)):
        ea, eb = by_a[k], by_b[k]
        if ea.metric != eb.metric:
            out.rows.append(Row(ea, eb, None, f"{label_a} logged {ea.metric}, {label_b} {eb.metric}: not the same metric"))
            continue
        if not ea.trials or not eb.trials:
            side = label_a if not ea.trials else label_b
            out.rows.append(Row(ea, eb, None, f"{side} has no {'converged' if k[0] == 'training' else 'VALID'} run"))
            continue
        design = stats.Design(step=stats.resolution(list(ea.trials) + list(eb.trials)))
        judging = stats.Judging(alpha=alpha, word="faster", margin=margin, higher_is_better=ea.higher_is_better)
        c = stats.compare(ea.trials, eb.trials, label_a, label_b, ea.metric, design, judging)
        pending.append((len(out.rows), c))
        out.rows.append(Row(ea, eb, c))
    for (i, _), c in zip(pending, stats.correct([c for _, c in pending], "holm", alpha)):
        out.rows[i] = Row(out.rows[i].a, out.rows[i].b, c)
    return out


def _one_system(entries: list[Entry], label: str) -> dict[tuple, Entry]:
    out: dict[tuple, Entry] = {}
    for e in entries:
        if e.key in out:
            raise UsageError(f"{label}: its folder holds {_name(e)} of two systems ({out[e.key].system}, {e.system}); "
                             "pass one system's folder on each side")
        out[e.key] = e
    return out


def _name(e: Entry) -> str:
    return f"{e.benchmark} {e.scenario}".strip()


def _score(e: Entry) -> str:
    if e.score is None:
        return "no score"
    if e.kind == "training":
        return f"{e.score:,.0f} s ({e.score / 60:.2f} min)"
    return f"{e.score:,.1f} {e.metric.replace('_per_sec', '/s')}"


def lines(c: Comparison) -> list[str]:
    """The seed table's shape, one row per benchmark: the two scores, their ratio, the verdict."""
    out = [f"MLPerf {c.label_a} vs {c.label_b} (scores as MLPerf computes them; not results reviewed by MLCommons):"]
    for r in c.rows:
        ratio = f"{r.ratio:.4f}" if r.ratio is not None else "n/a"
        trials = f"{len(r.a.trials)} vs {len(r.b.trials)} runs"
        out.append(f"  {_name(r.a)} [{r.a.metric}]: {c.label_a} {_score(r.a)}, {c.label_b} {_score(r.b)}, "
                   f"{c.label_a}/{c.label_b} {ratio} ({trials})")
        out.append(f"    verdict: {stats.verdict(r.comparison)}" if r.comparison is not None else f"    no verdict: {r.why}")
        out += [f"    note ({label}): {n}" for label, e in ((c.label_a, r.a), (c.label_b, r.b)) for n in e.notes]
    out += [f"  {o}" for o in c.only]
    return out
