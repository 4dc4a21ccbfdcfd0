"""Wall time to the same decided verdicts at equal power: a study as it ran before (ranks exec'd,
each workload's own window) against now (ranks forked, `window: auto`).

    python benchmarks/time_to_verdict.py benchmarks/studies/train-aa.yaml
    sudo .venv/bin/python benchmarks/time_to_verdict.py benchmarks/studies/emu-train-ab.yaml --rounds 2

Each way has its own output root and its own pilot study (--pilot-blocks blocks, not counted),
run the way it plans for, so that each plan sizes its blocks from its own mode's measured noise
and start-up cost: "before" (FB_RANK_START=exec, FB_STUDY_KEEP_FABRIC=0, window: fixed) and
"after" (fork, a kept topology per arm and block, window: auto). A shared root let the "after"
plan read the "before" runs' noise and overhead (exec'd ranks, 15-step windows: a CV twice its
own), so it bought far more power than the "before" one; the two were not at equal power. Each
round then runs the study both ways, in ABBA order over rounds, each planned from every run of its
own root before it. Both plans size their blocks for the same `detect` at 80% power. Prints per
study: runs, blocks, wall time, the duty cycle (measured / wall, from the study's clock line), how
many primary verdicts were decided, and the power it reached: the worst primary verdict's MDE
(what it calls with 80% power at its measured sd, analysis/stats.py). A plan sizes its blocks on
an estimate, and the two ways' estimates come out unequal (a 4-block pilot's upper limit is wide),
so a study can end over- or under-powered; the ratio that compares equal power prices each
study's blocks at the number its own measured sds needed for `detect` (the plan's rule,
blocks_for): its wall time per block x those blocks. Both ratios are printed, of the medians.

Run it on a quiet machine. A plan that cannot reach the power refuses ("no number of blocks up
to 200 can call a 10% difference"), as a study should; the benchmark prints the refusal.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def study(spec: dict, name: str, out: Path, mode: str, window: str) -> dict:
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": name, "window": window}, sort_keys=False))
    # "before" is the study as it ran before issue 48: ranks exec'd, a topology built per run
    env = dict(os.environ, FB_RANK_START=mode, FB_STUDY_KEEP_FABRIC="0" if mode == "exec" else "1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "study", str(path), "--output-root", str(out)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=7200)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        refused = re.search(r"error: (.*no number of blocks.*)", r.stdout + r.stderr)
        if refused:
            return {"refused": refused.group(1), "wall": wall}
        sys.exit(f"study {name} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}")
    plan = re.search(r"x (\d+) blocks = (\d+) runs", r.stdout)
    clock = re.search(r"duty cycle (\d+)%.*?(\d+|none) of (\d+) primary verdict", r.stdout)
    windows = re.findall(r"window: (\d+) measured (?:steps|iterations)", r.stdout)
    return {"wall": wall, "blocks": int(plan.group(1)), "runs": int(plan.group(2)),
            "duty": int(clock.group(1)) if clock else None, "reached": reached(out / name, spec),
            "decided": f"{clock.group(2).replace('none', '0')}/{clock.group(3)}" if clock else "?", "windows": windows}


def reached(folder: Path, spec: dict) -> tuple[float, int]:
    """The power a study reached, from its primary verdicts as compare reports them: the largest
    MDE (a fraction, each at its own level and measured sd), and the blocks the study would have
    needed to call its `detect` at 80% power at those sds (the plan's own rule, analysis.stats.blocks_for;
    the most over its primaries)."""
    from analysis.compare import compare_table
    from analysis.load import load_table
    from analysis.stats import blocks_for

    baseline = next(a["label"] for a in spec["arms"] if a.get("baseline"))
    primaries = [c for _, c in compare_table(load_table([folder]), baseline).comparisons if c.primary]
    need = [blocks_for(detect_of(spec), c.family, c.sd / math.sqrt(2), c.alpha, c.looks, most=5000) for c in primaries]
    return max(c.mde for c in primaries), max(k or 5000 for k in need)


def detect_of(spec: dict) -> float:
    """The study's `detect` as its loader reads it (workloads/study/spec.py)."""
    from workloads.study.spec import fraction

    return fraction(spec["detect"], "detect", 0.0, 10.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="a study YAML with training workloads")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pilot-blocks", type=int, default=4)
    ap.add_argument("--keep", type=Path, help="an output root to keep (default: a temporary one)")
    args = ap.parse_args()
    spec = yaml.safe_load(Path(args.spec).read_text())
    for word in ("blocks", "trials"):  # trials: is blocks' name before
        spec.pop(word, None)  # both plans choose their blocks for the same detect
    detect = detect_of(spec)
    ways = {"before": ("exec", "fixed"), "after": ("fork", "auto")}
    res: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="fb-ttv-") as tmp:
        root = args.keep or Path(tmp)
        for which, (mode, _) in ways.items():
            (root / which).mkdir(parents=True, exist_ok=True)
            # the pilot runs at the workload's own window both ways: window: auto sizes from it
            got = study({**spec, "blocks": args.pilot_blocks}, "pilot", root / which, mode, "fixed")
            print(f"  pilot {which:6s}: {got.get('runs')} runs, wall {got['wall']:.0f} s, decided {got.get('decided')}",
                  flush=True)
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                mode, window = ways[which]
                got = study(spec, f"{which}-{r}", root / which, mode, window)
                if "refused" in got:
                    print(f"  round {r} {which:6s}: the plan refused: {got['refused']}", flush=True)
                    continue
                mde, need = got["reached"]
                got["equal"] = need * got["wall"] / got["blocks"]
                res[which].append(got)
                print(f"  round {r} {which:6s}: {got['runs']} runs, {got['blocks']} blocks, wall {got['wall']:.0f} s, "
                      f"duty {got['duty']}%, decided {got['decided']}, reached MDE {100 * mde:.1f}% (asked {100 * detect:.0f}%: "
                      f"{need} blocks at its sds, {got['equal']:.0f} s), windows {got['windows'] or 'own'}",
                      flush=True)
    if not all(res.values()):
        print("no ratio: a plan refused in every round of one side (raise detect: in the study)")
        return 1
    w = {k: statistics.median(x["wall"] for x in v) for k, v in res.items()}
    e = {k: statistics.median(x["equal"] for x in v) for k, v in res.items()}
    print(f"median wall time: before {w['before']:.0f} s, after {w['after']:.0f} s; after/before {w['after'] / w['before']:.2f}"
          f"; at equal power (each at the asked {100 * detect:.0f}%): {e['before']:.0f} s, {e['after']:.0f} s, "
          f"after/before {e['after'] / e['before']:.2f} (load average now {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
