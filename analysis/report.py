"""Markdown and self-contained HTML reports from ONE list of sections.

The first screen is for a manager: a headline sentence per workload (the difference as a
percentage with its interval, the design and correction, the A/A control's outcome), then
the verdict table; charts, capacity, runs and the refused pairs follow. `sections()` builds
the content once; `to_markdown` and `to_html` only render it. The HTML embeds every PNG as
base64, so one file can be mailed or attached as is.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from analysis import capacity, clock, export, external, looks, plots, results_csv, summary, topology
from analysis.compare import Result
from analysis.load import Table, records_root
from analysis.projection import report as projection_report


@dataclass
class Report:
    markdown: Path
    html: Path
    images: list[Path]
    verdicts: list[str]
    json: Path | None = None      # report.json: every verdict, the rows of `compare --json`
    csv: Path | None = None       # results.csv: every record's metrics, one row per record


# A block is a tuple: ("p", text) | ("head", claim, detail) | ("warn", text) | ("list", [text]) |
# ("table", head, rows) | ("figure", path, caption) | ("details", summary, [block]).
@dataclass
class Section:
    title: str
    blocks: list[tuple] = field(default_factory=list)


def _transport(r) -> str:
    t = r.transport
    if not t:
        return "not verified"
    net = (t.get("summary") or {}).get("network") if isinstance(t.get("summary"), dict) else None
    return f"{r.transport_verdict or '?'}" + (f" ({net})" if net else "")


NA = "—"  # a column that does not apply to the workload (collectives have no model or batch)


def _names(table: Table) -> dict[int, str]:
    root = records_root(table)
    return {id(r): str(Path(r.source).relative_to(root)) if root is not None and r.source and "://" not in r.source
            else r.source or "?" for r in table}


RUN_HEAD = ["record", "arm", "workload", "model", "parallel", "global batch", "GPUs", "status", "transport (verified)"]


def _runs_rows(table: Table) -> list[list[str]]:
    rows, names = [], _names(table)
    for r in table:
        c = r.coords
        rows.append([names[id(r)], r.arm, r.workload, NA if r.model is None else str(r.model),
                     NA if r.parallel is None else str(r.parallel),
                     f"{c['global_batch']:g}" if "global_batch" in c else NA, f"{c['world_size']:g}" if "world_size" in c else NA,
                     r.status, _transport(r)])
    return rows


CAPACITY_NOTE = ("Capacity is request_throughput (req/s) at the SLO crossing, interpolated linearly between the last "
                 "passing and the first failing load level, per GPU (server.tp). The sweep only brackets it between those "
                 "levels' throughputs; a GPU percentage is given only when two fabrics' brackets do not overlap "
                 "(see analysis/capacity.py).")
METHOD_NOTE = ("Trials are records (one run each). Each workload is judged on its primary metric at its declared "
               "point (training samples/s per micro-batch, collectives bus bandwidth at the largest size, inference "
               "requests/s at the heaviest load unless a study names its point); the primary verdicts of a study are "
               "one family, corrected together (Holm unless --correction says otherwise); every other metric is "
               "exploratory (Benjamini-Hochberg within its own family). Study records are paired within their blocks: "
               "a paired t-test on the within-block log-ratios with its t-interval (the exact sign-flip p is printed "
               "beside as a check); records without a recorded design get the exact Mann-Whitney test with the "
               "Hodges-Lehmann shift and the interval that inverts that test. Each interval is at the level its test "
               "was judged at after the correction (the CI level column), so a verdict and its interval never "
               "disagree. A difference is called when the interval excludes 0; 'equivalent' when it lies inside the "
               "equivalence margin; otherwise 'inconclusive', with the smallest difference the test could detect at "
               "80% power (see docs/statistics.md and analysis/stats.py).")


def _top(table: Table, result: Result) -> list[Section]:
    """The first screen: headlines, then the verdict table."""
    heads = summary.headlines(result)
    top = Section("Headline", [("head", f"{wl} — {claim}", detail) for wl, claim, detail in heads] or
                  [("p", "No two arms share a comparable point: nothing is compared (see the refused pairs below).")])
    # a control that called a difference, or that cannot speak, is said before any verdict
    status = result.control_status()
    top.blocks += [("warn", line) for (kind, _, _), line in zip(status, result.control_lines(status))
                   if kind in ("loud", "mute", "untested")]
    top.blocks += [("p", f"{len(table)} records; arms: {', '.join(table.arms)}; baseline: {result.baseline}. "
                         f"Raw values are medians over trials in the metric's units.")]
    table_rows = summary.verdict_rows(result)
    verdicts = Section("Verdicts", [("table", summary.VERDICT_HEAD, table_rows)] if table_rows else
                       [("p", "No comparable points.")])
    return [top, verdicts]


def _details(table: Table, result: Result) -> list[Section]:
    names = _names(table)
    out = []
    warnings = [f"transport mismatch: {r.arm}: {names[id(r)]}: transport did not match the label ({_transport(r)}) "
                f"{(r.transport or {}).get('message') or ''}".rstrip() for r in table if r.transport_mismatch]
    failed = [f"{names[id(r)]}: status {r.status}" for r in result.excluded]
    if warnings:
        out.append(Section("Warnings", [("list", warnings)]))
    if failed:
        out.append(Section("Failed runs (not analysed)", [("list", failed)]))
    words = [f"{p.label} [{c.metric}]: {c.verdict}" for p, c in result.comparisons]
    notes = result.control_lines() + result.notes()
    out.append(Section("Method", [("p", METHOD_NOTE), *([("list", notes)] if notes else []),
                                  *([("details", f"Every verdict in words ({len(words)})", [("list", words)])] if words else [])]))
    return out


def _capacity(table: Table, result: Result, slo_ms: float | None, slo_metric: str) -> list[Section]:
    if slo_ms is None:
        return []
    caps = capacity.capacities(table, slo_ms, slo_metric, result.allow)
    lines = [c.describe(slo_ms, slo_metric.split("_")[0]) for c in caps] + \
        capacity.gpu_verdicts(caps, result.baseline, slo_ms, slo_metric)
    return [Section(f"Capacity at TTFT {slo_metric.split('_')[0]} <= {slo_ms:g} ms", [("p", CAPACITY_NOTE), ("list", lines)])]


def _latency(result: Result) -> list[Section]:
    """Arms that differ in the emulated delay: what each workload's added time is made of (analysis/latency.py)."""
    from analysis import latency

    lines = latency.of_result(result)
    return [Section("Latency arithmetic", [("list", [x.strip() for x in lines])])] if lines else []


def _raw_link(table: Table) -> list[Section]:
    rows = topology.against_raw_link(table)
    if not rows:
        return []
    return [Section("Against the raw link", [("p", "Bus bandwidth as a share of what the same arm's link workload (iperf3) "
                                                   "measured on the wire: what the framework keeps of the path."),
                                             ("table", topology.RAW_HEAD, rows)])]


def _jobs(root: Path | None, baseline: str | None) -> list[Section]:
    """Concurrent jobs on one emulated fabric (emulate --jobs): each job's JCT and metric, Jain's
    fairness over the jobs, and JCT verdicts across fabrics, from the emulator's summaries."""
    found = topology.jobs_summaries(root)
    if not found:
        return []
    verdicts = topology.jct_verdicts(found, baseline)
    return [Section("Concurrent jobs", [("p", "JCT: seconds from a job's start to its last agent's exit; Jain's index "
                                              "over the jobs' primary metrics (1: the fabric shared evenly)."),
                                        *([("list", verdicts)] if verdicts else []),
                                        ("table", topology.JOBS_HEAD, topology.jobs_rows(found, root))])]


def _clock(table: Table, result: Result) -> list[Section]:
    """How long the verdicts took: the runs' measured windows against their launch-to-record time,
    and the run time per decided primary verdict (the real arms', else the A/A control's)."""
    primaries = [c for _, c in result.comparisons if c.primary and not c.control] or \
        [c for _, c in result.comparisons if c.primary]
    got = clock.clock((r.record for r in table), sum(looks.stops(c) for c in primaries), len(primaries))
    if got is None:
        return []
    return [Section("Time to the verdict", [("p", "Measured: the points' timed windows (steps, iterations, requests); run "
                                                  "time: each run's launch to its last record, start-up included."),
                                            ("list", [got.line()])])]


def _tail(table: Table, result: Result, root: Path | None) -> list[Section]:
    """Last: what was not compared, and the runs; the refusals collapsed, counts first."""
    out = []
    if result.unmatched:
        out.append(Section("Points without a counterpart", [("details", result.unmatched_summary().split(";")[0] + " (not compared)",
                                                              [("list", result.unmatched_lines())])]))
    out.append(Section("Runs", [("details", f"{len(table)} records", [("table", RUN_HEAD, _runs_rows(table))])]))
    groups = summary.refusal_groups(result.refusals, root)
    if groups:
        n = len(result.refusals)
        blocks = [("details", s, [("list", pairs)]) for s, pairs in groups]
        out.append(Section("Refused comparisons", [("details", f"{n} refused pair{'s' if n != 1 else ''}, in "
                                                               f"{len(groups)} group{'s' if len(groups) != 1 else ''} "
                                                               f"by the keys that differ", blocks)]))
    return out


def sections(table: Table, result: Result, charts: list[tuple[Path, str]], slo_ms: float | None = None,
             slo_metric: str = "p90_ttft_ms") -> list[Section]:
    figs = Section("Charts", [("figure", p, cap) for p, cap in charts] or [("p", "No chart: the records hold nothing to draw.")])
    root = records_root(table)
    return [*_top(table, result), figs, *_latency(result), *_capacity(table, result, slo_ms, slo_metric), *_raw_link(table),
            *_jobs(root, result.baseline),
            *_details(table, result), *_clock(table, result), *_tail(table, result, root)]


def _md_block(b: tuple, out_dir: Path) -> str:
    kind = b[0]
    if kind == "table":
        esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
        head, rows = b[1], b[2]
        return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
                          *["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]])
    if kind == "list":
        return "\n".join(f"- {i}" for i in b[1])
    if kind == "figure":
        return f"![{b[2]}]({b[1].relative_to(out_dir).as_posix()})\n\n*{b[2]}*"
    if kind == "details":  # GitHub and most Markdown viewers render the HTML element
        inner = "\n\n".join(_md_block(x, out_dir) for x in b[2])
        return f"<details><summary>{html.escape(b[1])}</summary>\n\n{inner}\n\n</details>"
    if kind == "head":
        return f"**{b[1]}** {b[2]}"
    return f"**Warning: {b[1]}**" if kind == "warn" else b[1]


def to_markdown(title: str, secs: list[Section], out_dir: Path) -> str:
    parts = [f"# {title}"]
    for s in secs:
        parts += [f"## {s.title}", *(_md_block(b, out_dir) for b in s.blocks)]
    return "\n\n".join(parts) + "\n"


def _html_block(b: tuple) -> str:
    e, kind = html.escape, b[0]
    if kind == "table":
        th = "".join(f"<th>{e(h)}</th>" for h in b[1])
        body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in b[2])
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"
    if kind == "list":
        return "<ul>" + "".join(f"<li>{e(i)}</li>" for i in b[1]) + "</ul>"
    if kind == "figure":
        b64 = base64.b64encode(b[1].read_bytes()).decode()
        return f'<figure><img alt="{e(b[2])}" src="data:image/png;base64,{b64}"><figcaption>{e(b[2])}</figcaption></figure>'
    if kind == "details":
        return f"<details><summary>{e(b[1])}</summary>{''.join(_html_block(x) for x in b[2])}</details>"
    if kind == "head":
        return f"<p class='head'><b>{e(b[1])}</b> <span class='detail'>{e(b[2])}</span></p>"
    return f"<p class='warn'>{e(b[1])}</p>" if kind == "warn" else f"<p>{e(b[1])}</p>"


CSS = ("body{font-family:sans-serif;max-width:1200px;margin:1.5em auto;padding:0 1em;line-height:1.35}"
       "table{border-collapse:collapse;width:100%;table-layout:auto}"
       "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;overflow-wrap:break-word;vertical-align:top}"
       "th{background:#f0f0f0}.head{font-size:17px;margin:.6em 0}.detail{font-size:13px;color:#444}"
       ".warn{color:#b00;font-weight:bold}"
       "img{max-width:100%}figure{margin:1em 0}"
       "figcaption{font-size:13px;color:#333}summary{cursor:pointer;font-weight:bold}")


def to_html(title: str, secs: list[Section]) -> str:
    body = "".join(f"<section><h2>{html.escape(s.title)}</h2>{''.join(_html_block(b) for b in s.blocks)}</section>"
                   for s in secs)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"
            f"</head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n")


def _nccl_tests_exports(table: Table, out: Path) -> list[Path]:
    """Each collectives record in nccl-tests' -J shape: nccl-tests/<record>-<op>.json."""
    names, paths = _names(table), []
    for r in table.ok():
        for op, doc in external.nccl_tests_json(r.record).items() if r.workload == "collectives" else ():
            p = out / "nccl-tests" / (names[id(r)].replace("/records/", "-").replace("/", "-").removesuffix(".json") + f"-{op}.json")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(doc, indent=1) + "\n")
            paths.append(p)
    return paths


def write_report(table: Table, result: Result, out_dir: str | Path, slo_ms: float | None = None,
                 slo_metric: str = "p90_ttft_ms", title: str = "fabricbench comparison", external_runs=()) -> Report:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    charts = plots.make_all(table, out / "plots", result, slo_ms, slo_metric, external_runs)
    _nccl_tests_exports(table, out)
    secs = sections(table, result, charts, slo_ms, slo_metric)
    if proj := projection_report.blocks(records_root(table), out / "plots"):  # beside a `model fit` calibration
        secs.insert(2, Section("Projection to scale", proj))
    md_path, html_path, json_path, csv_path = (out / n for n in ("report.md", "report.html", "report.json", "results.csv"))
    md_path.write_text(to_markdown(title, secs, out))
    html_path.write_text(to_html(title, secs))
    json_path.write_text(export.to_json(result))
    csv_path.write_text(results_csv.to_csv(table, _names(table)))
    verdicts = [f"{p.label}: {c.verdict}" for p, c in result.comparisons]
    return Report(md_path, html_path, [p for p, _ in charts], verdicts, json_path, csv_path)
