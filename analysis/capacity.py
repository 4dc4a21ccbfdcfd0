"""Capacity at an SLO: the highest load each fabric sustains with TTFT p90 under a bound.

Load is the closed-loop concurrency or the Poisson request rate of the inference sweep.
A load level passes when the median over its trials of the chosen TTFT percentile is at
or under the bound; capacity is the highest level such that it and every lower level
pass (a sweep that recovers after failing does not count). It is read at the sweep's
resolution, not interpolated. In hardware: to serve load L at the SLO a fabric needs
L / (capacity per GPU) GPUs, so fabric B needs (cap_A/gpus_A) / (cap_B/gpus_B) - 1 more
than A.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from analysis.load import Table


@dataclass(frozen=True)
class Capacity:
    fabric: str
    model: str | None
    load: str                 # "concurrency" or "rate"
    capacity: float | None    # None: even the lowest level misses the SLO
    gpus: float
    levels: list[tuple[float, float]]  # (load, median TTFT percentile in ms)

    @property
    def per_gpu(self) -> float | None:
        return None if self.capacity is None else self.capacity / self.gpus


def capacities(table: Table, bound_ms: float, metric: str = "p90_ttft_ms") -> list[Capacity]:
    groups: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    gpus: dict[tuple, float] = {}
    for r in table.ok():
        if r.workload != "inference" or r.metric(metric) is None:
            continue
        load = "concurrency" if "concurrency" in r.coords else "rate" if "rate" in r.coords else None
        if load is None:
            continue
        key = (r.fabric, r.model, load)
        groups[key][r.coords[load]].append(r.metric(metric))
        gpus[key] = r.coords.get("world_size", 1.0)
    out = []
    for (fabric, model, load), levels in sorted(groups.items(), key=lambda kv: str(kv[0])):
        meds = [(x, float(np.median(v))) for x, v in sorted(levels.items())]
        cap = None
        for x, m in meds:
            if m > bound_ms:
                break
            cap = x
        out.append(Capacity(fabric, model, load, cap, gpus[(fabric, model, load)], meds))
    return out


def gpu_verdicts(caps: list[Capacity], baseline: str | None, bound_ms: float, metric: str = "p90_ttft_ms") -> list[str]:
    """'to serve the same load at TTFT p90 <= 500 ms, fabric B needs 23% more GPUs than A'."""
    out = []
    pct = metric.split("_")[0]
    by = defaultdict(dict)
    for c in caps:
        by[(c.model, c.load)][c.fabric] = c
    for (model, load), fabs in by.items():
        base = fabs.get(baseline) if baseline else None
        base = base or fabs[sorted(fabs)[0]]
        for f, c in sorted(fabs.items()):
            if c is base:
                continue
            if c.per_gpu is None or base.per_gpu is None:
                who = f if c.per_gpu is None else base.fabric
                out.append(f"{model} ({load}): {who} misses TTFT {pct} <= {bound_ms:g} ms even at the lowest load measured")
                continue
            more = base.per_gpu / c.per_gpu - 1
            if abs(more) < 1e-9:
                out.append(f"{model} ({load}): {f} and {base.fabric} sustain the same load at TTFT {pct} <= {bound_ms:g} ms "
                           f"({c.capacity:g}); same GPU count")
            elif more > 0:
                out.append(f"{model} ({load}): to serve the same load at TTFT {pct} <= {bound_ms:g} ms, {f} needs "
                           f"{100 * more:.0f}% more GPUs than {base.fabric} ({c.capacity:g} vs {base.capacity:g} per {c.gpus:g}/{base.gpus:g} GPUs)")
            else:
                out.append(f"{model} ({load}): to serve the same load at TTFT {pct} <= {bound_ms:g} ms, {base.fabric} needs "
                           f"{100 * (c.per_gpu / base.per_gpu - 1):.0f}% more GPUs than {f} ({base.capacity:g} vs {c.capacity:g})")
    return out
