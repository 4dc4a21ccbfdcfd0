"""Write a fabric certificate: the IETF BMWG AI-fabric KPIs per fabric, each with its interval, reference and verdict.

    fabricbench certify results/emu-cert --out cert/
    fabricbench certify results/ --fabric healthy --fabric degraded --reference busbw>=85 --out cert/

`fabricbench certify DIR... [--fabric ARM]... [--kpi KEY]... [--reference KEY>=V|KEY<=V]... --out DIR`

Per fabric (a study's arm, else the fabric profile): certificate-<arm>.md, .html and .json; with
two fabrics or more, side-by-side-<arm>-vs-<first>.md/.html/.json: each KPI's verdict per fabric
and the difference from the blocks. KPIs: docs/metrics.md#fabric-certificate.
"""

from __future__ import annotations

import argparse
import re

from workloads.core.errors import UsageError

_REF = re.compile(r"^(?P<key>[a-z0-9.\-]+)(?P<op>>=|<=)(?P<v>[0-9.eE+\-]+)$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", help="folders of result records (a study's folder, a run set)")
    parser.add_argument("--fabric", action="append", default=[], metavar="ARM",
                        help="the fabric (study arm) to certify; repeat for side by side, the first is the baseline "
                             "(default: every arm, the study's baseline first)")
    parser.add_argument("--kpi", action="append", default=[], metavar="KEY",
                        help="only these KPIs (repeatable); each must be measurable from the records")
    parser.add_argument("--reference", action="append", default=[], metavar="KEY>=V",
                        help="your own limit for a KPI, replacing the draft's, e.g. busbw>=85 or mmr-uplinks<=1.2")
    parser.add_argument("--out", default="certificate", help="output directory (default: certificate)")


def _refs(items: list[str]):
    from analysis.certificate import KPIS, Ref

    out = {}
    for item in items:
        m = _REF.match(item.replace(" ", ""))
        if not m or m["key"] not in KPIS:
            raise UsageError(f"--reference {item!r}: write KEY>=VALUE or KEY<=VALUE with KEY one of "
                             f"{', '.join(KPIS)}, e.g. busbw>=85")
        try:
            v = float(m["v"])
        except ValueError:
            raise UsageError(f"--reference {item!r}: {m['v']!r} is not a number") from None
        out[m["key"]] = Ref(m["op"], v, "user")
    return out


def run(args) -> int:
    from pathlib import Path

    from analysis import certificate as cert
    from analysis.load import load_table
    from analysis.report import to_html, to_markdown
    from workloads.commands.report import _check_out, _unmake

    unknown = [k for k in args.kpi if k not in cert.KPIS]
    if unknown:
        raise UsageError(f"--kpi {unknown[0]}: not a KPI; choose from {', '.join(cert.KPIS)}")
    refs = _refs(args.reference)
    table = load_table(args.dirs)
    if not table.ok():
        raise UsageError(f"no ok record under {' '.join(args.dirs)}; give the folder a study or run wrote")
    arms = args.fabric or _arms(table)
    missing = [a for a in arms if a not in table.ok().arms]
    if missing:
        raise UsageError(f"--fabric {missing[0]}: no ok record of it here; the fabrics (arms) here: {', '.join(table.ok().arms)}")
    certs = [cert.build(table, a, args.kpi or None, refs) for a in arms]
    for k in args.kpi:  # asked for by name: the records must support it for every fabric
        for c in certs:
            row = next(r for r in c.rows if r.kpi == k)
            if not row.values:
                raise UsageError(f"--kpi {k}: the records of {c.arm} cannot support it: {row.note}")
    made = _check_out(args.out)
    try:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for c in certs:
            written += _write(out, f"certificate-{_slug(c.arm)}", f"Fabric certificate: {c.arm}", cert.sections(c),
                              cert.to_json(c), to_markdown, to_html)
            judged = [r for r in c.rows if r.values and r.verdict in (cert.PASS, cert.FAIL, cert.UNSURE)]
            print(f"{c.arm}: " + ", ".join(f"{sum(r.verdict == v for r in judged)} {v}" for v in (cert.PASS, cert.FAIL, cert.UNSURE))
                  + "; " + "; ".join(f"{r.name} at {r.point} {r.value_text()} {r.verdict}" for r in judged
                                     if r.kpi == "jct-ratio" or r.point.endswith(_largest(c))))
        for b in certs[1:]:
            diffs = cert.side_by_side(certs[0], b)
            written += _write(out, f"side-by-side-{_slug(b.arm)}-vs-{_slug(certs[0].arm)}",
                              f"Fabric certificates side by side: {b.arm} against {certs[0].arm}",
                              cert.pair_sections(certs[0], b, diffs), cert.pair_json(certs[0], b, diffs),
                              to_markdown, to_html)
            print(f"{b.arm} vs {certs[0].arm}: {sum(cert.called(d) for d in diffs)} of {len(diffs)} KPI rows differ")
    except BaseException:
        _unmake(made)
        raise
    for p in written:
        print(f"certificate: {p}")
    return 0


def _largest(c) -> str:
    """The largest collectives size the certificate has ("1 MiB"): the one row printed per op."""
    from analysis.certificate import _point_order

    sizes = sorted({r.point for r in c.rows if r.kpi == "busbw"}, key=_point_order)
    return sizes[-1].partition(" ")[2] if sizes else "\0"


def _arms(table) -> list[str]:
    arms = table.ok().arms
    base = next((r.study.get("baseline") for r in table.ok() if r.study and r.study.get("baseline") in arms), None)
    return ([base] if base else []) + [a for a in arms if a != base]


def _slug(arm: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", arm).strip("-") or "arm"


def _write(out, stem, title, secs, doc, to_markdown, to_html) -> list:
    md, html, js = (out / f"{stem}.{ext}" for ext in ("md", "html", "json"))
    md.write_text(to_markdown(title, secs, out))
    html.write_text(to_html(title, secs))
    js.write_text(doc)
    return [md, html, js]
