"""Capacity at an SLO: the request rate per GPU each fabric sustains with TTFT under a bound.

A sweep is the inference records that are equal (analysis/guard.py identity) except for the
fabric and the load level (arrival.concurrency / arrival.rate / point); its records at one
level are the trials. Per level: the median over trials of the TTFT percentile (ms) and of
request_throughput (req/s: completed requests / point duration, vLLM's definition).

A level passes when its median TTFT is at or under the bound. The last passing level L_p is
the highest level such that it and every lower one pass (a sweep that recovers after failing
does not count); L_f is the level after it, the first failing one. The SLO crossing is
interpolated linearly in the TTFT-vs-level curve, t = (bound - TTFT_p) / (TTFT_f - TTFT_p),
and the capacity is the throughput there, R_p + t (R_f - R_p) req/s; per GPU it is divided by
the server's GPUs, server.tp (the total tensor-parallel degree over all nodes: SGLang --tp,
vLLM --tensor-parallel-size; so nnodes is not a factor).

Why req/s and not the level: a closed-loop concurrency is not a load; the GPUs needed for L
req/s are L / (capacity per GPU), so fabric B needs cap_A / cap_B - 1 more GPUs than A.
The sweep itself only knows that the capacity lies between R_p and R_f (the bracket; open
above when every level passes, [0, R_first] when none does); the interpolation assumes the
curve is straight in between. A percentage is stated only when two fabrics' brackets do not
overlap; otherwise the text says the sweep cannot tell them apart, and where to sweep finer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from analysis import guard
from analysis.load import Run, Table, is_served

# Identity keys that are the load level of a sweep, not the sweep.
LEVEL_KEYS = ("arrival.concurrency", "arrival.rate", "point")


@dataclass(frozen=True)
class Level:
    x: float          # concurrency (closed loop) or offered rate in req/s (open loop)
    label: str        # the point's label: "c32", "poisson-r8"
    ttft_ms: float    # median over trials of the TTFT percentile
    rps: float        # median over trials of request_throughput, req/s (all GPUs)
    trials: int


@dataclass(frozen=True)
class Capacity:
    fabric: str
    model: str | None
    sweep: str                  # label of the sweep: model, server, tp, arrival
    load: str                   # "concurrency" or "rate"
    gpus: float
    levels: list[Level]
    passed: Level | None        # last passing level (None: even the lowest misses)
    failed: Level | None        # first failing level (None: every level passes)
    capacity: float | None      # interpolated req/s over all GPUs; None unless the sweep crossed the bound
    crossing: float | None      # interpolated load level at the crossing
    key: tuple = ()             # the sweep's identity without fabric and level

    @property
    def per_gpu(self) -> float | None:
        return None if self.capacity is None else self.capacity / self.gpus

    @property
    def bracket(self) -> tuple[float, float]:
        """(lo, hi) req/s over all GPUs between which the capacity lies; hi = inf when every level passed."""
        if self.passed and self.failed:
            return min(self.passed.rps, self.failed.rps), max(self.passed.rps, self.failed.rps)
        if self.passed:
            return self.passed.rps, math.inf
        return 0.0, self.failed.rps if self.failed else math.inf

    @property
    def bracket_per_gpu(self) -> tuple[float, float]:
        lo, hi = self.bracket
        return lo / self.gpus, hi / self.gpus

    def where(self) -> str:
        if self.passed and self.failed:
            return f"between {self.passed.label} and {self.failed.label}"
        if self.passed:
            return f"above {self.passed.label} (every level passed)"
        return f"below {self.failed.label} (no level passed)" if self.failed else "nowhere (no levels)"

    def describe(self, bound_ms: float, pct: str) -> str:
        head = f"{self.fabric} {self.sweep}"
        lo, hi = self.bracket_per_gpu
        if self.passed and self.failed:
            p, f = self.passed, self.failed
            return (f"{head}: TTFT {pct} crosses {bound_ms:g} ms between {p.label} ({p.ttft_ms:.4g} ms, {p.rps:.4g} req/s) "
                    f"and {f.label} ({f.ttft_ms:.4g} ms, {f.rps:.4g} req/s); interpolated capacity {self.capacity:.4g} req/s "
                    f"= {self.per_gpu:.4g} req/s per GPU on {self.gpus:g} GPUs (bracket {lo:.4g}-{hi:.4g} req/s per GPU)")
        if self.passed:
            p = self.passed
            return (f"{head}: every level up to {p.label} meets TTFT {pct} <= {bound_ms:g} ms ({p.ttft_ms:.4g} ms there): "
                    f"capacity at least {p.rps:.4g} req/s = {lo:.4g} req/s per GPU on {self.gpus:g} GPUs; "
                    "the sweep stopped before the SLO was reached")
        f = self.failed
        return (f"{head}: misses TTFT {pct} <= {bound_ms:g} ms even at the lowest level {f.label} ({f.ttft_ms:.4g} ms): "
                f"capacity below {f.rps:.4g} req/s = {hi:.4g} req/s per GPU on {self.gpus:g} GPUs")


def _interpolate(levels: list[Level], bound_ms: float) -> tuple[Level | None, Level | None, float | None, float | None]:
    passed = None
    for lv in levels:
        if lv.ttft_ms > bound_ms:
            if passed is None:
                return None, lv, None, None
            t = (bound_ms - passed.ttft_ms) / (lv.ttft_ms - passed.ttft_ms)  # in [0, 1): pass <= bound < fail
            return passed, lv, passed.rps + t * (lv.rps - passed.rps), passed.x + t * (lv.x - passed.x)
        passed = lv
    return passed, None, None, None


def _sweep_label(r: Run) -> str:
    srv = r.record.get("server") if isinstance(r.record.get("server"), dict) else {}
    parts = [str(r.model or ""), str(srv.get("adapter") or ""), f"tp{srv['tp']}" if srv.get("tp") else ""]
    if (srv.get("nnodes") or 1) > 1:
        parts.append(f"{srv['nnodes']} nodes")
    parts.append("closed loop" if r.arrival == "closed" else str(r.arrival or ""))
    if "burstiness" in r.coords:
        parts.append(f"burstiness {r.coords['burstiness']:g}")
    if "max_concurrency" in r.coords:
        parts.append(f"max {r.coords['max_concurrency']:g} in flight")
    return " ".join(p for p in parts if p)


def capacities(table: Table, bound_ms: float, metric: str = "p90_ttft_ms", allow: Iterable[str] = ()) -> list[Capacity]:
    skip = (*allow, *LEVEL_KEYS)
    groups: dict[tuple, dict[float, list[Run]]] = defaultdict(lambda: defaultdict(list))
    for r in table.ok():
        if not is_served(r.workload) or r.metric(metric) is None or r.metric("request_throughput") is None:
            continue
        load = "concurrency" if "concurrency" in r.coords else "rate" if "rate" in r.coords else None
        if load is None:
            continue  # a burst has no load level
        groups[(guard.point_key(r.record, skip), r.arm, load)][r.coords[load]].append(r)
    out = []
    for (key, fabric, load), by_x in groups.items():
        levels = [Level(x, runs[0].point or f"{x:g}", float(np.median([r.metric(metric) for r in runs])),
                        float(np.median([r.metric("request_throughput") for r in runs])), len(runs))
                  for x, runs in sorted(by_x.items())]
        first = next(iter(by_x.values()))[0]
        passed, failed, cap, crossing = _interpolate(levels, bound_ms)
        out.append(Capacity(fabric, first.model, _sweep_label(first), load, first.coords.get("world_size", 1.0),
                            levels, passed, failed, cap, crossing, key))
    return sorted(out, key=lambda c: (c.sweep, c.fabric))


def gpu_verdicts(caps: list[Capacity], baseline: str | None, bound_ms: float, metric: str = "p90_ttft_ms") -> list[str]:
    """Per sweep, each fabric against the baseline: 'to serve the same load at TTFT p90 <= 500 ms,
    roce needs 5% more GPUs than ib', or that the sweep cannot tell them apart."""
    pct = metric.split("_")[0]
    slo = f"TTFT {pct} <= {bound_ms:g} ms"
    by: dict[tuple, dict[str, Capacity]] = defaultdict(dict)
    for c in caps:
        by[(c.key, c.load)][c.fabric] = c
    out = []
    for fabs in by.values():
        base = fabs.get(baseline) if baseline else None
        base = base or fabs[sorted(fabs)[0]]
        for f, c in sorted(fabs.items()):
            if c is not base:
                out.append(f"{c.sweep}: " + _verdict(c, base, slo))
    return out


def _verdict(c: Capacity, base: Capacity, slo: str) -> str:
    (clo, chi), (blo, bhi) = c.bracket_per_gpu, base.bracket_per_gpu
    if chi < blo:
        worse, better = c, base
    elif bhi < clo:
        worse, better = base, c
    else:
        return (f"the sweep cannot tell {c.fabric} and {base.fabric} apart at {slo}: {c.fabric} crosses it "
                f"{c.where()} ({_span(clo, chi)} req/s per GPU), {base.fabric} {base.where()} ({_span(blo, bhi)} req/s "
                "per GPU); "
                "a finer sweep between those levels, or more trials, would")
    (wlo, whi), (blo, bhi) = worse.bracket_per_gpu, better.bracket_per_gpu
    least = blo / whi - 1
    most = bhi / wlo - 1 if wlo > 0 else math.inf
    span = f"the brackets allow {100 * least:.0f}% to {100 * most:.0f}%" if math.isfinite(most) else \
        f"the brackets allow at least {100 * least:.0f}%"
    if worse.per_gpu is not None and better.per_gpu is not None:
        more = better.per_gpu / worse.per_gpu - 1
        return (f"to serve the same load at {slo}, {worse.fabric} needs {100 * more:.0f}% more GPUs than {better.fabric} "
                f"(interpolated {worse.per_gpu:.4g} vs {better.per_gpu:.4g} req/s per GPU, crossing {worse.where()} vs "
                f"{better.where()}; {span})")
    return (f"to serve the same load at {slo}, {worse.fabric} needs at least {100 * least:.0f}% more GPUs than "
            f"{better.fabric} ({worse.fabric} {worse.where()}: {_span(wlo, whi)} req/s per GPU; {better.fabric} "
            f"{better.where()}: {_span(blo, bhi)}; {span})")


def _span(lo: float, hi: float) -> str:
    return f">= {lo:.4g}" if math.isinf(hi) else f"{lo:.4g}-{hi:.4g}"
