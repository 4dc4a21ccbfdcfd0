"""Latency at equal bandwidth: the arithmetic beside a study's verdicts, and sensitivity slopes.

When a study's arms differ in the emulated link's one-way delay (the delay line,
workloads/fabric/delayline.py), what each workload lost can be explained by counting: a
latency-bound all_reduce costs its round trips, and a decoded token or a training step waits for
a known number of them. The study prices one small all_reduce with its own collectives cell (its
added time between the arms, the median over trials), and multiplies:

    added per token (TP inference)  = the collectives a decode step waits for (per engine, below)
                                      x added time of one small all_reduce
    round trips per all_reduce      = added time of one all_reduce / (2 x added one-way delay)
    all_reduce-equivalents per step = added step time (training) / added time of one all_reduce

The delay is the one the line achieved (the records' `fabric.delay`, median of each direction's
p50), not the one asked. Everything here reads records; nothing runs.

These counts are Gloo's over TCP (announce, then data, two segments in flight), the protocol the
delay-line arms run. They do not carry over to NCCL: a small NCCL all_reduce crosses the network
2(nNodes-1) times one way on a ring and 2*log2(nNodes) on a tree (NVIDIA/nccl v2.30.7-1
src/graph/tuning.cc:411,416), one RTT on 2 nodes, plus a fixed per-call cost no wire delay scales
(base 6.6-14 us and 0.6-4.0 us per NVLink step, :151,158); over RDMA it keeps NCCL_STEPS slots of
NCCL_BUFFSIZE/8 in flight per channel and peer (4 MiB), not a TCP window. And SGLang sends its
scheduler's request broadcast on its CPU (Gloo) group, not NCCL.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable, Iterable


def one_way_ms(rec: dict[str, Any]) -> float | None:
    """The one-way delay a record's traffic saw on the host links: the median of every
    direction's achieved p50 (ms); the asked delay when the record predates the line's report;
    None when the run had no delay line."""
    links = ((rec.get("fabric") or {}).get("delay") or {}).get("links") or {}
    p50s = [d["p50_us"] for label, link in links.items() if not label.startswith("l")  # leaf-spine uplinks apart
            for d in link["directions"].values() if d.get("p50_us") is not None]
    if p50s:
        return median(p50s) / 1e3
    asked = ((rec.get("config") or {}).get("fabric") or {}).get("emulate", {}) or {}
    if asked.get("latency") is None:
        return None
    from workloads.fabric.netns import delay_us

    return delay_us(asked["latency"]) / 1e3


def unit_ms(rec: dict[str, Any]) -> dict[str, float]:
    """The times a delay adds to, per serial unit: one all_reduce at the record's smallest size
    (collectives: the timed block's time per call, the measurement its verdict reads; the sampled
    calls' p50 only in a record without one), one decode step and the first token (inference), one
    step (training), in ms."""
    m, out = rec.get("metrics") or {}, {}
    rows = [r for r in rec.get("rows") or [] if r.get("op") == "all_reduce"]
    if rows:
        row = min(rows, key=lambda r: r["size"])
        stab = row.get("stability") or {}
        t = next((t for k in ("out_of_place", "in_place") if (t := (row.get(k) or {}).get("time_us"))), None) \
            or stab.get("p50(us)")
        if t is not None:
            out["all_reduce"] = t / 1e3
            out["size"] = row["size"]
    for key, name in (("median_tpot_ms", "tpot"), ("median_ttft_ms", "ttft")):
        if m.get(key) is not None:
            out[name] = float(m[key])
    if m.get("iteration_time(s)") is not None:
        out["step"] = 1e3 * float(m["iteration_time(s)"])
    return out


@dataclass(frozen=True)
class Cell:
    workload: str      # the study's workload name
    point: str         # its point ("-" when it has one)
    arm: str
    record: dict[str, Any]

    @property
    def block(self) -> int | None:
        return (self.record.get("study") or {}).get("block")


@dataclass(frozen=True)
class Added:
    """What an arm adds to a unit time over the baseline: the mean of the paired per-block
    differences (ms) and its 95% t interval; unpaired (Welch) where the runs carry no block."""

    ms: float
    lo: float
    hi: float
    n: int
    paired: bool

    def text(self, digits: int = 2) -> str:
        f = f"{{:+.{digits}f}}"
        if math.isnan(self.lo):
            return f"{f.format(self.ms)} ms [no interval: one run a side]"
        return f"{f.format(self.ms)} ms [{f.format(self.lo)}, {f.format(self.hi)}]"


def added(arm: dict[Any, list[float]], base: dict[Any, list[float]], confidence: float = 0.95) -> Added | None:
    """Added (arm - baseline) from values keyed by block (None: a run without one). Blocks both
    sides hold are paired, the verdict's own design (each block's median first); with none, the
    runs are compared unpaired by Welch's t (no interval with one run a side). None without a value."""
    import numpy as np
    from scipy import stats as sps

    shared = sorted(k for k in arm if k is not None and k in base)
    if len(shared) >= 2:
        d = np.array([median(arm[k]) - median(base[k]) for k in shared])
        if np.ptp(d) == 0:
            return Added(float(d[0]), float(d[0]), float(d[0]), len(d), True)
        ci = sps.ttest_1samp(d, 0.0).confidence_interval(confidence)
        return Added(float(d.mean()), float(ci.low), float(ci.high), len(d), True)
    a = np.array([v for vs in arm.values() for v in vs])
    b = np.array([v for vs in base.values() for v in vs])
    if not len(a) or not len(b):
        return None
    diff = float(a.mean() - b.mean())
    if len(a) < 2 or len(b) < 2:
        return Added(diff, math.nan, math.nan, 1, False)
    if np.ptp(a) == 0 and np.ptp(b) == 0:
        return Added(diff, diff, diff, min(len(a), len(b)), False)
    ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(confidence)
    return Added(diff, float(ci.low), float(ci.high), min(len(a), len(b)), False)


def _by_block(cells: Iterable[Cell]) -> dict[tuple[str, str, str], dict[str, dict[Any, list[float]]]]:
    """(workload, point, arm) -> unit name -> block -> its ok runs' values (the delay too)."""
    acc: dict[tuple, dict[str, dict[Any, list[float]]]] = {}
    for c in cells:
        if c.record.get("status") != "ok":
            continue
        slot = acc.setdefault((c.workload, c.point, c.arm), {})
        units = unit_ms(c.record)
        if (d := one_way_ms(c.record)) is not None:
            units["delay"] = d
        for k, v in units.items():
            slot.setdefault(k, {}).setdefault(c.block, []).append(v)
    return acc


def _layers_tp(cells: list[Cell], workload: str) -> tuple[int | None, int | None, str | None]:
    for c in cells:
        if c.workload == workload:
            cfg, server = c.record.get("config") or {}, c.record.get("server") or {}
            return (cfg.get("model") or {}).get("num_layers"), server.get("tp"), server.get("adapter")
    return None, None, None


def per_token(adapter: str | None, layers: int) -> tuple[int, str] | None:
    """The collectives one decode step of a TP-sharded dense model waits for, in order, and how
    they are counted; None for an engine whose step is not counted here (vLLM).
    - the reference engine (workloads/inference/engine): the leader's step plan (one broadcast
      the other ranks wait for before their forward), then 2 all_reduces per layer;
    - SGLang (0.5, its scheduler and Llama model): the scheduler's broadcast of new requests from
      TP rank 0 every loop (one broadcast of the list's size while nothing arrives), the vocab-
      parallel embedding's all_reduce, 2 all_reduces per layer and the logits' all_gather."""
    if adapter in (None, "reference"):
        return 2 * layers + 1, f"2 x {layers} layers' all_reduces + the step plan's broadcast"
    if adapter == "sglang":
        return 2 * layers + 3, (f"2 x {layers} layers' all_reduces + the embedding's all_reduce + the logits' "
                                "all_gather + the scheduler's request broadcast")
    return None


def _all(vals: dict[Any, list[float]]) -> list[float]:
    return [v for vs in vals.values() for v in vs]


def arithmetic(cells: Iterable[Cell], baseline: str,
               called: Callable[[str, str, str], str | None] | None = None) -> list[str]:
    """The lines printed beside a delay study's verdicts (empty when its arms do not differ in
    delay): per arm against the baseline, the added delay, the price of one all_reduce, and for
    each workload its added time (paired within blocks, with its interval) beside what the count
    predicts. `called(workload, point, arm)`: None when that point's primary verdict called a
    difference, else its word ("inconclusive"); a point not called claims no count of waiting."""
    cells = list(cells)
    by = _by_block(cells)
    arms = sorted({a for (_, _, a) in by} - {baseline})
    out = []
    for arm in arms:
        pairs = {(w, p): (by[(w, p, baseline)], by[(w, p, arm)]) for (w, p, a) in by
                 if a == arm and (w, p, baseline) in by}
        deltas = [median(_all(b["delay"])) - median(_all(a["delay"])) for a, b in pairs.values()
                  if "delay" in a and "delay" in b]
        if not deltas or abs(median(deltas)) < 0.05:
            continue  # these arms do not differ in delay
        dd = median(deltas)
        out.append(f"latency arithmetic, {arm} vs {baseline}: +{dd:.3f} ms one way (achieved, median of the "
                   "records' delay-line p50s); added times are the mean of the per-block differences (paired, "
                   "as the verdicts) with their 95% t interval")
        prices = sorted(((median(_all(a["size"])), x, w) for (w, p), (a, b) in pairs.items()
                         if "all_reduce" in a and "all_reduce" in b
                         and (x := added(b["all_reduce"], a["all_reduce"])) is not None), key=lambda t: t[0])
        price = prices[0] if prices else None
        if price is not None:
            size, x, w = price
            out.append(f"  one all_reduce of {size:.0f} B ({w}, the timed block's time per call): {x.text(3)} = "
                       f"{x.ms / (2 * dd):.2f}" + ("" if math.isnan(x.lo) else f" [{x.lo / (2 * dd):.2f}, "
                                                    f"{x.hi / (2 * dd):.2f}]")
                       + " round trips of the added delay" + _not(called, w, "-", arm))
        for (w, p), (a, b) in sorted(pairs.items()):
            note = _not(called, w, p, arm)
            if "tpot" in a and "tpot" in b and (x := added(b["tpot"], a["tpot"])) is not None:
                layers, tp, adapter = _layers_tp(cells, w)
                ttft = added(b["ttft"], a["ttft"]) if "ttft" in a and "ttft" in b else None
                text = f"  {w} {p}: TPOT {x.text()}" + (f", TTFT {ttft.text()}" if ttft else "") + " measured"
                count = per_token(adapter, layers) if layers else None
                if note:
                    text += note + ", so no count of collectives is claimed"
                elif price is not None and count is not None and tp and tp > 1:
                    calls, how = count
                    predicted = calls * price[1].ms
                    text += (f"; arithmetic: {calls} collectives per token ({how}, TP={tp}) x {price[1].ms:+.3f} ms = "
                             f"{predicted:+.2f} ms" + ("" if math.isnan(price[1].lo) else
                                                       f" [{calls * price[1].lo:+.2f}, {calls * price[1].hi:+.2f}]")
                             + f" (measured/arithmetic {x.ms / predicted:.2f})")
                elif count is None and tp and tp > 1:
                    text += f"; no count of {adapter}'s collectives per decode step here"
                out.append(text)
            elif "step" in a and "step" in b and (x := added(b["step"], a["step"])) is not None:
                base_ms = median(_all(a["step"]))
                text = f"  {w} {p}: step {x.text()} measured ({100 * x.ms / base_ms:+.1f}% of {base_ms:.1f} ms)"
                if note:
                    text += note + ", so no count of waiting is claimed"
                elif price is not None and price[1].ms > 0:
                    text += f" = {x.ms / price[1].ms:.1f} small all_reduces' worth of waiting per step"
                out.append(text)
    return out


def _not(called, workload: str, point: str, arm: str) -> str:
    """'; not called (inconclusive)' when the point's verdict called no difference; '' otherwise."""
    word = called(workload, point, arm) if called else None
    return f"; not called ({word})" if word else ""


def of_result(result) -> list[str]:
    """The arithmetic of a compared set of records (analysis.compare.Result): every run of its
    compared points, each point's primary verdict deciding whether its count is claimed."""
    seen: dict[int, Cell] = {}
    verdict: dict[tuple[str, str, str], Any] = {}
    for p, c in result.comparisons:
        for r in p.runs:
            name = (r.study or {}).get("workload") or r.workload
            seen.setdefault(id(r), Cell(name, r.point or "-", r.arm, r.record))
            if c.primary and not c.control:
                verdict[(name, r.point or "-", c.arm)] = c
    if not seen:
        return []

    def called(w: str, p: str, arm: str) -> str | None:
        c = verdict.get((w, p, arm))
        return None if c is None or c.significant else ("equivalent" if c.equivalent else "inconclusive")

    return arithmetic(seen.values(), result.baseline, called)


# --- sensitivity: slopes of each workload's time against delay and 1/bandwidth ---------------

# Never what a user varied across one point's runs: the study-wide load list, the record's own id.
_NOT_SAME = ("config.load.points", "config.record_id")


def inv_rate(rec: dict[str, Any]) -> float | None:
    """1 / the emulated link's rate, in s per Gbit (None: unshaped, or not emulated)."""
    rate = (((rec.get("config") or {}).get("fabric") or {}).get("emulate") or {}).get("rate")
    if rate in (None, "null", "none"):
        return None
    from workloads.fabric.netns import rate_bits_per_s

    return 1e9 / rate_bits_per_s(rate)


def _group(rec: dict[str, Any]) -> tuple:
    """The verdicts' own identity (analysis/guard.py): what a user set, never the fabric nor what
    the emulator chose for a run (its server's host-link address), so two arms whose kept
    topologies got different /30s are one point."""
    from analysis.guard import point_key

    return rec.get("workload"), rec.get("point"), point_key(rec, _NOT_SAME)


@dataclass(frozen=True)
class Slope:
    """unit time (ms) = intercept + per_ms_delay x one-way delay (ms) + per_inv_gbit x (s/Gbit)."""

    workload: str
    point: str | None              # the point, with what tells it from its siblings (mb=8, 1024 B)
    unit: str                      # step | tpot | ttft | all_reduce
    n: int
    base_ms: float                 # the fit at the smallest delay and fastest rate measured
    per_ms_delay: tuple[float, float, float] | None    # (slope, 95% low, 95% high), ms per ms one way
    per_inv_gbit: tuple[float, float, float] | None    # ms per (s/Gbit): x 1/rate
    delays_ms: tuple[float, ...]
    rates_gbit: tuple[float, ...]

    def what_if(self, delay_ms: float = 0.0, inv_gbit: float = 0.0) -> tuple[float, float, float] | None:
        """Added unit time for +delay_ms one way and +inv_gbit s/Gbit, with its 95% interval from
        each slope's interval (conservative: the two ends added)."""
        terms = [(s, x) for s, x in ((self.per_ms_delay, delay_ms), (self.per_inv_gbit, inv_gbit)) if x]
        if any(s is None for s, _ in terms):
            return None
        lo = sum(min(s[1] * x, s[2] * x) for s, x in terms)
        hi = sum(max(s[1] * x, s[2] * x) for s, x in terms)
        return sum(s[0] * x for s, x in terms), lo, hi


def slopes(records: Iterable[dict[str, Any]], confidence: float = 0.95) -> list[Slope]:
    """Per workload point (the verdicts' identity) and unit time: a least-squares fit on the
    one-way delay (where it spans more than the line's jitter) and 1/rate where each varies
    across the records, with the intervals of _intervals. Each record is one run (a trial), never a step, so the runs are
    the independent observations; a study's blocks are not modelled (their drift widens the
    residuals instead)."""
    import numpy as np

    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        if rec.get("status") == "ok":
            groups.setdefault(_group(rec), []).append(rec)
    out = []
    for (workload, point, _), recs in groups.items():
        point = _point_label(point, recs[0])
        for unit in ("step", "tpot", "ttft", "all_reduce"):
            rows = [(one_way_ms(r) or 0.0, inv_rate(r), unit_ms(r).get(unit)) for r in recs]
            rows = [r for r in rows if r[2] is not None]
            if len(rows) < 3:
                continue
            d = np.array([r[0] for r in rows])
            ir = np.array([r[1] if r[1] is not None else np.nan for r in rows])
            y = np.array([r[2] for r in rows])
            cols, names = [np.ones(len(y))], []
            # a delay axis spans more than the line's jitter: 495-500 us is one level, not a slope
            if np.ptp(d) >= 0.05:
                cols.append(d)
                names.append("delay")
            if not np.isnan(ir).any() and len(set(np.round(ir, 6))) >= 2:
                cols.append(ir)
                names.append("rate")
            if not names or len(y) <= len(cols):
                continue
            x = np.column_stack(cols)
            beta, *_ = np.linalg.lstsq(x, y, rcond=None)
            ci = _intervals(x, y, names, d, ir, beta, confidence)
            base = float(beta[0] + sum(beta[i + 1] * (d.min() if n == "delay" else np.nanmin(ir))
                                       for i, n in enumerate(names)))
            out.append(Slope(str(workload), point, unit, len(y), base, ci.get("delay"), ci.get("rate"),
                             tuple(sorted(set(np.round(d, 3).tolist()))),
                             tuple(sorted({round(1 / v, 3) for v in ir if not np.isnan(v)}))))
    return out


def _intervals(x, y, names, d, ir, beta, confidence: float) -> dict[str, tuple[float, float, float]]:
    """Each slope's interval. One axis at two levels: Welch's interval on the two levels' mean
    difference over their spacing, exact for unequal runs and spreads per level (an OLS interval
    pools the spreads and covered 59% so). Otherwise HC3 (MacKinnon & White) standard errors,
    robust to a spread that differs per level, with t at the residual degrees of freedom."""
    import numpy as np
    from scipy import stats

    axis = d if names == ["delay"] else ir if names == ["rate"] else None
    if axis is not None:
        high = _two_levels(axis)
        if high is not None:
            lo_y, hi_y = y[~high], y[high]
            gap = float(axis[high].mean() - axis[~high].mean())
            diff = float(hi_y.mean() - lo_y.mean())
            if len(lo_y) < 2 or len(hi_y) < 2:
                return {}
            if not (np.ptp(lo_y) or np.ptp(hi_y)):
                return {names[0]: (diff / gap, diff / gap, diff / gap)}
            w = stats.ttest_ind(hi_y, lo_y, equal_var=False).confidence_interval(confidence)
            return {names[0]: (diff / gap, float(w.low) / gap, float(w.high) / gap)}
    # HC3 at the residual degrees of freedom covered 92.5% with 4 runs a level at spreads 1:3:6; half
    # of them, as a Welch interval's degrees fall to its noisiest level's, brings it to nominal
    dof = max(1, len(y) // 2 - x.shape[1])
    resid = y - x @ beta
    bread = np.linalg.pinv(x.T @ x)
    h = np.einsum("ij,jk,ik->i", x, bread, x)
    meat = x.T @ (x * (resid / np.clip(1 - h, 1e-12, None)) [:, None] ** 2)
    cov = bread @ meat @ bread
    t = stats.t.ppf(0.5 + confidence / 2, dof)
    return {n: (float(beta[i + 1]), float(beta[i + 1] - t * np.sqrt(cov[i + 1, i + 1])),
                float(beta[i + 1] + t * np.sqrt(cov[i + 1, i + 1]))) for i, n in enumerate(names)}


def _two_levels(axis):
    """Where the runs sit at two levels of the axis (each run's achieved delay wobbles within
    its level): the mask of the upper one; None for one level or three and more."""
    import numpy as np

    v = np.sort(axis)
    cut = int(np.argmax(np.diff(v)))
    gap = v[cut + 1] - v[cut]
    if gap <= 0 or max(v[cut] - v[0], v[-1] - v[cut + 1]) > gap / 4:
        return None
    return axis > v[cut]


def _point_label(point: str | None, rec: dict[str, Any]) -> str | None:
    """The point as a reader tells it from its siblings: training's micro-batch, an all_reduce's size."""
    parts = [point] if point else []
    mb = ((rec.get("config") or {}).get("train") or {}).get("micro_batch_size")
    if mb is not None:
        parts.append(f"mb={mb}")
    if "size" in (units := unit_ms(rec)):
        parts.append(f"{int(units['size'])} B")
    return " ".join(parts) or None


def slope_lines(found: list[Slope], what_if_delay_ms: float = 0.0, what_if_inv_gbit: float = 0.0) -> list[str]:
    out = []
    for s in found:
        head = f"{s.workload} {s.point or '-'} {s.unit}: {s.base_ms:.3f} ms at the nearest, fastest point (n={s.n})"
        parts = []
        if s.per_ms_delay:
            b, lo, hi = s.per_ms_delay
            parts.append(f"{b:+.3f} ms per ms of one-way delay [95% CI {lo:+.3f}, {hi:+.3f}] "
                         f"(delays {', '.join(f'{v:g}' for v in s.delays_ms)} ms)")
        if s.per_inv_gbit:
            b, lo, hi = s.per_inv_gbit
            parts.append(f"{b:+.3f} ms per s/Gbit of 1/rate [95% CI {lo:+.3f}, {hi:+.3f}] "
                         f"(rates {', '.join(f'{v:g}' for v in s.rates_gbit)} Gbit/s)")
        out.append(head + ": " + "; ".join(parts))
        if what_if_delay_ms or what_if_inv_gbit:
            w = s.what_if(what_if_delay_ms, what_if_inv_gbit)
            out.append("  what if: " + ("not estimable from these records (that axis was not varied)" if w is None else
                                         f"{w[0]:+.3f} ms [{w[1]:+.3f}, {w[2]:+.3f}] = {100 * w[0] / s.base_ms:+.1f}%"))
    return out
