"""Calibrate and project: a latency-bandwidth model of a fabric's collectives, projected to other scales.

    fabricbench model fit results/ --out cal.json             # from collectives records at 2+ scales
    fabricbench model project cal.json --ranks 64,512          # time and busbw per size, 90% PIs
    fabricbench model project a.json b.json --ranks 512        # a projected comparison: verdict words
    fabricbench model check cal.json results-8/                # measured cells inside their PIs?
    fabricbench model export cal.json --ranks 512 --out sim/   # ASTRA-sim, Calculon and Vidur inputs

The model, its intervals and their checked coverage: docs/projection.md.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from workloads.core.errors import UsageError


def add_arguments(ap) -> None:
    sub = ap.add_subparsers(dest="action", metavar="action", required=True)
    f = sub.add_parser("fit", help="fit a calibration from collectives records at two or more scales")
    f.add_argument("dirs", nargs="+", help="results folders (records are found below them)")
    f.add_argument("--fabric", help="the fabric to fit when the records hold several")
    f.add_argument("--ops", help="comma-separated collectives to fit (default: every one measured)")
    f.add_argument("--out", help="where to write the calibration JSON [<first dir>/calibration-<fabric>.json]")
    f.add_argument("--bootstrap", type=int, default=400, help="block resamples for the parameter intervals [400]")
    f.add_argument("--nccl-log", help="an NCCL log (or its folder) holding NCCL's tuning table (NCCL_DEBUG_SUBSYS=TUNING): "
                   "its own latency and bandwidth are printed and saved beside the fit, as a check")
    p = sub.add_parser("project", help="project a calibration (or compare two) to other scales")
    p.add_argument("calibrations", nargs="+", help="one calibration, or two for a projected comparison")
    p.add_argument("--ranks", help="scales, e.g. 64,512 (an NCCL calibration of two levels: --nodes instead)")
    p.add_argument("--nodes", help="an NCCL calibration's scales as node counts, e.g. 8,64")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node with --nodes [the one the records measured]")
    p.add_argument("--sizes", help="message sizes, e.g. 64K,16M [the calibration's sizes]")
    p.add_argument("--ops", help="comma-separated collectives [every one calibrated]")
    p.add_argument("--json", dest="json_out", help="also write the projections here as JSON")
    p.add_argument("--training", metavar="RECORD", help="also project this training record's step time (its fabric's "
                   "calibration; its collectives trace and comm share)")
    e = sub.add_parser("export", help="the calibration as ASTRA-sim, Calculon and Vidur inputs")
    e.add_argument("calibration")
    e.add_argument("--ranks", help="the simulated network's ranks, e.g. 512 (an NCCL calibration: --nodes instead)")
    e.add_argument("--nodes", help="an NCCL calibration's simulated nodes, e.g. 64")
    e.add_argument("--gpus-per-node", type=int, help="GPUs per node with --nodes [the one the records measured]")
    e.add_argument("--out", required=True, help="folder for astra-sim-network.yml, calculon-network.json, "
                   "vidur-all_reduce.csv")
    e.add_argument("--bytes", help="the job's typical collective size, e.g. 25M: ASTRA-sim and Calculon get the "
                   "calibrated model's line through it [the ring form's line]")
    c = sub.add_parser("check", help="the calibration's projections against records it was not fitted on")
    c.add_argument("calibration")
    c.add_argument("dirs", nargs="+", help="results folders of the same fabric and code")


def _records(dirs: list[str]):
    from workloads.core.records import iter_records

    for d in dirs:
        if not Path(d).is_dir():
            raise UsageError(f"{d} is not a folder; give the results folder(s) of collectives runs")
    return [(p, r) for d in dirs for p, r in iter_records(d, "**/records/*.json")]


def _record(path: str) -> dict:
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"--training {path}: cannot read a record ({e.__class__.__name__})") from None
    if not isinstance(rec, dict):
        raise UsageError(f"--training {path}: not a record")
    return rec


def _sizes(text: str | None) -> list[int] | None:
    if not text:
        return None
    from workloads.collectives.settings import parse_size

    return [parse_size(s.strip(), "--sizes") for s in text.split(",") if s.strip()]


def run(args) -> int:
    from analysis import projection as pj

    return {"fit": _fit, "project": _project, "export": _export}.get(args.action, _check)(args, pj)


def _fit(args, pj) -> int:
    """`model fit`: a calibration from collectives records (and NCCL's own model from its log)."""
    from analysis.projection import hierarchy

    if args.bootstrap < 50:
        raise UsageError(f"--bootstrap {args.bootstrap}: use 50 or more resamples (400 by default)")
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else None
    unknown = sorted(set(ops or ()) - set(pj.ALGORITHMS))
    if unknown:
        raise UsageError(f"--ops {', '.join(unknown)}: the model knows {', '.join(pj.ALGORITHMS)}")
    table = None
    if args.nccl_log:  # read first: a log without a table is refused before the fit's work
        from analysis import nccl_model

        table = nccl_model.read(args.nccl_log)
    records = _records(args.dirs)
    cal = pj.fit(records, args.fabric, ops, args.bootstrap)
    chosen = [r for _, r in pj.select(records, args.fabric)]
    if hierarchy.is_nccl(chosen):
        # an NCCL fabric is priced as NCCL prices it, per level; the ring terms stay for Gloo-style checks
        cal["nccl"] = hierarchy.fit(chosen, **hierarchy.shape_of(table))
    if table is not None:
        if "nccl" in cal:
            run = nccl_model.written_by_fitted_run(table, cal["records"])
            if run:
                raise UsageError(f"--nccl-log {table['file']}: written by the fitted run {run}, whose per-call TUNING lines "
                                 "were inside its timed loop; take the table from a separate short run (see docs/projection.md)")
            cal["nccl_model"] = nccl_model.check_nccl(cal, table)
        else:
            cal["nccl_model"] = nccl_model.check(cal, table)
    out = Path(args.out or Path(args.dirs[0]) / f"calibration-{cal['fabric'].split(' (')[0]}.json")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(cal, indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write the calibration there ({e.strerror or e.__class__.__name__}); "
                         "give a path you can write, e.g. --out cal.json") from None
    for line in pj.fit_lines(cal):
        print(line)
    if "nccl" in cal:
        for line in hierarchy.fit_lines(cal):
            print(line)
    if table is not None:
        lines = nccl_model.check_nccl_lines if "nccl" in cal else nccl_model.check_lines
        for line in lines(cal["nccl_model"]):
            print(line)
    print(f"calibration: {out}")
    return 0


def _project(args, pj) -> int:
    """`model project`: collectives (and training steps) at other scales, one calibration or two compared."""
    if len(args.calibrations) > 2:
        raise UsageError("give one calibration to project, or two to compare")
    cals = [pj.load(c) for c in args.calibrations]
    names = _names(cals)
    if any("nccl" in c for c in cals):
        return _project_nccl(args, cals, names)
    if not args.ranks:
        raise UsageError("give --ranks, e.g. --ranks 64,512 (--nodes is for a calibration of NCCL records)")
    ranks = pj.parse_ranks(args.ranks)
    sizes = _sizes(args.sizes)
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else sorted(set.intersection(*(set(c["ops"]) for c in cals)))
    if not ops:
        raise UsageError("these calibrations have no collective in common")
    rows = []
    for op in ops if not args.training or args.sizes else ():  # --training alone: the steps only
        for p in ranks:
            for s in sizes or cals[0]["ops"].get(op, {}).get("sizes", []):
                prs = [replace(pj.project(c, op, p, s), fabric=n) for c, n in zip(cals, names)]
                for pr in prs:
                    print(pj.projection_line(pr))
                if len(prs) == 2:
                    print("  " + pj.compare(*prs))
                rows += [pr.__dict__ | {"busbw_GBps": pr.busbw_GBps} for pr in prs]
    if args.training:
        rec = _record(args.training)
        for p in ranks:
            sp = pj.project_step(cals[0], rec, p)
            print(pj.step_line(sp))
            rows.append(sp.__dict__ | {"kind": "training_step"})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _names(cals: list[dict]) -> list[str]:
    """One short label per fabric on every line (its profile's name; A and B when the two share
    it), the long description printed once here."""
    short = [c["fabric"].split(" (")[0] for c in cals]
    if len(set(short)) < len(short):
        short = ["A", "B"][:len(cals)]
    for n, c in zip(short, cals):
        if n != c["fabric"]:
            print(f"{n} = {c['fabric']}")
    return short


def _project_nccl(args, cals: list[dict], names: list[str]) -> int:
    """`model project` on NCCL calibrations: NCCL's cost model through the fitted levels, per
    nodes x GPUs per node, each line naming the algorithm and protocol NCCL would pick."""
    from analysis.projection import hierarchy as hi
    from analysis.projection import parse_ranks

    if not all("nccl" in c for c in cals):
        raise UsageError("compare an NCCL calibration with another NCCL one (the other was fitted on Gloo records)")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: give 1 or more")
    if not args.nodes and not args.ranks:
        raise UsageError("give --nodes N --gpus-per-node G (or --ranks for a one-level calibration)")
    ranks = parse_ranks(args.ranks) if args.ranks and not args.nodes else None
    lays = [hi.layouts(c["nccl"], args.nodes, args.gpus_per_node, ranks) for c in cals]
    sizes = _sizes(args.sizes) or sorted(cals[0]["ops"].get("all_reduce", {}).get("sizes", [])) or [1 << 20]
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else [
        o for o in hi.NCCL_OPS + ("alltoall",) if all(o in c["ops"] and (o != "alltoall" or c["nccl"]["alltoall"]) for c in cals)]
    rec = _record(args.training) if args.training else None
    rows = []
    for op in ops if not rec or args.sizes else ():  # --training alone: the steps only
        for n, g in lays[0]:
            for s in sizes:
                prs = [hi.projection(c, op, s, n, g) for c in cals]
                for pr, name in zip(prs, names):
                    print(hi.projection_line(pr, name))
                if len(prs) == 2:
                    print(hi.compare_line(*prs, tuple(names)))
                rows += prs
    for n, g in lays[0] if rec else ():
        sp = hi.project_step(cals[0], rec, n, g)
        print(hi.step_line(sp))
        rows.append(sp | {"kind": "training_step"})
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _export(args, pj) -> int:
    """`model export`: the calibration as ASTRA-sim, Calculon and Vidur inputs for one network size."""
    from analysis import simexport

    cal = pj.load(args.calibration)
    if "nccl" in cal:
        return _export_nccl(args, cal)
    if not args.ranks:
        raise UsageError("give --ranks, e.g. --ranks 512 (--nodes is for a calibration of NCCL records)")
    (n,) = pj.parse_ranks(args.ranks) if "," not in args.ranks else (None,)
    if n is None:
        raise UsageError(f"--ranks {args.ranks}: export one network size, e.g. --ranks 512")
    message = _bytes(args.bytes)
    files = {"astra-sim-network.yml": simexport.astra_sim(cal, n, message),
             "calculon-network.json": json.dumps(simexport.calculon(cal, n, message), indent=1) + "\n",
             "vidur-all_reduce.csv": simexport.vidur(cal, sorted({2, 4, 8, n}), [1 << k for k in range(10, 29)])}
    _write(Path(args.out), files)
    cross = simexport.crossover(cal, n)
    if cross:
        size, err = cross
        print(f"note: Gloo's all_reduce at {n} ranks follows two lines, crossing at {size / 1e6:.3g} MB (where a "
              "segment's bytes take a round trip); ASTRA-sim and Calculon hold one: "
              + (f"the line through {args.bytes} (exact near it, below Gloo's time far from it)" if message else
                 f"the ring form's, {100 * err:+.0f}% at the crossing and closer away from it; --bytes S gives "
                 "the line through S instead"))
    if n > pj.MODEL_ONLY * max(cal["ops"]["all_reduce"]["scales"]):
        print(f"note: {n} ranks is beyond {pj.MODEL_ONLY}x the largest measured scale: these inputs are model-only")
    return 0


def _export_nccl(args, cal: dict) -> int:
    """`model export` of an NCCL calibration: two levels, ASTRA-sim's NVLink dimension and the
    nodes', Calculon's network per level, Vidur's tensor-parallel rows from the intra level."""
    from analysis import simexport
    from analysis.projection import hierarchy as hi
    from analysis.projection import parse_ranks

    if not args.nodes and not args.ranks:
        raise UsageError("give --nodes N --gpus-per-node G (or --ranks for a one-level calibration)")
    if args.nodes and "," in args.nodes or args.ranks and "," in args.ranks:
        raise UsageError("export one network size, e.g. --nodes 64")
    lay = hi.layouts(cal["nccl"], args.nodes, args.gpus_per_node, parse_ranks(args.ranks) if args.ranks and not args.nodes else None)
    (nodes, gpn), = lay
    if not cal["nccl"]["levels"]["intra"]["measured_at"] or not cal["nccl"]["levels"]["inter"]["measured_at"]:
        raise UsageError("the export needs both levels: fit with records from one node and from 2 or more nodes")
    message = _bytes(args.bytes)
    degrees = sorted({d for d in (2, 4, 8, gpn) if d <= gpn})
    files = {"astra-sim-network.yml": simexport.astra_sim_nccl(cal, nodes, gpn),
             "calculon-network.json": json.dumps(simexport.calculon_nccl(cal, nodes, gpn, message), indent=1) + "\n",
             "vidur-all_reduce.csv": simexport.vidur_nccl(cal, degrees, [1 << k for k in range(10, 29)])}
    _write(Path(args.out), files)
    return 0


def _bytes(text: str | None) -> int | None:
    """--bytes as a size, refused before anything is written."""
    if not text:
        return None
    from workloads.collectives.settings import parse_size

    message = parse_size(text.strip(), "--bytes")
    if message <= 0:
        raise UsageError(f"--bytes {text}: give the job's typical collective size, e.g. --bytes 25M")
    return message


def _write(out: Path, files: dict[str, str]) -> None:
    """The export's files into `out` (made if missing), each path printed; a folder that cannot be
    made or written is one line naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (out / name).write_text(text)
            print(f"{out / name}")
    except OSError as e:
        raise UsageError(f"--out {out}: cannot write there ({e.strerror or e.__class__.__name__}); give a folder you "
                         "can write, e.g. --out sim/") from None


def _check(args, pj) -> int:
    """`model check`: a calibration's projections against records it was not fitted on."""
    cal = pj.load(args.calibration)
    records = _records(args.dirs)
    rows = pj.check_against(cal, records)
    for path, why in pj.left_out(cal, records):
        print(f"left out: {path} ({why})")
    if "nccl" in cal:
        from analysis.projection import hierarchy

        for r in rows:
            print(hierarchy.check_line(r))
        print(hierarchy.check_summary(rows))
        return 0
    for r in rows:
        print(f"{r['op']} {r['size']} B at {r['p']} ranks: measured {r['measured_s'] * 1e3:.3f} ms, projected "
              f"{r['predicted_s'] * 1e3:.3f} ms [{r['low_s'] * 1e3:.3f}, {r['high_s'] * 1e3:.3f}] "
              f"({r['label']}): {'inside' if r['inside'] else 'OUTSIDE'}, error {100 * r['abs_error']:.1f}%")
    print(pj.check_summary(rows))
    return 0
