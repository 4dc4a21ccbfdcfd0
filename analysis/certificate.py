"""A fabric certificate: the IETF BMWG AI-training-fabric KPIs of one fabric, each with its
definition, its value and interval over the trials, the draft's reference and a verdict.

The vocabulary is draft-calabria-bmwg-ai-fabric-training-bench-00 (February 2026); every KPI
names the draft's section and docs/metrics.md ("Fabric certificate") holds the definitions.
One trial is one record (one run, one block of a study); a KPI's value per trial is computed
from that record alone, and its interval is the t-interval over the trials (analysis/stats.py's
paired_t on the per-trial values, the same test the blocked verdicts use). The verdict against a
reference: `pass` only when the whole interval lies on the good side, `fail` when it lies wholly
on the bad side, else `cannot tell` (an interval that straddles the reference never passes). The
draft calls its reference values non-normative (its section 4): the certificate says so on its
first screen, and a user's own limits (--reference) replace them.

Two fabrics side by side: the same rows, each fabric's verdict, and the difference per KPI from
the blocks (stats.compare: the paired t on block log-ratios, Holm over the KPIs), so an A/A pair
(one fabric under two labels) is called different only at the family's error rate.

`build(table, arm)` computes; `sections()` and `to_json()` only render.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from analysis import stats
from analysis.load import Run, Table, dig
from analysis.report import Section
from workloads import catalog
from workloads.core.errors import UsageError

DRAFT = "draft-calabria-bmwg-ai-fabric-training-bench-00"
ALPHA = 0.05
PASS, FAIL, UNSURE, NO_REF = "pass", "fail", "cannot tell", "no threshold"
NOT_HERE, ABSENT = "not measurable here", "not in these records"


@dataclass(frozen=True)
class Ref:
    """A reference: the value must be `op` (">=" or "<=") `value`; `source` says whose it is."""

    op: str
    value: float
    source: str

    def text(self, unit: str) -> str:
        return f"{'≥' if self.op == '>=' else '≤'} {self.value:g}{unit_suffix(unit)} ({self.source})"

    def judge(self, lo: float, hi: float) -> str:
        if math.isnan(lo) or math.isnan(hi):
            return UNSURE
        good_lo, good_hi = (lo >= self.value, hi < self.value) if self.op == ">=" else (hi <= self.value, lo > self.value)
        return PASS if good_lo else FAIL if good_hi else UNSURE


def unit_suffix(unit: str) -> str:
    return "%" if unit == "%" else f" {unit}" if unit else ""


@dataclass(frozen=True)
class Kpi:
    """One KPI of the draft: its key (for --kpi and --reference), name, section, definition,
    unit, whether higher is better, and the draft's own reference (None: the draft gives none)."""

    key: str
    name: str
    section: str
    definition: str
    unit: str
    higher_is_better: bool
    reference: Ref | None
    ideal: str = ""         # what the draft calls ideal where it gives no threshold ("1.0 = perfect")


KPIS = {k.key: k for k in (
    Kpi("jct-ratio", "JCT ratio", "§2, §4.1, §10.1",
        "measured step time / roofline step time; roofline = the step's non-fabric time + its collectives' bus "
        "bytes at the NIC line rate with no contention (S x algo factor / line rate)", "", False,
        Ref("<=", 1.05, "draft §4.1, non-normative; ≤ 1.15 acceptable")),
    Kpi("non-fabric", "Non-fabric time per step", "§3.3.3",
        "step time during which no collective was in flight (reported apart, as the draft asks of GPU clusters)",
        "ms", False, None, "reported, not judged"),
    Kpi("busbw", "Bus bandwidth, % of NIC line rate", "§2, §4.1, §9.1",
        "busbw (nccl-tests' algbw x algo factor) / the communicator's line rate x 100", "%", True,
        Ref(">=", 90.0, "draft §4.1, non-normative")),
    Kpi("mmr-uplinks", "ECMP imbalance (MMR) over uplinks", "§2, §4.2, §8.1",
        "max / mean over the spines of the bytes each carried in the measured window (the draft counts flows; "
        "bytes weigh each flow by its size)", "", False, None, "1.0 = perfect"),
    Kpi("jain-uplinks", "Jain fairness over uplinks", "§4.2, §8.4",
        "(Σx)² / (N·Σx²), x = the bytes each spine carried", "", True, None, "1.0 = perfect, 1/N worst"),
    Kpi("mmr-rails", "Imbalance (MMR) over rails", "§2, §4.2",
        "max / mean over every node's rails of the bytes (tx + rx) each NIC moved in the window", "", False, None,
        "1.0 = perfect"),
    Kpi("jain-rails", "Jain fairness over rails", "§4.2, §8.4",
        "(Σx)² / (N·Σx²), x = the bytes (tx + rx) each rail of each node moved", "", True, None, "1.0 = perfect"),
    Kpi("p99", "Collective tail latency p99", "§4.1, §5.2",
        "99th percentile of per-call times T (T = the slowest rank's time in the call), per trial", "us", False,
        None, "minimize"),
    Kpi("p99.9", "Collective tail latency p99.9", "§4.1, §5.2",
        "99.9th percentile of per-call times T, per trial (needs >= 1000 calls a trial)", "us", False, None,
        "minimize"),
    Kpi("failover", "Failover impact", "§4.3, §11.2, §11.3",
        "stall seconds of a run under a fault schedule: Σ over the steps from the fault to recovery of "
        "(step - the median step before it); zero-impact (§11.3) when the step that saw it lies within the "
        "steady state's p99", "s", False, None, "zero-impact"),
    Kpi("recovery", "Time to recover", "§11.2",
        "seconds from the link's return to the end of the first step within 5% of the median step before the "
        "fault", "s", False, None, "minimize"),
)}

# KPIs that need counters a kernel-emulated or socket fabric does not have. Each names the
# counters that measure it on real NICs; where a record holds them (nic.congestion: RDMA
# hw_counters; nic.pause: ethtool -S pause counters) their sums are shown.
UNMEASURABLE = (
    ("PFC pause duration / count", "§4.2, §7.2",
     "ethtool -S <iface>: rx_prio<N>_pause, rx_prio<N>_pause_duration, tx_prio<N>_pause (mlx5); "
     "tx_pause_ctrl_phy, rx_pause_ctrl_phy", "pause"),
    ("ECN marking ratio", "§4.2, §7.1",
     "hw_counters/np_ecn_marked_roce_packets over the port's packets (RDMA NICs); a marking qdisc "
     "(RED, fq_codel ecn) on a kernel path", "np_ecn_marked_roce_packets"),
    ("CNPs (DCQCN)", "§7.3", "hw_counters/np_cnp_sent (notification point), rp_cnp_handled, rp_cnp_ignored "
     "(reaction point)", "cnp"),
    ("Congestion-control convergence", "§4.2, §7.3",
     "per-flow rate time series after a step in senders (switch telemetry or per-QP NIC rate counters); "
     "no end-host counter gives it", None),
)


@dataclass
class Row:
    kpi: str                 # Kpi.key, or "" for an unmeasurable row
    name: str
    point: str               # what it was measured at: "all_reduce 1 MiB", "train-tiny", "spines"
    section: str
    definition: str
    unit: str
    values: list[float] = field(default_factory=list)   # one per trial
    blocks: list = field(default_factory=list)          # each trial's study block (None outside a study)
    estimate: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    level: float = 1 - ALPHA
    cv: float = math.nan
    reference: str = ""
    verdict: str = ""
    note: str = ""

    def value_text(self) -> str:
        if not self.values:
            return "—"
        f = _fmt(self.unit)
        if math.isnan(self.lo):
            return f"{f(self.estimate)} (" + ("one trial: no interval)" if len(self.values) == 1 else
                                           f"no spread over {len(self.values)} trials: no interval)")
        return f"{f(self.estimate)} [{f(self.lo)}, {f(self.hi)}]"


def _fmt(unit: str) -> Callable[[float], str]:
    if unit == "%":
        return lambda x: f"{x:.1f}%"
    if unit == "s":
        return lambda x: f"{x:.2f} s"
    if unit in ("us", "ms"):
        return lambda x: f"{x:,.0f} {unit}" if abs(x) >= 100 else f"{x:.2f} {unit}"
    return lambda x: f"{x:.3f}"


@dataclass
class Certificate:
    arm: str
    fabric: str
    rows: list[Row]
    runs: int
    transport: list[str]     # one line per distinct verdict: "12 of 12 runs: ok (Socket emu0)"
    topology: str

    def row(self, kpi: str, point: str) -> Row | None:
        return next((r for r in self.rows if r.kpi == kpi and r.point == point), None)


# -- per-trial values -----------------------------------------------------------------------

def jain(x: Sequence[float]) -> float | None:
    a = np.asarray(x, dtype=float)
    s2 = float((a ** 2).sum())
    return None if a.size == 0 or s2 == 0 else float(a.sum() ** 2 / (a.size * s2))


def mmr(x: Sequence[float]) -> float | None:
    a = np.asarray(x, dtype=float)
    return None if a.size == 0 or a.mean() <= 0 else float(a.max() / a.mean())


def line_rate_Bps(rec: dict) -> float | None:
    """The job's line rate in bytes/s: the slowest node's sum of its rails' line rates (the rails
    its NIC counters read), as workloads/fabric/linerate.py bounds a communicator spanning nodes."""
    nodes = dig(rec, "nic.nodes") or ([rec["nic"]] if isinstance(rec.get("nic"), dict) else [])
    sums = []
    for n in nodes:
        rails = [((n.get("per_rail") or {}).get(r) or {}).get("line_rate(Gbit/s)") for r in n.get("rails") or []]
        if not rails or any(v is None for v in rails):
            return None
        sums.append(sum(rails) * 1e9 / 8)
    return min(sums) if sums else None


ALGO_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "broadcast": lambda n: 1.0}
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "double": 8,
               "int32": 4, "int64": 8, "int8": 1, "uint8": 1}


def jct_ratio(rec: dict) -> tuple[float, float] | str:
    """(measured / roofline over the timed steps, mean non-fabric seconds per step), or why not.

    Per timed step i: s_i its time, c_i the time a collective was in flight (the union CommTimer
    measured, samples.comm_time_s), n_i = s_i - c_i the non-fabric time, and the roofline
    r_i = n_i + Σ over the step's traced calls of bytes x algo factor / line rate. JCT ratio =
    Σ s_i / Σ r_i over the steps the trace holds (the first 50 timed)."""
    samples = rec.get("samples") or {}
    warm = int(samples.get("warmup_steps") or 0)
    steps, comm, calls = (samples.get(k) for k in ("step_time_s", "comm_time_s", "comm_calls"))
    if not steps or not comm or calls is None:
        return "the record holds no per-step times, in-flight times or collectives trace"
    rate = line_rate_Bps(rec)
    if rate is None:
        return "the record names no line rate for its rails (an unshaped or loopback link)"
    steps, comm = steps[warm:][:len(calls)], comm[warm:][:len(calls)]
    meas = roof = other = 0.0
    for s, c, step_calls in zip(steps, comm, calls):
        bus = 0.0
        for op, dtype, numel, n, *_ in step_calls:
            if op not in ALGO_FACTOR or dtype not in DTYPE_BYTES:
                return f"its steps run {op} ({dtype}); the roofline prices all_reduce and broadcast steps only"
            bus += float(numel) * DTYPE_BYTES[dtype] * ALGO_FACTOR[op](int(n))
        nf = max(0.0, float(s) - float(c))
        meas, roof, other = meas + float(s), roof + nf + bus / rate, other + nf
    if roof <= 0:
        return "no timed step"
    return meas / roof, other / len(steps)


def call_times_us(stability: dict) -> np.ndarray:
    """Per sampled call, T = the slowest rank's time in it (workloads/collectives/stability.py)."""
    by_rank = stability.get("times_us_by_rank") or {}
    if not by_rank:
        return np.array([])
    return np.asarray(list(by_rank.values()), dtype=float).max(axis=0)


def size_label(size: float) -> str:
    for unit, div in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if size >= div and size % div == 0:
            return f"{size / div:g} {unit}"
    return f"{size:g} B"


def _cell_pct(row: dict) -> float | None:
    pcts = [c.get("pct_line_rate") for c in (row.get("out_of_place"), row.get("in_place")) if isinstance(c, dict)]
    pcts = [p for p in pcts if p is not None]
    return float(np.mean(pcts)) if pcts else None


def trial_values(r: Run) -> dict[tuple[str, str], float]:
    """(kpi, point) -> this trial's value, from one record."""
    rec, out = r.record, {}
    if r.workload == "collectives":
        for row in r.rows:
            point = f"{row.get('op')} {size_label(float(row.get('size') or 0))}"
            if (p := _cell_pct(row)) is not None:
                out[("busbw", point)] = p
            st = row.get("stability") or {}
            T = call_times_us(st)
            for q, key in ((99.0, "p99"), (99.9, "p99.9")):
                if T.size >= round(1 / (1 - q / 100)):
                    out[(key, point)] = float(np.percentile(T, q))
        spines = dig(rec, "paths.per_path_bytes")
        if isinstance(spines, dict) and spines:
            x = list(spines.values())
            for key, f in (("mmr-uplinks", mmr), ("jain-uplinks", jain)):
                if (v := f(x)) is not None:
                    out[(key, "spines")] = v
    got = jct_ratio(rec) if catalog.field(r.workload, "training", False) else None
    if isinstance(got, tuple):
        out[("jct-ratio", _label(r))] = got[0]
        out[("non-fabric", _label(r))] = got[1] * 1e3
    rails = [v["tx_bytes"] + v["rx_bytes"] for n in (dig(rec, "nic.nodes") or []) for k, v in (n.get("per_rail") or {}).items()
             if k in (n.get("rails") or []) and v.get("tx_bytes") is not None]
    if len(rails) >= 2:
        for key, f in (("mmr-rails", mmr), ("jain-rails", jain)):
            if (v := f(rails)) is not None:
                out[(key, _label(r))] = v
    fault = rec.get("fault")
    if isinstance(fault, dict) and fault.get("stall_s") is not None:
        out[("failover", _label(r))] = float(fault["stall_s"])
        if fault.get("recovery_s") is not None:
            out[("recovery", _label(r))] = float(fault["recovery_s"])
    return out


def _label(r: Run) -> str:
    """A record's point: its study workload's name (train-tiny), else its workload (pretrain)."""
    return str((r.study or {}).get("workload") or r.workload)


def _why_absent(r_list: list[Run], kpi: str) -> str:
    train = [r for r in r_list if catalog.field(r.workload, "training", False)]
    if kpi == "jct-ratio" and train:
        got = jct_ratio(train[0].record)
        return got if isinstance(got, str) else ""
    return {
        "jct-ratio": "no training record",
        "non-fabric": "no training record",
        "busbw": "no collectives record with a line rate (runs across nodes of a known rate)",
        "mmr-uplinks": "no collectives record with a paths block (an emulated leaf-spine's spine counters)",
        "jain-uplinks": "no collectives record with a paths block (an emulated leaf-spine's spine counters)",
        "mmr-rails": "no record with NIC counters of two rails or more",
        "jain-rails": "no record with NIC counters of two rails or more",
        "p99": "no collectives record with >= 100 sampled calls at a size (collectives.sample_iters)",
        "p99.9": "no collectives record with >= 1000 sampled calls at a size (collectives.sample_iters=1000)",
        "failover": "no run with a fault schedule (fabric.emulate.faults)",
        "recovery": "no run under a fault schedule that recovered (fabric.emulate.faults)",
    }[kpi]


# -- building --------------------------------------------------------------------------------

BOUNDS = {"jain-uplinks": (0.0, 1.0), "jain-rails": (0.0, 1.0), "mmr-uplinks": (1.0, math.inf),
          "mmr-rails": (1.0, math.inf)}


def interval(values: Sequence[float], level: float, kpi: str = "") -> tuple[float, float, float]:
    """(mean, lo, hi): the t-interval of the per-trial values (stats.paired_t, one sample), cut to
    the values the KPI can take (a share or a time is never below 0, Jain's index never above 1),
    which only drops impossible values. Trials that all agree leave no spread to size it: NaN."""
    m, lo, hi, _ = stats.paired_t(values, conf=level)
    low, high = BOUNDS.get(kpi, (0.0, math.inf))
    return m, (lo if math.isnan(lo) else min(max(lo, low), m)), (hi if math.isnan(hi) else max(min(hi, high), m))


def _transport(runs: list[Run]) -> list[str]:
    from analysis.report import _transport as one

    counts: dict[str, int] = {}
    for r in runs:
        counts[one(r)] = counts.get(one(r), 0) + 1
    return [f"{n} of {len(runs)} runs: {t}" for t, n in sorted(counts.items(), key=lambda kv: -kv[1])]


def _topology(runs: list[Run]) -> str:
    from analysis.topology import describe

    blocks = {json.dumps(dig(r.record, "config.fabric.emulate"), sort_keys=True) for r in runs
              if isinstance(dig(r.record, "config.fabric.emulate"), dict)}
    return "; ".join(describe(json.loads(b)) for b in sorted(blocks)) or "a real fabric (no emulate block)"


def build(table: Table, arm: str, kpis: Iterable[str] | None = None, refs: dict[str, Ref] | None = None,
          alpha: float = ALPHA) -> Certificate:
    """The certificate of one arm (a study arm, or a fabric outside a study) from its ok records."""
    runs = [r for r in table.ok() if r.arm == arm]
    if not runs:
        raise UsageError(f"no ok record of {arm!r} in these records; the arms here: {', '.join(table.arms) or 'none'}")
    wanted = list(kpis or KPIS)
    by: dict[tuple[str, str], list[tuple[float, object]]] = {}
    for r in runs:
        for key, v in trial_values(r).items():
            by.setdefault(key, []).append((v, (r.study or {}).get("block")))
    rows = []
    for key in wanted:
        k = KPIS[key]
        points = sorted({p for kk, p in by if kk == key}, key=_point_order)
        if not points:
            rows.append(Row(key, k.name, "—", k.section, k.definition, k.unit, verdict=ABSENT, note=_why_absent(runs, key),
                            reference=_ref_text(k, refs)))
        for p in points:
            vals = by[(key, p)]
            rows.append(Row(key, k.name, p, k.section, k.definition, k.unit, values=[v for v, _ in vals],
                            blocks=[b for _, b in vals], reference=_ref_text(k, refs)))
    judged = [r for r in rows if r.values and _ref(KPIS[r.kpi], refs) is not None]
    level = 1 - alpha / max(1, len(judged))  # Bonferroni over the rows that are judged
    for r in rows:
        if not r.values:
            continue
        r.level = level if r in judged else 1 - alpha
        r.estimate, r.lo, r.hi = interval(r.values, r.level, r.kpi)
        r.cv = float(np.std(r.values, ddof=1) / np.mean(r.values)) if len(r.values) > 1 and np.mean(r.values) else math.nan
        ref = _ref(KPIS[r.kpi], refs)
        r.verdict = ref.judge(r.lo, r.hi) if ref is not None else NO_REF
        if ref is not None and math.isnan(r.lo):
            r.note = "no interval, so no pass or fail"
    rows += unmeasurable_rows(runs)
    return Certificate(arm, runs[0].fabric_name or arm, rows, len(runs), _transport(runs), _topology(runs))


def _point_order(p: str):
    op, _, size = p.partition(" ")
    n, _, unit = size.partition(" ")
    mult = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}.get(unit)
    try:
        return (op, float(n) * mult) if mult else (p, 0.0)
    except ValueError:
        return (p, 0.0)


def _ref(k: Kpi, refs: dict[str, Ref] | None) -> Ref | None:
    return (refs or {}).get(k.key, k.reference)


def _ref_text(k: Kpi, refs: dict[str, Ref] | None) -> str:
    ref = _ref(k, refs)
    return ref.text(k.unit) if ref is not None else f"none in the draft ({k.ideal})"


def unmeasurable_rows(runs: list[Run]) -> list[Row]:
    """The KPIs these hosts cannot measure, each naming its counters; any such counter a record
    holds is summed over the records' nodes and rails and shown."""
    out = []
    for name, section, counters, field_ in UNMEASURABLE:
        seen: dict[str, int] = {}
        for r in runs:
            for n in dig(r.record, "nic.nodes") or []:
                blocks = (n.get("pause") or {}) if field_ == "pause" else (n.get("congestion") or {})
                for rail, vals in blocks.items():
                    for c, v in (vals or {}).items():
                        hit = (field_ == "pause") or (field_ == "cnp" and "cnp" in c) or c == field_
                        if field_ and hit and v is not None:
                            seen[c] = seen.get(c, 0) + int(v)
        note = ("read where present: " + ", ".join(f"{c} {v:,}" for c, v in sorted(seen.items()))) if seen else \
            "no such counter in these records (" + _why_not(runs, field_) + ")"
        out.append(Row("", name, "—", section, f"counters on real NICs: {counters}", "",
                       verdict=NOT_HERE if not seen else "counted, not judged", note=note, reference="—"))
    return out


def _why_not(runs: list[Run], field_: str | None) -> str:
    if field_ is None:
        return "needs per-flow rate telemetry"
    skipped = {n.get("pause_skipped") for r in runs for n in dig(r.record, "nic.nodes") or [] if n.get("pause_skipped")}
    if field_ == "pause" and skipped:
        return "; ".join(sorted(skipped))
    return "no RDMA port with hw_counters: kernel veths and sockets have neither ECN marking nor CNPs"


# -- side by side ------------------------------------------------------------------------------

@dataclass
class Difference:
    kpi: str
    point: str
    verdict: str
    comparison: stats.Comparison | None


def side_by_side(a: Certificate, b: Certificate, alpha: float = ALPHA) -> list[Difference]:
    """B against A (the baseline) per measured KPI row both have: the paired t on the blocks'
    log-ratios where both ran in the same blocks, else Welch's t; Holm over the rows."""
    pairs, comps = [], []
    for ra in a.rows:
        rb = b.row(ra.kpi, ra.point) if ra.kpi else None
        if rb is None or not ra.values or not rb.values:
            continue
        k = KPIS[ra.kpi]
        da, db = dict(zip(ra.blocks, ra.values)), dict(zip(rb.blocks, rb.values))
        common = [blk for blk in da if blk is not None and blk in db]
        positive = all(v > 0 for v in ra.values + rb.values)
        design = stats.Design(blocks=[math.log(db[c] / da[c]) for c in common], name="blocked") \
            if len(common) >= 2 and positive and len(common) == len(da) == len(db) else stats.Design()
        c = stats.compare(rb.values, ra.values, b.arm, a.arm, f"{k.key} {ra.point}", design,
                          stats.Judging(alpha=alpha, higher_is_better=k.higher_is_better, word="better", primary=False))
        pairs.append((ra, c))
        comps.append(c)
    judged = stats.correct(comps, "holm", alpha) if comps else []
    return [Difference(ra.kpi, ra.point, c.verdict, c) for (ra, _), c in zip(pairs, judged)]


def called(d: Difference) -> bool:
    return d.comparison is not None and d.comparison.significant


# -- rendering ---------------------------------------------------------------------------------

NOTE = (f"KPIs, definitions and reference values from the IETF BMWG draft {DRAFT} (February 2026). The draft "
        "calls its reference values non-normative illustrations (its section 4) and not acceptance criteria; "
        "here they are the default limits a value is checked against, replaced by --reference. A value is the "
        "mean over trials (one record each, one block of a study) with its t-interval; the rows judged against a "
        "limit share one family (Bonferroni: each interval at 1 - 0.05/m). pass: the whole interval on the good "
        "side; fail: wholly on the bad side; cannot tell: it straddles the limit, or one trial gave no interval.")
HEAD = ["KPI", "at", "value [interval]", "level", "CV", "reference", "verdict", "definition (draft section)"]


def _cells(r: Row) -> list[str]:
    level = f"{100 * r.level:.1f}%" if r.values and not math.isnan(r.lo) else "—"
    cv = f"{100 * r.cv:.1f}%" if not math.isnan(r.cv) else "—"
    verdict = r.verdict + (f" ({r.note})" if r.note else "")
    return [r.name, r.point, r.value_text(), level, cv, r.reference, verdict, f"{r.definition} ({r.section})"]


def sections(c: Certificate) -> list[Section]:
    measured = [r for r in c.rows if r.values]
    counts = {v: sum(1 for r in measured if r.verdict == v) for v in (PASS, FAIL, UNSURE)}
    head = Section("Certificate", [
        ("head", f"{c.arm}: {counts[PASS]} pass, {counts[FAIL]} fail, {counts[UNSURE]} cannot tell",
         f"over {len(measured)} measured KPI rows from {c.runs} ok records; fabric profile {c.fabric}; {c.topology}."),
        ("p", NOTE)])
    kpis = Section("KPIs", [("table", HEAD, [_cells(r) for r in c.rows if r.kpi])])
    gone = Section("Not measurable here", [("table", ["KPI", "section", "how real NICs measure it", "verdict"],
                                            [[r.name, r.section, r.definition, f"{r.verdict}: {r.note}"] for r in c.rows
                                             if not r.kpi])])
    proof = Section("Transport proof", [("p", "What the runs' transport verification found (the records' "
                                              "fabric.transport): a KPI is only the fabric's when its traffic took it."),
                                        ("list", c.transport)])
    return [head, kpis, gone, proof]


def pair_sections(a: Certificate, b: Certificate, diffs: list[Difference]) -> list[Section]:
    d = {(x.kpi, x.point): x for x in diffs}
    rows = []
    for ra in a.rows:
        if not ra.kpi:
            continue
        rb = b.row(ra.kpi, ra.point) or Row(ra.kpi, ra.name, ra.point, "", "", ra.unit, verdict=ABSENT)
        x = d.get((ra.kpi, ra.point))
        rows.append([ra.name, ra.point, ra.value_text(), ra.verdict, rb.value_text(), rb.verdict,
                     x.verdict if x else "not compared"])
    n_called = sum(called(x) for x in diffs)
    head = Section("Side by side", [
        ("head", f"{b.arm} against {a.arm}: {n_called} of {len(diffs)} KPI rows differ",
         "each difference from the blocks (paired t on block log-ratios), Holm over the rows."),
        ("p", NOTE), ("table", ["KPI", "at", a.arm, "verdict", b.arm, "verdict", f"{b.arm} vs {a.arm}"], rows)])
    return [head, Section("Transport proof", [("list", [f"{a.arm}: {t}" for t in a.transport] +
                                                [f"{b.arm}: {t}" for t in b.transport])])]


def _clean(x):
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def to_json(c: Certificate) -> str:
    return json.dumps(_clean({"draft": DRAFT, **asdict(c)}), indent=1) + "\n"


def pair_json(a: Certificate, b: Certificate, diffs: list[Difference]) -> str:
    rows = [{"kpi": x.kpi, "point": x.point, "verdict": x.verdict, "different": called(x),
             "ratio": x.comparison.ratio, "lo": x.comparison.lo, "hi": x.comparison.hi, "p_adj": x.comparison.p_adj}
            for x in diffs]
    return json.dumps(_clean({"draft": DRAFT, "baseline": a.arm, "arm": b.arm, "differences": rows}), indent=1) + "\n"
