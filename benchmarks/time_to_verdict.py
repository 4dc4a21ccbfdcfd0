"""Wall time to the same decided verdicts at equal power: a study as it ran before (ranks exec'd,
each workload's own window) against now (ranks forked, `window: auto`).

    python benchmarks/time_to_verdict.py benchmarks/studies/train-aa.yaml
    sudo .venv/bin/python benchmarks/time_to_verdict.py benchmarks/studies/emu-train-ab.yaml --rounds 2

A pilot study comes first (the "before" way, --pilot-blocks blocks, not counted), so that both
plans size their blocks from the same measured noise: without it the first "before" ran on the
default CV (4 blocks) while the "after" planned from measured runs, and the two were not at equal
power. Then each round runs the study twice, in ABBA order over rounds: "before"
(FB_RANK_START=exec, FB_STUDY_KEEP_FABRIC=0, window: fixed) and "after" (fork, a kept topology
per arm, window: auto), each under its own id in one output root, each planned from every run
before it. Both plans size their blocks for the same `detect` at 80% power. Prints per study:
runs, blocks, wall time, the duty cycle (measured / wall, from the study's clock line), how many
primary verdicts were decided; then the ratio after/before of the median wall times.

Run it on a quiet machine. A plan that cannot reach the power refuses ("no number of blocks up
to 200 can call a 10% difference"), as a study should; the benchmark prints the refusal.
"""

from __future__ import annotations

import argparse
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
            "duty": int(clock.group(1)) if clock else None,
            "decided": f"{clock.group(2).replace('none', '0')}/{clock.group(3)}" if clock else "?", "windows": windows}


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
    res: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="fb-ttv-") as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        got = study({**spec, "blocks": args.pilot_blocks}, "pilot", out, "exec", "fixed")
        print(f"  pilot: {got.get('runs')} runs, wall {got['wall']:.0f} s, decided {got.get('decided')}", flush=True)
        for r in range(args.rounds):
            order = ("before", "after") if r % 2 == 0 else ("after", "before")
            for which in order:
                mode, window = ("exec", "fixed") if which == "before" else ("fork", "auto")
                got = study(spec, f"{which}-{r}", out, mode, window)
                if "refused" in got:
                    print(f"  round {r} {which:6s}: the plan refused: {got['refused']}", flush=True)
                    continue
                res[which].append(got)
                print(f"  round {r} {which:6s}: {got['runs']} runs, {got['blocks']} blocks, wall {got['wall']:.0f} s, "
                      f"duty {got['duty']}%, decided {got['decided']}, windows {got['windows'] or 'own'}", flush=True)
    if not all(res.values()):
        print("no ratio: a plan refused in every round of one side (raise detect: in the study)")
        return 1
    w = {k: statistics.median(x["wall"] for x in v) for k, v in res.items()}
    print(f"median wall time: before {w['before']:.0f} s, after {w['after']:.0f} s; after/before {w['after'] / w['before']:.2f}"
          f" (load average now {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
