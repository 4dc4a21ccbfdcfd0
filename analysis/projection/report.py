"""The report's projection section: every calibration found beside the records
(`fabricbench model fit` writes calibration-<fabric>.json into the first results folder), with
its measured points, the fitted curve, the projected band at twice and four times the largest
measured scale, and the held-out check that says how far to trust it (docs/projection.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import median
from typing import Any

from analysis import projection as pj

NOTE = ("The model: T = L(p) x (alpha + kappa x log2(p/2)) + S x G(p) / B (docs/projection.md). The band is the 90% "
        "prediction interval of parameters and noise (the fit redone on cells made again with the measured noise); "
        "the model-form allowance, the held-out error of predicting each scale from the ones below it, is a "
        "separate column with the level its few held-out scales attain. It is the noise of the nodes measured: a "
        "production fabric's tail at scale is not in it. Beyond 2x the largest measured scale a projection is "
        "model-only, its band held above the schedule's floor at the measured latency and line rate.")


def calibrations(root: Path | None) -> list[tuple[Path, dict[str, Any]]]:
    if root is None or not Path(root).is_dir():
        return []
    out = []
    for p in sorted(Path(root).rglob("calibration*.json")):
        try:
            cal = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(cal, dict) and cal.get("schema") == pj.SCHEMA:
            out.append((p, cal))
    return out


def _figure(cal: dict[str, Any], op: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = cal["ops"][op]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    sizes = c["sizes"]
    dense = [int(sizes[0] * (sizes[-1] / sizes[0]) ** (i / 40)) for i in range(41)]
    for p in c["scales"]:
        pts = [(x["size"], x["time_s"]) for x in c["cells"] if x["p"] == p]
        line = ax.plot([s for s, _ in pts], [t * 1e3 for _, t in pts], "o", label=f"{p} ranks measured")[0]
        ax.plot(dense, [1e3 * pj.op_time(c, op, p, s) for s in dense],
                "-", color=line.get_color(), lw=1)
    top = max(c["scales"])
    for k in (pj.MODEL_ONLY, 2 * pj.MODEL_ONLY):
        prs = [pj.project(cal, op, top * k, s) for s in dense]
        band = ax.fill_between(dense, [x.low_s * 1e3 for x in prs], [x.high_s * 1e3 for x in prs], alpha=0.25,
                               label=f"{top * k} ranks projected, 90% PI")
        ax.plot(dense, [x.time_s * 1e3 for x in prs], "--", color=band.get_facecolor()[0], lw=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("time per call (ms)")
    ax.set_title(f"{op}: {cal['fabric']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def rows(cal: dict[str, Any]) -> list[list[str]]:
    out = []
    for op, c in cal["ops"].items():
        held = c["holdout"]
        errs = [abs(math.exp(h["log_error"]) - 1) for h in held]
        top = max(c["scales"])
        at = pj.project(cal, op, top * pj.MODEL_ONLY, c["sizes"][-1])
        out.append([op, ", ".join(map(str, c["scales"])), f"{c['alpha_s'] * 1e6:.1f}", f"{c['kappa_s'] * 1e6:.1f}",
                     f"{c['bandwidth_GBps']:.5g}",
                     f"{', '.join(sorted({str(h['p']) + ' from ' + '+'.join(map(str, h['from'])) for h in held}))}: "
                     f"median {100 * median(errs):.1f}%, worst {100 * max(errs):.1f}%" if held else "-",
                     f"{at.time_s * 1e3:.4g} [{at.low_s * 1e3:.4g}, {at.high_s * 1e3:.4g}] ms at {at.p} ranks, "
                     f"{pj._size(at.size)}", pj.form_words(at)])
    return out


HEAD = ["op", "scales fitted", "alpha (us/step)", "kappa (us/doubling)", "B (GB/s)", "held-out check",
        "projected at 2x (90% PI)", "model-form allowance"]


def blocks(root: Path | None, plots_dir: Path) -> list[tuple]:
    """The report section's blocks (analysis/report.py's kinds) for every calibration under root;
    none when there is no calibration."""
    found = calibrations(root)
    if not found:
        return []
    out: list[tuple] = [("p", NOTE)]
    for path, cal in found:
        out.append(("p", f"{cal['fabric']}: calibration {path.name} (commit {str(cal['code']['commit'])[:12]}, "
                            f"{len(cal['records'])} records, made {cal['created']})"))
        out.append(("table", HEAD, rows(cal)))
        for op in cal["ops"]:
            fig = _figure(cal, op, plots_dir / f"projection-{path.stem}-{op}.png")
            out.append(("figure", fig, f"{op} on {cal['fabric']}: measured points, the fitted curve per scale, and "
                                          f"the projected 90% band at {pj.MODEL_ONLY}x and {2 * pj.MODEL_ONLY}x (model-only) the largest measured scale"))
    return out
