"""Projecting a calibrated op to a scale and size: the model's time, its interval and its label."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from analysis.projection.forms import MODEL_ONLY, model_time, op_time, terms
from analysis.projection.intervals import noise_at
from workloads.core.errors import UsageError


@dataclass(frozen=True)
class Projection:
    fabric: str
    op: str
    p: int
    size: int
    time_s: float
    low_s: float
    high_s: float
    half_log: float        # the interval's half-width on log T
    label: str             # measured | interpolated | extrapolated | model-only

    @property
    def busbw_GBps(self) -> float:
        return self.size / self.time_s * terms(self.op, self.p)[1] / 1e9


def label(p: int, scales: list[int]) -> str:
    top = max(scales)
    if p in scales:
        return "measured"
    if p < top:
        return "interpolated"
    return "extrapolated" if p <= MODEL_ONLY * top else "model-only"


def project(cal: dict[str, Any], op: str, p: int, size: int) -> Projection:
    from scipy import stats

    if op not in cal["ops"]:
        raise UsageError(f"the calibration of {cal['fabric']} has no {op} (it has {', '.join(cal['ops'])})")
    c = cal["ops"][op]
    t = op_time(c, op, p, size)
    shape = c.get("form", "ring")      # a calibration written before serial has three numbers a draw
    logs = [math.log(v) for d in c["draws"] if (v := model_time(op, p, size, *d[:3], shape, (d[3:] or [0.0])[0])) > 0]
    mean = sum(logs) / len(logs)
    param_sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / max(1, len(logs) - 1))
    z = stats.norm.ppf(0.5 + cal["pi_level"] / 2)
    lab = label(p, c["scales"])
    top = max(c["scales"])
    if lab in ("extrapolated", "model-only"):
        per = c["model_form_q90_per_doubling"] or 0.0
        form = per * max(1.0, math.log2(p / top))
    else:
        form = c["residual_q90"]
    half = math.sqrt((z * param_sd) ** 2 + (z * noise_at(c, p)) ** 2 + form ** 2)
    return Projection(cal["fabric"], op, p, size, t, t * math.exp(-half), t * math.exp(half), half, lab)


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"--ranks {text!r}: give whole numbers separated by commas, e.g. --ranks 64,512") from None
    if not ranks or any(r < 2 for r in ranks):
        raise UsageError(f"--ranks {text!r}: every scale must be 2 ranks or more")
    return ranks
