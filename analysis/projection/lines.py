"""What the `model` commands print: a fit's parameters, a projection, a comparison's verdict, a
check's summary, a step projection."""

from __future__ import annotations

import math
from statistics import median
from typing import Any

from analysis.projection.forms import MODEL_ONLY, PI_LEVEL, terms
from analysis.projection.project import Projection
from analysis.projection.step import StepProjection


def _pct(x: float) -> str:
    return f"{100 * (math.exp(x) - 1):.1f}%"


def form_words(pr: Projection) -> str:
    """The model-form allowance in words: its size, what it is made of and the level it attains."""
    if pr.form_log is None:
        return "model form: no scale held out"
    kind = "held-out scale" if pr.label in ("extrapolated", "model-only") else "measured scale"
    lo, hi = pr.with_form
    return (f"model form +-{_pct(pr.form_log)} from {pr.form_units} {kind}{'s' if pr.form_units != 1 else ''} "
            f"(level {100 * pr.form_level:.0f}%): [{lo * 1e3:.3f}, {hi * 1e3:.3f}]")


def projection_line(pr: Projection) -> str:
    tag = {"model-only": f"model-only: beyond {MODEL_ONLY}x the largest measured scale, nothing measured supports "
                         "this; the interval assumes the model's schedule still holds and is held above its floor "
                         "at the measured latency and line rate"}.get(pr.label, pr.label)
    if math.isnan(pr.low_s):
        return (f"{pr.fabric} {pr.op} {_size(pr.size)} at {pr.p} ranks: {pr.time_s * 1e3:.3f} ms, no interval "
                f"(model-only: beyond {MODEL_ONLY}x the largest measured scale, and neither a latency floor nor a "
                "line rate was measured to hold it above the schedule's floor)")
    g = terms(pr.op, pr.p)[1]
    return (f"{pr.fabric} {pr.op} {_size(pr.size)} at {pr.p} ranks: {pr.time_s * 1e3:.3f} ms "
            f"[{pr.low_s * 1e3:.3f}, {pr.high_s * 1e3:.3f}] ({round(100 * PI_LEVEL)}% PI, parameters and noise); "
            f"{form_words(pr)}; busbw {pr.busbw_GBps:.4g} GB/s [{pr.size / pr.high_s * g / 1e9:.4g}, "
            f"{pr.size / pr.low_s * g / 1e9:.4g}]; {tag}")


def compare(a: Projection, b: Projection) -> str:
    """The verdict of a projected comparison, in the study's words: `at 512 ranks, A is faster
    than B by x% [lo, hi] (90% PI)`, x = the slower one's time over the faster one's, minus 1;
    or `cannot tell at that scale` when the interval holds 0."""
    d = math.log(b.time_s / a.time_s)
    if math.isnan(a.low_s) or math.isnan(b.low_s):
        return (f"at {a.p} ranks, {a.op} {_size(a.size)}: cannot tell at that scale: a model-only projection without "
                "an interval (no latency floor or line rate measured) decides nothing")
    half = math.sqrt(a.half_log ** 2 + b.half_log ** 2)
    lo, hi = d - half, d + half
    fast, slow = (a, b) if d >= 0 else (b, a)
    lo, hi = (lo, hi) if d >= 0 else (-hi, -lo)
    pct = lambda x: 100 * (math.exp(x) - 1)  # noqa: E731
    where = f"at {a.p} ranks, {a.op} {_size(a.size)}"
    labels = {a.label, b.label}
    note = " (model-only projection)" if "model-only" in labels else ""
    if lo <= 0:
        return (f"{where}: cannot tell at that scale: {fast.fabric} faster than {slow.fabric} by {pct(abs(d)):.1f}% "
                f"[{pct(lo):+.1f}, {pct(hi):+.1f}] ({round(100 * PI_LEVEL)}% PI){note}")
    return (f"{where}: {fast.fabric} is faster than {slow.fabric} by {pct(abs(d)):.1f}% [{pct(lo):.1f}, {pct(hi):.1f}] "
            f"({round(100 * PI_LEVEL)}% PI){note}")


def _size(n: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def check_summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no cell of these records is a collective the calibration has"
    inside = sum(r["inside"] for r in rows)
    widened = sum(r["inside_with_form"] for r in rows)
    return (f"{inside} of {len(rows)} measured cells inside their {round(100 * PI_LEVEL)}% PI "
            f"({100 * inside / len(rows):.0f}%), {widened} inside it widened by the model-form allowance; "
            f"median |error| {100 * median(r['abs_error'] for r in rows):.1f}%")


def fit_lines(cal: dict[str, Any]) -> list[str]:
    """What `model fit` prints: per op the parameters with their 90% intervals and the held-out check."""
    out = [f"calibration of {cal['fabric']} (commit {str(cal['code']['commit'])[:12]}"
           f"{', with edits' if cal['code']['dirty_hash'] else ''}) from {len(cal['records'])} records"]
    floor = cal.get("latency_floor")
    if floor:
        out.append(f"  latency: {floor['alpha_floor_s'] * 1e6:.1f} us per ring step at {floor['p']} ranks (the fastest "
                   f"{floor['op']} call of the smallest sampled size, less its bytes: the fabric's round trip plus the "
                   "host's least cost)")
    for op, c in cal["ops"].items():
        lo, hi = c["alpha_90"]
        blo, bhi = c["bandwidth_GBps_90"]
        klo, khi = c["kappa_90"]
        unit = "per iteration (its announcement's round trip and the host's cost)" if c.get("form") == "gloo" else "per step"
        line = (f"  {op} ({c['algorithm']}): alpha {c['alpha_s'] * 1e6:.1f} us [{lo * 1e6:.1f}, {hi * 1e6:.1f}] {unit} "
                f"at 2 ranks, + {c['kappa_s'] * 1e6:.1f} us [{klo * 1e6:.1f}, {khi * 1e6:.1f}] per doubling, "
                f"B {c['bandwidth_GBps']:.5g} GB/s [{blo:.5g}, {bhi:.5g}] bus bandwidth (90% intervals, the fit "
                f"refitted on cells made again with the noise of its {c['uncertainty'].split(' (')[0]}); scales {', '.join(map(str, c['scales']))}, blocks "
                f"{', '.join(f'{k}: {v}' for k, v in c['blocks'].items())}")
        if cal.get("payload_GBps") and c["bandwidth_GBps"]:
            line += f"; {100 * c['bandwidth_GBps'] / cal['payload_GBps']:.1f}% of the link's TCP payload ceiling"
            if c["bandwidth_GBps"] > cal["payload_GBps"]:
                # no bus bandwidth exceeds what the link can carry: the form, or the records' fabric, is wrong
                line += " - ABOVE it: no fabric reaches that; the model's form does not describe these records"
        out.append(line)
        if "serial" in c:
            slo, shi = c["serial_90"]
            out.append(f"    at 2 ranks {100 * c['serial']:.0f}% [{100 * slo:.0f}, {100 * shi:.0f}] of the calls took a half "
                       "chunk longer: the late rank's announcements queued behind its own data on the one connection")
        floor = c.get("latency_floor") or {}
        if floor:
            p0, f = min(floor.items(), key=lambda kv: int(kv[0]))
            out.append(f"    latency floor: {f['alpha_floor_s'] * 1e6:.1f} us per step at {p0} ranks (the fastest of "
                       f"{f['calls']} calls of {_size(f['size'])}, less its bytes; alpha also holds the host's typical "
                       "cost of a step)")
        out += noise_lines(c)
        held = c["holdout"]
        if held:
            errs = [abs(math.exp(h["log_error"]) - 1) for h in held]
            mf = c["model_form"]["beyond"]
            n = len(mf["units"])
            out.append(f"    held out: {', '.join(sorted({str(h['p']) + ' from ' + '+'.join(map(str, h['from'])) for h in held}))}: "
                       f"median |error| {100 * median(errs):.1f}%, worst {100 * max(errs):.1f}%; model-form allowance "
                       f"{_pct(mf['margin_log'])} per doubling of scale, from {n} held-out scale{'s' if n != 1 else ''} "
                       f"(level {100 * mf['level']:.0f}%{': the largest of them' if n < 9 else ''})")
    return out


FEW_DOF = 10    # below this many degrees of freedom the noise's own uncertainty widens the PI visibly


def noise_lines(c: dict[str, Any]) -> list[str]:
    """How the noise was measured, and a note when from few blocks (the PI widens for it)."""
    nm = c["noise_model"]
    blocks = ", ".join(f"{v} at {k} ranks" for k, v in c["blocks"].items())
    if nm["source"] != "blocks":
        return [f"    noise: from the fit's residuals ({nm['dof']} degrees of freedom; blocks: {blocks}): run 2 or "
                "more trials per scale to measure it between blocks"]
    sds = ", ".join(f"{100 * v:.1f}% at {k}" for k, v in nm["sd"].items())
    out = [f"    noise: one block's log sd {sds} ranks, between blocks ({nm['dof']} degrees of freedom)"]
    if nm["dof"] < FEW_DOF or min(c["blocks"].values()) < 3:
        out.append(f"    note: few blocks ({blocks}): the noise is known to {nm['dof']} degrees of freedom only and "
                   "the PI is widened for it; run more trials per scale for a narrower one")
    return out


def step_line(sp: StepProjection) -> str:
    if math.isnan(sp.low_s):
        return (f"training step at {sp.p} ranks: {sp.step_s * 1e3:.1f} ms, no interval (model-only, no latency floor "
                f"or line rate measured); from {sp.measured_step_s * 1e3:.1f} ms measured at {sp.ranks} ranks")
    return (f"training step at {sp.p} ranks: {sp.step_s * 1e3:.1f} ms [{sp.low_s * 1e3:.1f}, {sp.high_s * 1e3:.1f}] "
            f"({round(100 * PI_LEVEL)}% PI; communication {sp.comm_s * 1e3:.1f} ms of it) from {sp.measured_step_s * 1e3:.1f} "
            f"ms measured at {sp.ranks} ranks ({sp.measured_comm_s * 1e3:.1f} ms with a collective in flight); {sp.label}")
