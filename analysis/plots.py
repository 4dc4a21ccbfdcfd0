"""The charts of a fabric study, PNG and SVG, with 95% intervals wherever there are trials.

A chart never mixes runs the comparison guard keeps apart: runs are grouped by their guard
identity (analysis/guard.py) without the chart's x axis (micro batch, load level), so each
comparable group gets its own chart, captioned with what sets it apart. Every arm keeps one
colour, marker and line style in every chart (ARM_STYLES: the Okabe-Ito palette, which stays
apart in greyscale through markers and dashes). Points are medians over trials; error bars
are the bootstrap 95% interval of the median (stats.bootstrap_median). Ratio panels show the
verdicts' own speed-up and interval (training: analysis/compare.py's comparisons; bus
bandwidth per message size: the same test on one value per record, blocked within a study),
on a log axis labelled as
the report speaks: "+30%" = the arm is 30% faster, "-30%" = the baseline is 30% faster.

make_all returns [(png, caption)]; the SVG lies beside each PNG.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Callable, Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from analysis import capacity, guard, stats, topology  # noqa: E402
from analysis.load import Run, Table, cell_busbw, dig, is_served, is_training, records_root, size_text  # noqa: E402

Chart = tuple[Path, str]
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
DASHES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]
HATCHES = ["", "//", "..", "xx", "\\\\", "oo", "++"]
EXTERNAL = {"color": "#777777", "marker": "x", "linestyle": (0, (2, 2))}  # nccl-tests / rccl-tests overlays


def arm_styles(arms: Iterable[str], baseline: str | None) -> dict[str, dict]:
    """One style per arm, the baseline first, the same in every chart of the report."""
    order = sorted(set(arms), key=lambda a: (a != baseline, a))
    return {a: {"color": PALETTE[i % 7], "marker": MARKERS[i % 7], "linestyle": DASHES[i % 7], "hatch": HATCHES[i % 7]}
            for i, a in enumerate(order)}


def _save(fig, out_dir: Path, name: str, caption: str) -> list[Chart]:
    out_dir.mkdir(parents=True, exist_ok=True)
    for ax in fig.axes:  # 1, 2, 4 ... on a log-2 axis, not 2^0, 2^1
        if ax.get_xscale() == "log":
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}" if v < 1e4 else size_text(v)))
    fig.tight_layout()
    for suffix in (".png", ".svg"):
        fig.savefig(out_dir / f"{name}{suffix}", dpi=100)
    plt.close(fig)
    return [(out_dir / f"{name}.png", caption)]


def groups(runs: Iterable[Run], drop: Iterable[str] = (), allow: Iterable[str] = ()) -> list[tuple[str, list[Run]]]:
    """Runs in comparable groups: equal guard identity once the chart's x axis (`drop`) and the
    declared `allow` keys are left out. Each group's label names the keys that set it apart
    from the other groups ("" when there is one group)."""
    keyed: dict[tuple, list[Run]] = defaultdict(list)
    for r in runs:
        keyed[guard.point_key(r.record, (*allow, *drop))].append(r)
    dicts = [dict(k) for k in keyed]
    vary = sorted({k for d in dicts for k in d if len({repr(e.get(k)) for e in dicts}) > 1})
    out = []
    for k, rs in keyed.items():
        d = dict(k)
        label = ", ".join(f"{v}={d.get(v)}" for v in vary[:3]) + (f" and {len(vary) - 3} more keys" if len(vary) > 3 else "")
        out.append((label, rs))
    return sorted(out, key=lambda g: g[0])


def _medians(runs: Iterable[Run], x: Callable[[Run], float | None], y: Callable[[Run], float | None]) -> dict:
    """{arm: (xs, median, lo, hi)} over the runs' trials at each x."""
    pts: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        xv, yv = x(r), y(r)
        if xv is not None and yv is not None:
            pts[r.arm][xv].append(yv)
    return {arm: _stack(d) for arm, d in sorted(pts.items())}


def _stack(d: dict[float, list[float]]):
    xs = sorted(d)
    s = [stats.bootstrap_median(d[x]) for x in xs]
    return (np.array(xs), *(np.array(v) for v in zip(*s)))


def _lines(ax, series: dict, styles: dict, suffix: str = "", hollow: bool = False) -> None:
    for arm, (xs, med, lo, hi) in series.items():
        st = styles.get(arm, EXTERNAL)
        ax.errorbar(xs, med, yerr=[med - lo, hi - med], capsize=3, label=f"{arm}{suffix}", color=st["color"],
                    marker=st["marker"], linestyle=st["linestyle"], mfc="white" if hollow else st["color"])


def _legend(ax, size: int = 8) -> None:
    if ax.get_legend_handles_labels()[0]:  # a panel without data (no ITL recorded) gets no empty legend
        ax.legend(fontsize=size)


def _pct(r: float, _=None) -> str:
    """A speed-up as the report words it: +30% (the arm faster), -30% (the baseline faster)."""
    if r <= 0 or not math.isfinite(r):
        return ""
    if abs(r - 1) < 1e-9:
        return "equal"
    return f"+{100 * (r - 1):.0f}%" if r >= 1 else f"-{100 * (1 / r - 1):.0f}%"


_UP = [1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100]
RATIO_TICKS = sorted([1.0, *_UP, *(1 / u for u in _UP)])
SPARSE_TICKS = sorted([1.0, *(f * u for u in (2, 10, 100) for f in (1, 1 / u / u))])


def _ratio_panel(ax, ratios: dict, styles: dict, baseline: str | None, what: str) -> None:
    """ratios: {arm: (xs, speedup, lo, hi)}; log y so that +50% and -50% sit equally far from 0."""
    for arm, (xs, s, lo, hi) in ratios.items():
        st = styles.get(arm, EXTERNAL)
        ax.errorbar(xs, s, yerr=[s - lo, hi - s], capsize=3, color=st["color"], marker=st["marker"],
                    linestyle=st["linestyle"], label=f"{arm} vs {baseline}")
    ax.axhline(1.0, color="#444444", linewidth=1)
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    lo, hi = min(lo, 1 / 1.15), max(hi, 1.15)
    ticks = RATIO_TICKS if math.log10(hi / lo) < 1.2 else SPARSE_TICKS  # a wide range: fewer labels, no overlap
    ax.set_yticks([t for t in ticks if lo <= t <= hi])
    ax.set_ylim(lo, hi)
    ax.yaxis.set_major_formatter(FuncFormatter(_pct))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda r, _: ""))
    ax.set_ylabel(f"{what}\n+: arm faster, -: {baseline} faster")
    ax.grid(True, alpha=0.3, which="both")
    if ratios:
        _legend(ax)


def _title(fig, what: str, label: str) -> str:
    caption = f"{what}" + (f" — {label}" if label else "")
    fig.suptitle(caption, fontsize=10)
    return caption


class Ctx:
    """What every chart shares: the arms' styles, the baseline, the verdicts, allowed keys, the SLO."""

    def __init__(self, table: Table, result=None, slo_ms: float | None = None, slo_metric: str = "p90_ttft_ms",
                 external: Iterable[Run] = ()):
        self.result, self.external = result, list(external)
        self.baseline = result.baseline if result is not None else (table.arms[0] if table.arms else None)
        self.allow = tuple(result.allow) if result is not None else ()
        self.styles = arm_styles([r.arm for r in table], self.baseline)
        self.slo_ms, self.slo_metric = slo_ms, slo_metric


BATCH_KEYS = ("batch", "config.train.micro_batch_size", "config.train.global_batch_size", "config.train.grad_accum_steps")


def training(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    """Per comparable group: samples/s and TFLOPS/GPU vs micro batch per arm, and the verdicts'
    samples/s speed-up per micro batch."""
    runs = [r for r in table.ok() if is_training(r.workload) and "micro_batch" in r.coords]
    out: list[Chart] = []
    for i, (label, rs) in enumerate(groups(runs, BATCH_KEYS, ctx.allow)):
        ids = {id(r) for r in rs}
        mb = lambda r: r.coords.get("micro_batch")  # noqa: E731
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for ax, metric, name in ((axes[0], "samples_per_sec", "samples/s"), (axes[1], "tflops_per_gpu", "TFLOPS/GPU")):
            _lines(ax, _medians(rs, mb, lambda r, m=metric: r.metric(m)), ctx.styles)
            ax.set(xscale="log", xlabel="micro batch (samples per GPU)", ylabel=f"{name} (median, 95% CI)")
            ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.3)
            _legend(ax)
        _ratio_panel(axes[2], _verdict_ratios(ctx, ids, "samples_per_sec", mb), ctx.styles, ctx.baseline, "samples/s")
        axes[2].set_xscale("log", base=2)
        axes[2].set_xlabel("micro batch (samples per GPU)")
        out += _save(fig, out_dir, f"training_{i}", _title(fig, f"{rs[0].workload}: throughput vs micro batch", label))
    return out


def _verdict_ratios(ctx: Ctx, ids: set[int], metric: str, x: Callable[[Run], float | None]) -> dict:
    """{arm: (xs, speedup, lo, hi)} from the comparisons of analysis/compare.py on the group's points."""
    pts: dict[str, list[tuple]] = defaultdict(list)
    for p, c in (ctx.result.comparisons if ctx.result is not None else []):
        if c.metric == metric and any(id(r) in ids for r in p.runs) and (xv := x(p.runs[0])) is not None:
            pts[c.arm].append((xv, c.speedup, c.speedup_lo, c.speedup_hi))
    return {a: tuple(np.array(v) for v in zip(*sorted(t))) for a, t in sorted(pts.items())}


def _record_busbw(r: Run, op: str, size: float) -> float | None:
    """One record's busbw at one size: the mean of its placements (out-of-place and in-place
    come from one process and one ring choice, so they are one trial, not two)."""
    vals = [v for row in r.rows if row.get("op") == op and row.get("size") and float(row["size"]) == size
            for v in cell_busbw(row)]
    return sum(vals) / len(vals) if vals else None


def _busbw_runs(runs: Iterable[Run], op: str) -> dict[str, dict[float, list[Run]]]:
    out: dict[str, dict[float, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in runs:
        for size in sorted({float(row["size"]) for row in r.rows if row.get("op") == op and row.get("size")}):
            out[r.arm][size].append(r)
    return out


def _busbw_cells(runs: Iterable[Run], op: str) -> dict[str, dict[float, list[float]]]:
    """{arm: {size: [busbw of each record]}}: one value per record."""
    return {arm: {s: [v for r in rs if (v := _record_busbw(r, op, s)) is not None] for s, rs in by.items()}
            for arm, by in _busbw_runs(runs, op).items()}


def _size_ratios(runs: Iterable[Run], op: str, baseline: str | None) -> dict:
    """Per arm and size, the speed-up of busbw over the baseline's with its interval: the same
    test a verdict on `<op>/busbw@<size>` gets (blocked within a study's blocks, else the rank test)."""
    from analysis.compare import blocked

    by = _busbw_runs(runs, op)
    out = {}
    for arm, by_size in by.items():
        if arm == baseline or baseline not in by:
            continue
        rows = []
        for s, rs in sorted(by_size.items()):
            base = by[baseline].get(s)
            if not base:
                continue
            value = lambda r, s=s: _record_busbw(r, op, s)  # noqa: E731
            design = blocked(rs, base, value)
            vals, base_vals = [v for r in rs if (v := value(r)) is not None], [v for r in base if (v := value(r)) is not None]
            if vals and base_vals:
                taken = stats.Design(blocks=design[0] if design else None, name=design[1] if design else None)
                rows.append((s, stats.compare(vals, base_vals, arm, baseline, "busbw", taken)))
        if rows:
            out[arm] = tuple(np.array(v) for v in zip(*[(s, c.speedup, c.speedup_lo, c.speedup_hi) for s, c in rows]))
    return out


def busbw(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    """Per comparable group and op: busbw vs message size on log-log axes, every arm, and the
    speed-up per size. External nccl-tests/rccl-tests results of the same op are drawn beside
    for reference (grey, dotted); the guard cannot vouch for them, so they get no ratio."""
    runs = [r for r in table.ok() if r.rows]
    ext = ctx.external
    out: list[Chart] = []
    found = groups(runs, (), ctx.allow) or ([("external results only", [])] if ext else [])
    for i, (label, rs) in enumerate(found):
        for op in sorted({str(row.get("op")) for r in rs or ext for row in r.rows if row.get("op")}):
            cells = _busbw_cells(rs, op)
            fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
            _lines(top, {a: _stack(d) for a, d in sorted(cells.items())}, ctx.styles)
            for a, d in sorted(_busbw_cells(ext, op).items()):
                _lines(top, {a: _stack(d)}, {a: EXTERNAL}, " (external, not compared)")
            top.set_xscale("log", base=2)
            top.set_yscale("log")
            top.set(ylabel="bus bandwidth (GB/s, median, 95% CI)")
            top.grid(True, alpha=0.3, which="both")
            _legend(top)
            _ratio_panel(bottom, _size_ratios(rs, op, ctx.baseline), ctx.styles, ctx.baseline, "busbw")
            bottom.set_xlabel("message size (bytes)")
            out += _save(fig, out_dir, f"busbw_{op}_{i}", _title(fig, f"{op}: bus bandwidth vs message size", label))
    return out


def _slo(runs: list[Run]) -> dict[str, float]:
    """The records' own SLO (load.slo, 'ttft:500 tpot:50'), when they agree on one."""
    from workloads.inference.metrics import parse_slo

    texts = {str(dig(r.record, "config.load.slo", dig(r.record, "load.slo")) or "") for r in runs}
    if len(texts) != 1:
        return {}
    try:
        return parse_slo(texts.pop())
    except Exception:  # a record written by an older version; the chart goes without the line
        return {}


def _load_axis(rs: list[Run]) -> tuple[str, str]:
    return ("concurrency", "concurrent requests") if all("concurrency" in r.coords for r in rs) else ("rate", "offered rate (req/s)")


def _percentile_panel(ax, rs, key, xlabel, name, ctx, slo_ms) -> None:
    x = lambda r: r.coords.get(key)  # noqa: E731
    _lines(ax, _medians(rs, x, lambda r: r.metric(f"median_{name}_ms")), ctx.styles, " median")
    _lines(ax, _medians(rs, x, lambda r: r.metric(f"p99_{name}_ms")), ctx.styles, " p99", hollow=True)
    if slo_ms is not None:
        ax.axhline(slo_ms, color="#B00000", linewidth=1.5, linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set_xscale("log", base=2)
    ax.set(xlabel=xlabel, ylabel=f"{name.upper()} (ms, median over trials, 95% CI)")
    ax.grid(True, alpha=0.3)
    _legend(ax, 7)


def _pareto(tp: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both throughput (higher) and latency (lower)."""
    return np.array([i for i in range(len(tp)) if not any(tp[j] >= tp[i] and lat[j] <= lat[i] and
                                                          (tp[j] > tp[i] or lat[j] < lat[i]) for j in range(len(tp)))], dtype=int)


def _latency_throughput(ax, rs, key, ctx, slo_ms, metric) -> None:
    x = lambda r: r.coords.get(key)  # noqa: E731
    tps = _medians(rs, x, lambda r: r.metric("request_throughput"))
    lats = _medians(rs, x, lambda r: r.metric(metric))
    for arm in sorted(set(tps) & set(lats)):
        st = ctx.styles.get(arm, EXTERNAL)
        common = sorted(set(tps[arm][0]) & set(lats[arm][0]))
        tp = np.array([tps[arm][1][list(tps[arm][0]).index(c)] for c in common])
        lat = np.array([lats[arm][1][list(lats[arm][0]).index(c)] for c in common])
        ax.plot(tp, lat, color=st["color"], marker=st["marker"], linestyle=st["linestyle"], label=arm)
        best = _pareto(tp, lat)
        ax.scatter(tp[best], lat[best], s=160, facecolors="none", edgecolors=st["color"], linewidths=1.5)
    if slo_ms is not None:
        ax.axhline(slo_ms, color="#B00000", linewidth=1.5, linestyle="--", label=f"SLO {slo_ms:g} ms")
    ax.set(xlabel="request throughput (req/s, median)", ylabel=f"{metric.replace('_', ' ')} (median)")
    ax.set_title("latency vs throughput (ringed: Pareto points)", fontsize=9)
    ax.grid(True, alpha=0.3)
    _legend(ax, 7)


def inference(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    """Per comparable sweep: TTFT and ITL median/p99 vs load with the SLO line, and the
    latency-throughput curve with its Pareto points."""
    runs = [r for r in table.ok() if is_served(r.workload) and ("concurrency" in r.coords or "rate" in r.coords)]
    out: list[Chart] = []
    for i, (label, rs) in enumerate(groups(runs, capacity.LEVEL_KEYS, ctx.allow)):
        key, xlabel = _load_axis(rs)
        slo = _slo(rs)
        ttft_slo = ctx.slo_ms if ctx.slo_ms is not None else slo.get("ttft")
        fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
        _percentile_panel(axes[0], rs, key, xlabel, "ttft", ctx, ttft_slo)
        _percentile_panel(axes[1], rs, key, xlabel, "itl", ctx, slo.get("tpot"))
        metric = ctx.slo_metric if ctx.slo_ms is not None else "p99_ttft_ms"
        _latency_throughput(axes[2], rs, key, ctx, ttft_slo, metric)
        out += _save(fig, out_dir, f"inference_{i}", _title(fig, "inference: latency vs load", label))
    return out


def capacity_bars(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    """Capacity per GPU at the SLO per arm, as bars, with the bracket the sweep can vouch for."""
    if ctx.slo_ms is None:
        return []
    caps = capacity.capacities(table, ctx.slo_ms, ctx.slo_metric, ctx.allow)
    out: list[Chart] = []
    for i, sweep in enumerate(sorted({c.sweep for c in caps})):
        cs = [c for c in caps if c.sweep == sweep]
        fig, ax = plt.subplots(figsize=(6.4, 4))
        for j, c in enumerate(cs):
            st = ctx.styles.get(c.fabric, EXTERNAL)
            lo, hi = c.bracket_per_gpu
            val = c.per_gpu if c.per_gpu is not None else lo
            ax.bar(j, val, color=st["color"], hatch=st.get("hatch", ""), edgecolor="black", alpha=0.85, label=c.fabric)
            if math.isfinite(hi):
                ax.errorbar(j, val, yerr=[[val - lo], [hi - val]], color="black", capsize=10, linewidth=1.5)
            else:  # every level passed: the sweep vouches for a floor only
                ax.annotate(f"at least {lo:.3g}\n(every level passed)", (j, lo), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(cs)), [c.fabric for c in cs])
        ax.set_ylabel("req/s per GPU at the SLO\n(bar: interpolated; bracket: the sweep's bounds)")
        ax.grid(True, axis="y", alpha=0.3)
        pct = ctx.slo_metric.split("_")[0]
        out += _save(fig, out_dir, f"capacity_{i}", _title(fig, f"capacity at TTFT {pct} <= {ctx.slo_ms:g} ms", sweep))
    return out


def p2p_latency(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    runs = [r for r in table.ok() if r.p2p]
    out: list[Chart] = []
    for i, (label, rs) in enumerate(groups(runs, (), ctx.allow)):
        pts: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rs:
            for row in r.p2p:
                if row.get("test") == "latency" and row.get("value") is not None and row.get("size") is not None:
                    pts[r.arm][float(row["size"]) or 1.0].append(float(row["value"]))
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        _lines(ax, {a: _stack(d) for a, d in sorted(pts.items())}, ctx.styles)
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="latency (us, median, 95% CI)")
        ax.grid(True, alpha=0.3, which="both")
        _legend(ax)
        out += _save(fig, out_dir, f"p2p_latency_{i}", _title(fig, "point-to-point latency vs message size", label))
    return out


WORLD_KEYS = ("world", "batch.global_batch_size", "config.train.global_batch_size", "config.world_size",
              "config.launcher.nproc_per_node", "config.launcher.nnodes")


def scaling(table: Table, out_dir: Path, ctx: Ctx) -> list[Chart]:
    """Weak scaling per comparable group (same micro batch): (sps(n)/n) / (sps(n0)/n0) per arm,
    n0 the fewest GPUs that arm measured; drawn only where a group spans two GPU counts."""
    runs = [r for r in table.ok() if is_training(r.workload) and "world_size" in r.coords]
    out: list[Chart] = []
    for i, (label, rs) in enumerate(groups(runs, WORLD_KEYS, ctx.allow)):
        series = {}
        for arm, (xs, med, lo, hi) in _medians(rs, lambda r: r.coords["world_size"], lambda r: r.metric("samples_per_sec")).items():
            if len(xs) >= 2:
                per0 = med[0] / xs[0]
                series[arm] = (xs, med / xs / per0, lo / xs / per0, hi / xs / per0)
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        _lines(ax, series, ctx.styles)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="GPUs", ylabel="efficiency vs fewest GPUs (median, 95% CI)")
        ax.grid(True, alpha=0.3)
        _legend(ax)
        out += _save(fig, out_dir, f"scaling_{i}", _title(fig, f"{rs[0].workload}: weak scaling efficiency", label))
    return out


PLOTS: dict[str, Callable[[Table, Path, Ctx], list[Chart]]] = {
    "training": training,
    "scaling": scaling,
    "busbw": busbw,
    "p2p_latency": p2p_latency,
    "inference": inference,
    "capacity": capacity_bars,
    "topology": lambda table, out_dir, ctx: (topology.diagrams(table, out_dir) + topology.path_shares(table, out_dir)
                                             + topology.jobs_chart(records_root(table), out_dir)),
}


def make_all(table: Table, out_dir: Path, result=None, slo_ms: float | None = None,
             slo_metric: str = "p90_ttft_ms", external: Iterable[Run] = ()) -> list[Chart]:
    """Every chart the table has data for, in PLOTS order: [(png, caption)]. `external`:
    nccl-tests/rccl-tests results (analysis/external.py), drawn beside the busbw curves."""
    ctx = Ctx(table, result, slo_ms, slo_metric, external)
    return [chart for fn in PLOTS.values() for chart in fn(table, Path(out_dir), ctx)]
