"""A calibration: per op the fitted parameters, their intervals, the held-out check and the latency
floor, written as one JSON-ready dict; and reading one back."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

import analysis.projection.forms as forms
from analysis.projection.fit import _cells, fit_params, holdout
from analysis.projection.forms import (
    ALGORITHMS,
    BOOTSTRAP,
    GLOO_ALGORITHMS,
    MODEL_ONLY,
    PI_LEVEL,
    SCHEMA,
    SEED,
    form_of,
    model_time,
    terms,
    wire_op,
)
from analysis.projection.intervals import _blocks, _ends, _noise, form_units, noise_model, parametric_draws
from analysis.projection.records import Point, code_of, fabric_of, points, select
from workloads.core.errors import UsageError


def fit_op(op: str, pts: list[Point], boot: int = BOOTSTRAP, seed: int = SEED, form: str = "ring") -> dict[str, Any]:
    """The calibration of one op: parameters with parametric-bootstrap intervals, the noise model,
    the held-out check and the model-form allowance's units, and the draws a projection needs."""
    cells = _cells(pts)
    params = fit_params(op, [(p, s, t) for (p, s), t in cells.items()], form)
    a, b, kap, ser = params
    scales = sorted({p for p, _ in cells})
    blocks = _blocks(pts)
    nblocks = {(p, s): len({pt.block for pt in pts if pt.p == p and pt.size == s}) for p, s in cells}
    resid = {k: math.log(t / model_time(op, k[0], k[1], a, b, kap, form, ser)) for k, t in cells.items()}
    serial_free = form == "gloo" and forms.serial_segments(op, 2) and 2 in scales
    noise = noise_model(blocks, resid, 3 + bool(serial_free))
    draws = parametric_draws(op, cells, nblocks, params, noise, boot, seed, form)
    held = holdout(op, cells, form)
    mf = form_units(held, resid)
    be = _ends([d[1] for d in draws])
    out = {
        "algorithm": GLOO_ALGORITHMS[op] if form == "gloo" else ALGORITHMS[op][0],
        "form": form,
        "alpha_s": a, "beta_s_per_byte": b, "kappa_s": kap,
        "kappa_90": _ends([d[2] for d in draws]),
        "bandwidth_GBps": (1 / b / 1e9) if b > 0 else None,
        "alpha_90": _ends([d[0] for d in draws]),
        "bandwidth_GBps_90": [1 / x / 1e9 if x > 0 else None for x in (be[1], be[0])],
        "uncertainty": "blocks" if noise["source"] == "blocks" else
                       "residuals (one block at some scale: run 2 or more trials per scale for the noise between blocks)",
        "blocks": {str(p): len(blocks[p]) for p in scales},
        "sizes": sorted({s for _, s in cells}),
        "scales": scales,
        "cells": [{"p": p, "size": s, "time_s": t} for (p, s), t in sorted(cells.items())],
        "noise_log_sd": {str(p): v for p, (v, _) in _noise(blocks).items()},
        "noise_model": noise,
        "holdout": held,
        "model_form": mf,
        "draws": draws,
    }
    if form == "gloo" and forms.serial_segments(op, 2):
        out |= {"serial": ser, "serial_90": _ends([d[3] for d in draws])}
    return out


def latency_floor(recs: list[tuple[Path, dict[str, Any]]], op: str, beta: float, form: str = "ring") -> dict[str, Any]:
    """Per scale, the latency the fabric cannot hide: the fastest call of the smallest size whose
    calls were timed one by one (`row.stability`, collectives.sample_iters; a call's time is its
    slowest rank's), less its bytes (size x G(p) x beta), per ring step (of wire_op's ring: a Gloo
    reduce_scatter's are its all_reduce's). A host that is busy only
    ever adds to a call, so the fastest of many calls is the round trip plus the host's least cost,
    where the block time's mean also holds every scheduling delay of the block (docs/projection.md,
    "Latency"). {} when no record sampled a size of op."""
    best: dict[int, tuple[int, float, int]] = {}      # p -> (size, fastest call s, calls)
    for _, r in recs:
        for row in r.get("rows") or []:
            by_rank = ((row.get("stability") or {}).get("times_us_by_rank")) or {}
            if row.get("op") != op or not by_rank or not row.get("size"):
                continue
            p = int(row.get("group_size") or (r.get("world") or {}).get("world_size"))
            calls = [max(c) / 1e6 for c in zip(*by_rank.values())]
            size, t, n = best.get(p, (row["size"], math.inf, 0))
            if row["size"] < size:
                size, t, n = row["size"], math.inf, 0
            if row["size"] == size:
                best[p] = (size, min(t, min(calls)), n + len(calls))
    out = {}
    for p, (size, t, n) in sorted(best.items()):
        L, G = terms(wire_op(op, form), p)
        out[str(p)] = {"size": size, "calls": n, "fastest_call_s": t, "alpha_floor_s": max(0.0, t - size * G * beta) / L}
    return out


def fit(records: list[tuple[Path, dict[str, Any]]], fabric: str | None = None, ops: Iterable[str] | None = None,
        boot: int = BOOTSTRAP) -> dict[str, Any]:
    """The calibration (a JSON-ready dict) of one fabric from its collectives records."""
    recs = select(records, fabric)
    pts = [pt for _, r in recs for pt in points(r, ops)]
    by_op: dict[str, list[Point]] = {}
    for pt in pts:
        by_op.setdefault(pt.op, []).append(pt)
    fitted = {}
    for op, ps in sorted(by_op.items()):
        if len({pt.p for pt in ps}) >= 2 and len({pt.size for pt in ps}) >= 2:
            form = form_of(recs, op)
            fitted[op] = fit_op(op, ps, boot, form=form)
            fitted[op]["latency_floor"] = latency_floor(recs, op, fitted[op]["beta_s_per_byte"], form)
    if not fitted:
        raise UsageError("no collective was measured at two or more scales and two or more sizes in these records; "
                         "sweep a size range (collectives.minbytes=64K collectives.maxbytes=16M) at each world size")
    first = recs[0][1]
    commit, dirty = code_of(first)
    # the fabric's latency: the least floor of any op at the smallest scale (each op's floor is the
    # round trip plus that op's least host cost: Gloo's all_reduce adds its reduction and wake-ups)
    floors = [(int(p), f["alpha_floor_s"], op) for op, c in fitted.items() for p, f in c["latency_floor"].items()]
    floor = None
    if floors:
        p0 = min(p for p, _, _ in floors)
        a0, op0 = min((a, op) for p, a, op in floors if p == p0)
        floor = {"p": p0, "op": op0, "alpha_floor_s": a0}
    payload = [(r.get("line_rate") or {}).get("payload_per_comm(GB/s)") for _, r in recs]
    line = [(r.get("line_rate") or {}).get("per_comm(GB/s)") for _, r in recs]
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S%z"),
        "fabric": fabric_of(first),
        # select() let through one backend (and one NCCL) only: the calibration says which
        "backend": (first.get("fabric") or {}).get("backend"),
        "nccl_version": (first.get("fingerprint") or {}).get("nccl"),
        "emulate": ((first.get("config") or {}).get("fabric") or {}).get("emulate"),
        "code": {"commit": commit, "dirty_hash": dirty},
        "records": sorted({str(p) for p, _ in recs}),
        "record_ids": sorted({str(r.get("record_id")) for _, r in recs if r.get("record_id")}),
        "records_digest": hashlib.sha256("\n".join(sorted(str(r.get("record_id")) for _, r in recs)).encode()).hexdigest()[:16],
        "newest_record": max((r.get("created") or "" for _, r in recs), default=None),
        "payload_GBps": min(payload) if payload and all(payload) else None,
        "line_rate_GBps": min(line) if line and all(line) else None,
        "pi_level": PI_LEVEL,
        "model_only_beyond": MODEL_ONLY,
        "latency_floor": floor,
        "ops": fitted,
    }


def load(path: str | Path) -> dict[str, Any]:
    try:
        cal = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read a calibration ({e.__class__.__name__}); make one with "
                         "`fabricbench model fit RESULTS --out cal.json`") from None
    if not isinstance(cal, dict) or cal.get("schema") != SCHEMA:
        raise UsageError(f"{path} is not a {SCHEMA} calibration (schema {cal.get('schema') if isinstance(cal, dict) else None!r}); "
                         "refit with `fabricbench model fit`")
    bad = problem(cal)
    if bad:
        raise UsageError(f"{path}: field {bad}; the file was edited or is damaged: refit with `fabricbench model fit`")
    return cal


# What a check of one field says is wrong with its value (None: fine).
def _num(lo: float = 0.0, hi: float = math.inf, *, above: bool = False, null: bool = False):
    def check(v):
        if v is None and null:
            return None
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return "not a finite number"
        if v < lo or v > hi or (above and v == lo):
            return f"outside {'(' if above else '['}{lo}, {hi}]"
        return None
    return check


def _kind(*types, null: bool = False):
    def check(v):
        if v is None and null:
            return None
        return None if isinstance(v, types) and not isinstance(v, bool) else f"not {' or '.join(t.__name__ for t in types)}"
    return check


def _ints(v):
    if not isinstance(v, list) or not v:
        return "not a non-empty list"
    return next((f"holds {x!r}, not a whole number above 0" for x in v
                 if not isinstance(x, int) or isinstance(x, bool) or x < 1), None)


def _draws(v):
    if not isinstance(v, list) or not v:
        return "not a non-empty list"
    for d in v:
        if not isinstance(d, list) or len(d) < 3 or any(_num()(x) for x in d):
            return f"holds {d!r}, not a list of 3 or more finite numbers >= 0"
    return None


def _margin(v):
    if not isinstance(v, dict):
        return "not a mapping"
    for side in ("beyond", "within"):
        m = v.get(side)
        if not isinstance(m, dict) or not isinstance(m.get("units"), dict):
            return f"{side} is not a mapping with units"
        why = _num(0, 1)(m.get("level")) or _num(null=True)(m.get("margin_log"))
        if why:
            return f"{side}: {why}"
    return None


def _noise_model(v):
    if not isinstance(v, dict) or not isinstance(v.get("sd"), dict):
        return "not a mapping with sd"
    return (next((f"sd at {k} is {x!r}, not a finite number >= 0" for k, x in v["sd"].items() if _num()(x)), None)
            or (None if isinstance(v.get("dof"), int) and v["dof"] >= 0 else f"dof is {v.get('dof')!r}, not a count"))


TOP = {"fabric": _kind(str), "code": _kind(dict), "pi_level": _num(0, 1, above=True), "ops": _kind(dict),
       "records": _kind(list), "payload_GBps": _num(above=True, null=True), "line_rate_GBps": _num(above=True, null=True),
       "latency_floor": _kind(dict, null=True), "nccl": _kind(dict)}
OPTIONAL = {"payload_GBps", "line_rate_GBps", "latency_floor", "nccl"}
PER_OP = {"alpha_s": _num(), "beta_s_per_byte": _num(), "kappa_s": _num(), "form": _kind(str), "scales": _ints,
          "sizes": _ints, "draws": _draws, "noise_model": _noise_model, "model_form": _margin,
          "holdout": _kind(list), "cells": _kind(list), "latency_floor": _kind(dict), "blocks": _kind(dict)}


def problem(cal: dict[str, Any]) -> str | None:
    """The first field of a calibration a projection cannot use, in words (`ops.all_reduce.alpha_s
    is 'fast', not a finite number`), or None."""
    for key, check in TOP.items():
        if key not in cal:
            if key in OPTIONAL:
                continue
            return f"{key} is missing"
        why = check(cal[key])
        if why:
            return f"{key} is {cal[key]!r:.60}, {why}"
    for key in ("commit", "dirty_hash"):
        if key not in cal["code"] or _kind(str, null=True)(cal["code"][key]):
            return f"code.{key} is missing or not a string"
    if not cal["ops"]:
        return "ops is empty"
    for op, c in cal["ops"].items():
        if op not in ALGORITHMS:
            return f"ops.{op} is not a collective the model knows ({', '.join(ALGORITHMS)})"
        if not isinstance(c, dict):
            return f"ops.{op} is not a mapping"
        for key, check in PER_OP.items():
            if key not in c:
                return f"ops.{op}.{key} is missing"
            why = check(c[key])
            if why:
                return f"ops.{op}.{key} is {c[key]!r:.60}, {why}"
        if c["form"] not in ("ring", "gloo"):
            return f"ops.{op}.form is {c['form']!r}, not ring or gloo"
        if "serial" in c and _num(0, 1)(c["serial"]):
            return f"ops.{op}.serial is {c['serial']!r:.60}, not a share in [0, 1]"
    return None
