"""The charts of a fabric study, PNG and SVG, with error bars wherever there are trials.

Each chart is one function `(table, out_dir) -> list[Path]` in PLOTS; it returns [] when
the table has nothing it can draw (a training-only study has no busbw chart). Points
are medians over trials; error bars are the bootstrap 95% interval of the median.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.load import TRAINING, Run, Table, cell_busbw, dig  # noqa: E402
from analysis.stats import bootstrap_median  # noqa: E402


def _save(fig, out_dir: Path, name: str) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.svg"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths


# What splits a chart's lines besides the fabric, when it varies: a run's attribute or coordinate.
LINE_KEYS: dict[str, Callable[[Run], str]] = {
    "model": lambda r: str(r.model),
    "parallel": lambda r: str(r.parallel),
    "gpus": lambda r: f"gpus={r.coords['world_size']:g}" if "world_size" in r.coords else "gpus=?",
}


def _line_label(r: Run, vary: set[str]) -> str:
    return " ".join([r.fabric, *(fn(r) for k, fn in LINE_KEYS.items() if k in vary)])


def _series(runs: Iterable[Run], x: Callable[[Run], float | None], y: Callable[[Run], float | None],
            split: Iterable[str] = tuple(LINE_KEYS)):
    """{label: (xs, med, lo, hi)} with one line per fabric (and per model/parallel/GPU count when they
    vary; `split` leaves out the one that is the x axis)."""
    runs = list(runs)
    vary = {k for k in split if len({LINE_KEYS[k](r) for r in runs}) > 1}
    pts: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        xv, yv = x(r), y(r)
        if xv is not None and yv is not None:
            pts[_line_label(r, vary)][xv].append(yv)
    out = {}
    for label, d in sorted(pts.items()):
        xs = sorted(d)
        stats = [bootstrap_median(d[v]) for v in xs]
        out[label] = (np.array(xs), *(np.array(s) for s in zip(*stats)))
    return out


def _errorbar_chart(series, title, xlabel, ylabel, out_dir, name, logx=False, logy=False) -> list[Path]:
    if not series:
        return []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, (xs, med, lo, hi) in series.items():
        ax.errorbar(xs, med, yerr=[med - lo, hi - med], marker="o", capsize=3, label=label)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(title="fabric")
    return _save(fig, out_dir, name)


def _training(table: Table) -> list[Run]:
    return [r for r in table.ok() if r.workload in TRAINING]


def sps_vs_batch(table: Table, out_dir: Path) -> list[Path]:
    s = _series(_training(table), lambda r: r.coords.get("global_batch"), lambda r: r.metric("samples_per_sec"))
    return _errorbar_chart(s, "Samples/s vs global batch (the small-batch chart)", "global batch size (samples)",
                           "samples/s (median, 95% CI)", out_dir, "sps_vs_batch", logx=True)


def tflops_per_fabric(table: Table, out_dir: Path) -> list[Path]:
    runs = _training(table)
    # per (model, fabric): the batch size with the best median TFLOPS/GPU, and its interval
    best: dict[tuple[str, str], tuple[float, float, float]] = {}
    for (model, fabric), by_b in _group(runs, lambda r: (str(r.model), r.fabric), lambda r: r.coords.get("global_batch")).items():
        cand = [bootstrap_median(v) for v in (by_b[b] for b in by_b) if v]
        if cand:
            best[(model, fabric)] = max(cand, key=lambda t: t[0])
    if not best:
        return []
    models = sorted({m for m, _ in best})
    fabrics = sorted({f for _, f in best})
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    w = 0.8 / len(fabrics)
    for i, f in enumerate(fabrics):
        vals = [best.get((m, f), (np.nan,) * 3) for m in models]
        med = np.array([v[0] for v in vals])
        err = [med - np.array([v[1] for v in vals]), np.array([v[2] for v in vals]) - med]
        ax.bar(np.arange(len(models)) + i * w - 0.4 + w / 2, med, w, yerr=err, capsize=3, label=f)
    ax.set_xticks(np.arange(len(models)), models)
    ax.set(title="TFLOPS/GPU per fabric and model (best batch size)", ylabel="TFLOPS/GPU (median, 95% CI)")
    ax.legend(title="fabric")
    return _save(fig, out_dir, "tflops_per_fabric")


def _group(runs, key, x):
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in runs:
        if x(r) is not None and r.metric("tflops_per_gpu") is not None:
            out[key(r)][x(r)].append(r.metric("tflops_per_gpu"))
    return out


def scaling_efficiency(table: Table, out_dir: Path) -> list[Path]:
    """Weak scaling at a fixed per-GPU micro batch: (sps(n)/n) / (sps(n0)/n0), n0 the fewest GPUs measured."""
    runs = [r for r in _training(table) if "world_size" in r.coords]
    series = {}
    for (fabric, model, mb), sub in _bucket(runs, lambda r: (r.fabric, r.model, r.coords.get("micro_batch"))).items():
        s = _series(sub, lambda r: r.coords["world_size"], lambda r: r.metric("samples_per_sec"), split=("model", "parallel"))
        for _, (xs, med, lo, hi) in s.items():
            if len(xs) < 2:
                continue
            per0 = med[0] / xs[0]
            series[f"{fabric} {model} mb={mb:g}"] = (xs, med / xs / per0, lo / xs / per0, hi / xs / per0)
    return _errorbar_chart(series, "Scaling efficiency vs GPU count", "GPUs", "efficiency vs fewest GPUs", out_dir,
                           "scaling_efficiency", logx=True)


def _bucket(runs, key):
    out = defaultdict(list)
    for r in runs:
        out[key(r)].append(r)
    return out


def busbw_series(table: Table) -> dict:
    """{label: (sizes, med, lo, hi)}: one line per fabric and op, split further by world size,
    pattern and dtype wherever the table holds more than one of them (busbw of 8 and 16 ranks,
    or of float and bfloat16, are different curves, not trials of one)."""
    cells: list[tuple[dict[str, str], float, float]] = []
    for r in table.ok():
        for row in r.rows:
            ws = r.coords.get("world_size")
            dims = {"fabric": r.fabric, "op": str(row.get("op", "")),
                    "n": f"n={ws:g}" if ws is not None else f"group={row.get('group_size', '?')}",
                    "pattern": f"pattern={dig(r.record, 'collectives.pattern', '?')}",
                    "dtype": str(row.get("type", dig(r.record, "collectives.datatype", "?")))}
            if row.get("size"):  # both placements are trials of one size
                cells += [(dims, float(row["size"]), bw) for bw in cell_busbw(row)]
    vary = [k for k in ("n", "pattern", "dtype") if len({d[k] for d, _, _ in cells}) > 1]
    pts: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for dims, size, bw in cells:
        label = " ".join(v for v in (dims["fabric"], dims["op"], *(dims[k] for k in vary)) if v)
        pts[label][size].append(bw)
    return {k: _stack(d) for k, d in sorted(pts.items())}


def busbw_vs_size(table: Table, out_dir: Path) -> list[Path]:
    """nccl-tests' busbw per message size, out-of-place and in-place cells pooled as trials."""
    return _errorbar_chart(busbw_series(table), "Bus bandwidth vs message size", "message size (bytes)", "busbw (GB/s)",
                           out_dir, "busbw_vs_size", logx=True)


def p2p_latency_vs_size(table: Table, out_dir: Path) -> list[Path]:
    pts: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in table.ok():
        for row in r.p2p:
            if row.get("test") == "latency" and row.get("value") is not None and row.get("size") is not None:
                pts[r.fabric][float(row["size"]) or 1.0].append(float(row["value"]))
    series = {k: _stack(d) for k, d in sorted(pts.items())}
    return _errorbar_chart(series, "Point-to-point latency vs message size", "message size (bytes)", "latency (us)",
                           out_dir, "p2p_latency_vs_size", logx=True, logy=True)


def _stack(d: dict[float, list[float]]):
    xs = sorted(d)
    stats = [bootstrap_median(d[x]) for x in xs]
    return (np.array(xs), *(np.array(s) for s in zip(*stats)))


def _inference(table: Table) -> list[Run]:
    return [r for r in table.ok() if r.workload == "inference" and "concurrency" in r.coords]


def ttft_vs_concurrency(table: Table, out_dir: Path) -> list[Path]:
    runs = _inference(table)
    series = {}
    for metric, tag in (("median_ttft_ms", "median"), ("p99_ttft_ms", "p99")):
        for label, s in _series(runs, lambda r: r.coords["concurrency"], lambda r, m=metric: r.metric(m)).items():
            series[f"{label} {tag}"] = s
    return _errorbar_chart(series, "TTFT vs concurrency", "concurrent requests", "TTFT (ms)", out_dir,
                           "ttft_vs_concurrency", logx=True)


def rps_vs_concurrency(table: Table, out_dir: Path) -> list[Path]:
    s = _series(_inference(table), lambda r: r.coords["concurrency"], lambda r: r.metric("request_throughput"))
    return _errorbar_chart(s, "Requests/s vs concurrency", "concurrent requests", "requests/s", out_dir,
                           "rps_vs_concurrency", logx=True)


PLOTS: dict[str, Callable[[Table, Path], list[Path]]] = {
    "sps_vs_batch": sps_vs_batch,
    "tflops_per_fabric": tflops_per_fabric,
    "scaling_efficiency": scaling_efficiency,
    "busbw_vs_size": busbw_vs_size,
    "p2p_latency_vs_size": p2p_latency_vs_size,
    "ttft_vs_concurrency": ttft_vs_concurrency,
    "rps_vs_concurrency": rps_vs_concurrency,
}


def make_all(table: Table, out_dir: Path) -> dict[str, list[Path]]:
    """Every chart the table has data for; an empty list for the others."""
    return {name: fn(table, Path(out_dir)) for name, fn in PLOTS.items()}
