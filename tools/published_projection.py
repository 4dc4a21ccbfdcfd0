"""The projection checked on published nccl-tests tables (tests/fixtures/published/<dataset>/):
per dataset, a calibration fitted on its two smallest scales, every larger scale projected and
checked against what was published there (docs/projection.md, "Checked on published tables").

    .venv/bin/python tools/published_projection.py                 # every dataset
    .venv/bin/python tools/published_projection.py aws-p3dn-efa    # one

Each fixture file is nccl-tests' table as published, with `# nodes:` and `# ranks:` lines and its
source. The model is the one on main when the dataset was added (the fixture's commit follows the
commit that froze the model form and interval rule). A published table is one run (one block) a
scale: the noise is the fit's own residuals there, said so by the calibration.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis import projection as pj  # noqa: E402
from workloads.collectives.nccltests import parse_table  # noqa: E402

DATASETS = REPO / "tests" / "fixtures" / "published"
_META = re.compile(r"^#\s*(nodes|ranks|source|system):\s*(.+)$")


def records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Each table of a dataset as a collectives record of one fabric (the dataset's name), its
    ranks the communicator's size."""
    out = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text()
        meta = {m.group(1): m.group(2).strip() for line in text.splitlines() if (m := _META.match(line))}
        ranks = int(meta["ranks"])
        rows = [r | {"group_size": ranks} for r in parse_table(text)["rows"]]
        out.append((path, {"workload": "collectives", "status": "ok", "run_id": path.stem, "record_id": path.stem,
                           "config": {"fabric": {"name": folder.name}}, "fabric": {"name": folder.name},
                           "world": {"world_size": ranks, "nodes": int(meta["nodes"])}, "rows": rows,
                           "fingerprint": {"git": {"commit": "published", "dirty_hash": None}},
                           "source": meta.get("source")}))
    return out


def evaluate(folder: Path, boot: int = pj.BOOTSTRAP) -> dict[str, Any]:
    """Fit on the two smallest scales, check the rest: per projected scale the cells inside the
    PI (and inside it widened by the model-form allowance), and the median |error|."""
    recs = records(folder)
    scales = sorted({r["world"]["world_size"] for _, r in recs})
    fit_on = [(p, r) for p, r in recs if r["world"]["world_size"] in scales[:2]]
    cal = pj.fit(fit_on, boot=boot)
    rows = pj.check_against(cal, [(p, r) for p, r in recs if r["world"]["world_size"] in scales[2:]])
    per = {}
    for p in scales[2:]:
        at = [r for r in rows if r["p"] == p]
        per[p] = {"cells": len(at), "inside": sum(r["inside"] for r in at),
                  "inside_with_form": sum(r["inside_with_form"] for r in at),
                  "median_abs_error": median(r["abs_error"] for r in at), "label": at[0]["label"]}
    return {"dataset": folder.name, "scales": scales, "fitted_on": scales[:2], "op": sorted(cal["ops"]),
            "model": "ring (alpha-beta, docs/projection.md)", "per_scale": per,
            "summary": pj.check_summary(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("datasets", nargs="*", help="dataset folder names [every one]")
    args = ap.parse_args(argv)
    for folder in [DATASETS / d for d in args.datasets] or sorted(p for p in DATASETS.iterdir() if p.is_dir()):
        e = evaluate(folder)
        print(f"{e['dataset']}: {', '.join(e['op'])}, fitted on {e['fitted_on']} ranks, model {e['model']}")
        for p, s in e["per_scale"].items():
            print(f"  {p} ranks ({s['label']}): {s['inside']}/{s['cells']} inside the 90% PI, "
                  f"{s['inside_with_form']}/{s['cells']} with the model-form allowance; median |error| "
                  f"{100 * s['median_abs_error']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
