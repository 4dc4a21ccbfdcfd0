"""Projecting a calibrated op to a scale and size: the model's time, its interval and its label."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.projection.forms import MODEL_ONLY, SEED, model_time, op_time, terms
from analysis.projection.intervals import prediction_errors
from workloads.core.errors import UsageError


@dataclass(frozen=True)
class Projection:
    fabric: str
    op: str
    p: int
    size: int
    time_s: float
    low_s: float           # the PI of parameters and noise, at the calibration's level (nan: not printed)
    high_s: float
    half_log: float        # that interval's half-width on log T
    label: str             # measured | interpolated | extrapolated | model-only
    form_log: float | None = None    # the model-form allowance on log T (None: nothing held out)
    form_level: float = 0.0          # the level that allowance attains: n / (n + 1) of its units below 9
    form_units: int = 0              # held-out scales (beyond the data) or measured scales (within it)
    floor_s: float | None = None     # the schedule's floor a model-only interval is held above

    @property
    def busbw_GBps(self) -> float:
        return self.size / self.time_s * terms(self.op, self.p)[1] / 1e9

    @property
    def with_form(self) -> tuple[float, float]:
        """The PI widened by the model-form allowance on each side (floored as the PI is)."""
        m = self.form_log or 0.0
        low = self.low_s * math.exp(-m)
        return (max(low, self.floor_s) if self.floor_s else low), self.high_s * math.exp(m)


def label(p: int, scales: list[int]) -> str:
    top = max(scales)
    if p in scales:
        return "measured"
    if p < top:
        return "interpolated"
    return "extrapolated" if p <= MODEL_ONLY * top else "model-only"


def schedule_floor(cal: dict[str, Any], op: str, p: int, size: int) -> float | None:
    """The least time the schedule allows at p ranks: each serial step at the measured latency floor
    (the fastest call, less its bytes; the op's own, else the fabric's) and the bytes at the line's
    payload ceiling (else its line rate). None when neither was measured: a model-only interval is
    then not printed."""
    c = cal["ops"][op]
    floors = c.get("latency_floor") or {}
    alpha = (floors[min(floors, key=int)]["alpha_floor_s"] if floors else
             (cal.get("latency_floor") or {}).get("alpha_floor_s"))
    rate = cal.get("payload_GBps") or cal.get("line_rate_GBps")
    if alpha is None and not rate:
        return None
    return model_time(op, p, size, alpha or 0.0, 1 / (rate * 1e9) if rate else 0.0, 0.0, c.get("form", "ring"), 0.0)


def project(cal: dict[str, Any], op: str, p: int, size: int) -> Projection:
    import numpy as np

    if op not in cal["ops"]:
        raise UsageError(f"the calibration of {cal['fabric']} has no {op} (it has {', '.join(cal['ops'])})")
    c = cal["ops"][op]
    t = op_time(c, op, p, size)
    level = cal["pi_level"]
    errs = prediction_errors(c, op, p, size, SEED + 1)
    lo, hi = (float(x) for x in np.quantile(errs, [(1 - level) / 2, (1 + level) / 2]))
    low, high = t * math.exp(lo), t * math.exp(hi)
    lab = label(p, c["scales"])
    mf = c["model_form"]["beyond" if lab in ("extrapolated", "model-only") else "within"]
    form = mf["margin_log"]
    if form is not None and lab in ("extrapolated", "model-only"):
        form *= max(1.0, math.log2(p / max(c["scales"])))
    floor = None
    if lab == "model-only":
        floor = schedule_floor(cal, op, p, size)
        low, high = (max(low, floor), max(high, floor)) if floor is not None else (math.nan, math.nan)
    return Projection(cal["fabric"], op, p, size, t, low, high, (hi - lo) / 2, lab, form, mf["level"],
                      len(mf["units"]), floor)


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"--ranks {text!r}: give whole numbers separated by commas, e.g. --ranks 64,512") from None
    if not ranks or any(r < 2 for r in ranks):
        raise UsageError(f"--ranks {text!r}: every scale must be 2 ranks or more")
    return ranks
