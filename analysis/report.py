"""Markdown and self-contained HTML reports: runs, verdicts with intervals, capacity, plots.

The HTML embeds every PNG as base64, so one file can be mailed or attached as is.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass
from pathlib import Path

from analysis import capacity, export, plots
from analysis.compare import Result
from analysis.load import Table


@dataclass
class Report:
    markdown: Path
    html: Path
    images: list[Path]
    verdicts: list[str]
    json: Path | None = None      # report.json: every verdict, the rows of `compare --json`


def _transport(r) -> str:
    t = r.transport
    if not t:
        return "not verified"
    net = (t.get("summary") or {}).get("network") if isinstance(t.get("summary"), dict) else None
    return f"{r.transport_verdict or '?'}" + (f" ({net})" if net else "")


NA = "—"  # a column that does not apply to the workload (collectives have no model or batch)


def _names(table: Table) -> dict[int, str]:
    """Each record's path relative to the directory all local records share: every run
    directory writes the same file names (pretrain-mb4.json in each), so a bare name is
    ambiguous. W&B sources (wandb://entity/project/id) are unique already."""
    local = [str(Path(r.source).parent) for r in table if r.source and "://" not in r.source]
    root = Path(os.path.commonpath(local)) if local else None
    if root is not None and len({Path(r.source).parent for r in table if r.source and "://" not in r.source}) == 1:
        root = root.parent.parent if root.name == "records" else root.parent  # keep the run id in the name
    out = {}
    for r in table:
        if root is not None and r.source and "://" not in r.source:
            out[id(r)] = str(Path(r.source).relative_to(root))
        else:
            out[id(r)] = r.source or "?"
    return out


def _runs_rows(table: Table) -> list[list[str]]:
    rows, names = [], _names(table)
    for r in table:
        c = r.coords
        rows.append([names[id(r)], r.fabric, r.workload, NA if r.model is None else str(r.model),
                     NA if r.parallel is None else str(r.parallel),
                     f"{c['global_batch']:g}" if "global_batch" in c else NA, f"{c['world_size']:g}" if "world_size" in c else NA,
                     r.status, _transport(r)])
    return rows


def _p(v: float) -> str:
    return "n/a" if v != v else f"{v:.3g}"


def _verdict_rows(result: Result) -> list[list[str]]:
    # speed-up, not the raw median ratio: the same convention as the verdict text
    # (>1: the fabric is faster/better; lower-is-better metrics are inverted).
    return [[p.label, c.metric, f"{c.median_base:.4g}", f"{c.median:.4g}", f"{c.speedup:.3f} [{c.speedup_lo:.3f}, {c.speedup_hi:.3f}]",
             _p(c.p), _p(c.p_adj), c.verdict] for p, c in result.comparisons]


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


CAPACITY_NOTE = ("Capacity is request_throughput (req/s) at the SLO crossing, interpolated linearly between the last "
                 "passing and the first failing load level, per GPU (server.tp). The sweep only brackets it between those "
                 "levels' throughputs; a GPU percentage is given only when two fabrics' brackets do not overlap "
                 "(see analysis/capacity.py).")
METHOD_NOTE = ("Trials are records (one run each). Study records are paired within their blocks (the within-block "
               "log-ratio, exact sign-flip test over blocks; the ratio is the geometric mean of the block ratios); "
               "records without a recorded design get the exact Mann-Whitney rank test on medians. Intervals are 95% "
               "bootstrap; p is corrected over every verdict of a study (the A/A control's tests separately); a winner "
               "is named only when the corrected p < alpha and the interval excludes 1 (see analysis/stats.py).")
RUN_HEAD = ["record", "fabric", "workload", "model", "parallel", "global batch", "GPUs", "status", "transport (verified)"]
VERDICT_HEAD = ["point", "metric", "baseline median", "fabric median",
                "speed-up vs baseline [95% CI] (>1: fabric faster/better)", "p", "corrected p", "verdict"]


def write_report(table: Table, result: Result, out_dir: str | Path, slo_ms: float | None = None,
                 slo_metric: str = "p90_ttft_ms", title: str = "fabricbench comparison") -> Report:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made = plots.make_all(table, out / "plots")
    images = [p for paths in made.values() for p in paths if p.suffix == ".png"]
    skipped = [name for name, paths in made.items() if not paths]
    names = _names(table)
    warnings = [f"{r.fabric}: {names[id(r)]}: transport did not match the label ({_transport(r)}): "
                f"{(r.transport or {}).get('message') or ''}".rstrip(": ") for r in table if r.transport_mismatch]
    failed = [f"{names[id(r)]}: status {r.status}" for r in result.excluded]
    control = result.control_lines()
    verdicts = [f"{p.label}: {c.verdict}" for p, c in result.comparisons]
    refusals = [f.message() for f in result.refusals]
    unmatched = result.unmatched_summary()
    unmatched_md = [f"{unmatched.split(';')[0]} (not compared):", "", *[f"- {u}" for u in result.unmatched_lines()]] if unmatched else []
    cap_lines: list[str] = []
    if slo_ms is not None:
        caps = capacity.capacities(table, slo_ms, slo_metric, result.allow)
        pct = slo_metric.split("_")[0]
        cap_lines = [c.describe(slo_ms, pct) for c in caps] + capacity.gpu_verdicts(caps, result.baseline, slo_ms, slo_metric)

    md = [f"# {title}", ""]
    if control:  # before anything else: whether any verdict below can be trusted
        md += [*[f"**{c}**" for c in control], ""]
    md += [f"{len(table)} records, arms: {', '.join(table.fabrics)}; baseline: {result.baseline}.", METHOD_NOTE, ""]
    if warnings:
        md += ["## Warnings", "", *[f"- **transport mismatch**: {w}" for w in warnings], ""]
    if failed:
        md += ["## Failed runs (not analysed)", "", *[f"- {f}" for f in failed], ""]
    md += ["## Verdicts", "", _md_table(VERDICT_HEAD, _verdict_rows(result)) if result.comparisons else "No comparable points.", ""]
    if refusals:
        md += ["## Refused comparisons", "", *[f"- {r}" for r in refusals], ""]
    if unmatched_md:  # last but one: a list of what was not run is not a finding
        tail_md = ["## Points without a counterpart", "", *unmatched_md, ""]
    else:
        tail_md = []
    if cap_lines:
        md += [f"## Capacity at TTFT {slo_metric.split('_')[0]} <= {slo_ms:g} ms", "", CAPACITY_NOTE, "",
               *[f"- {c}" for c in cap_lines], ""]
    md += ["## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in images]
    if skipped:
        md += ["", f"Not drawn (no records of that kind): {', '.join(skipped)}."]
    md += ["", *tail_md, "## Runs", "", _md_table(RUN_HEAD, _runs_rows(table)), ""]
    md_path = out / "report.md"
    md_path.write_text("\n".join(md))

    def img(p: Path) -> str:
        b64 = base64.b64encode(p.read_bytes()).decode()
        return f'<figure><img alt="{p.stem}" src="data:image/png;base64,{b64}"><figcaption>{p.stem}</figcaption></figure>'

    li = lambda items, cls="": "<ul>" + "".join(f'<li class="{cls}">{html.escape(i)}</li>' for i in items) + "</ul>"  # noqa: E731
    h = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
         "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
         "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}.warn{color:#b00;font-weight:bold}"
         "img{max-width:640px}</style></head><body>", f"<h1>{html.escape(title)}</h1>",
         *[f"<p class='warn'>{html.escape(c)}</p>" if "NOT quiet" in c else f"<p><b>{html.escape(c)}</b></p>" for c in control],
         f"<p>{len(table)} records, arms: {html.escape(', '.join(table.fabrics))}; baseline: {html.escape(str(result.baseline))}.</p>",
         f"<p>{html.escape(METHOD_NOTE)}</p>"]
    if warnings:
        h += ["<h2>Warnings</h2>", li([f"transport mismatch: {w}" for w in warnings], "warn")]
    if failed:
        h += ["<h2>Failed runs (not analysed)</h2>", li(failed)]
    h += ["<h2>Verdicts</h2>", _html_table(VERDICT_HEAD, _verdict_rows(result)) if result.comparisons else "<p>No comparable points.</p>"]
    if refusals:
        h += ["<h2>Refused comparisons</h2>", li(refusals)]
    if cap_lines:
        h += ["<h2>Capacity at the SLO</h2>", f"<p>{html.escape(CAPACITY_NOTE)}</p>", li(cap_lines)]
    h += ["<h2>Plots</h2>", *[img(p) for p in images]]
    if unmatched:
        h += ["<h2>Points without a counterpart</h2>", f"<p>{html.escape(unmatched.split(';')[0])} (not compared):</p>",
              li(result.unmatched_lines())]
    h += ["<h2>Runs</h2>", _html_table(RUN_HEAD, _runs_rows(table)), "</body></html>"]
    html_path = out / "report.html"
    html_path.write_text("\n".join(h))
    json_path = out / "report.json"
    json_path.write_text(export.to_json(result))
    return Report(md_path, html_path, images, verdicts, json_path)
