"""Where a run's wall time goes, and what forking ranks from the launcher saves (issue: time to a verdict).

    python benchmarks/startup.py                       # 3 ABBA rounds, training and collectives
    python benchmarks/startup.py --rounds 5 --extra train.steps=40

Each round runs one training run (launch/train.py, the default tiny GPT-NeoX on Gloo, 2 ranks)
and one collectives run (launch/collectives.py, all_reduce 1-4 MiB) with the ranks exec'd as
torchrun starts them (FB_RANK_START=exec: a fresh interpreter per rank) and forked from the
launcher (fork, the default), in ABBA order so drift falls on both. Every run is a real process
of its own, as a study starts it (FB_T0 set just before it starts); its record's `timeline`
says where the time went: launch -> process (interpreter, imports; or the fork), -> group
(rendezvous, process group), -> window (model, data, warm-up), window (measured), -> record,
and the rest until the process ended (its exit). Prints the median of each phase per mode,
the duty cycle (measured / wall) and the ratio fork/exec of the wall time and of the CPU time
(user + sys of the run's processes). The machine's other load moves both modes alike.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# (label, command): the default tiny GPT-NeoX training run, and an all_reduce sweep of 1-4 MiB
RUNS = (("neox-tiny", ["launch/train.py"]),
        ("allreduce", ["launch/collectives.py", "workload=collectives", "collectives.minbytes=1M",
                       "collectives.maxbytes=4M"]))
PHASES = [("start", None, "process"), ("init", "process", "group"), ("setup", "group", "window"),
          ("measured", "window", "window_end"), ("record", "window_end", "record"), ("exit", "record", None)]


def one(kind: str, argv: list[str], mode: str, out: Path, extra: list[str], k: int) -> dict:
    run_id = f"{kind}-{mode}-{k}"
    env = dict(os.environ, FB_RANK_START=mode, OMP_NUM_THREADS="1", FB_T0=f"{time.time():.3f}")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run([sys.executable, *argv, f"output_root={out}", f"run_id={run_id}", *extra],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    wall = time.time() - float(env["FB_T0"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{kind} ({mode}) failed, exit {r.returncode}:\n{r.stderr[-2000:]}")
    (rec,) = [json.loads(p.read_text()) for p in (out / run_id / "records").glob("*.json")]
    tl = dict(rec.get("timeline") or {})
    tl["exit"] = wall
    return {"wall": wall, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), "tl": tl}


def phases(tl: dict) -> dict[str, float]:
    marks = {"exit": tl["exit"], **tl}
    out = {}
    for name, a, b in PHASES:
        t_a = 0.0 if a is None else marks.get(a)
        t_b = marks["exit"] if b is None else marks.get(b)
        if t_a is not None and t_b is not None:
            out[name] = t_b - t_a
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (each: exec, fork, fork, exec)")
    ap.add_argument("--extra", nargs="*", default=[], help="overrides for every run")
    args = ap.parse_args()
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fb-startup-") as tmp:
        k = 0
        for r in range(args.rounds):
            for mode in ("exec", "fork", "fork", "exec") if r % 2 == 0 else ("fork", "exec", "exec", "fork"):
                for kind, argv in RUNS:
                    k += 1
                    results.setdefault((kind, mode), []).append(one(kind, argv, mode, Path(tmp), args.extra, k))
                    got = results[(kind, mode)][-1]
                    print(f"  {kind:11s} {mode:4s} wall {got['wall']:6.2f} s  cpu {got['cpu']:6.2f} s", flush=True)
    print(f"\nmedians over {2 * args.rounds} runs per cell (load average now {os.getloadavg()[0]:.1f}):")
    names = [p[0] for p in PHASES]
    print(f"{'run':11s} {'mode':4s} " + " ".join(f"{n:>8s}" for n in names) + f" {'wall':>7s} {'cpu':>7s} {'duty':>5s}")
    for kind, _ in RUNS:
        for mode in ("exec", "fork"):
            rs = results[(kind, mode)]
            ph = [phases(x["tl"]) for x in rs]
            cells = [statistics.median([p[n] for p in ph if n in p]) if any(n in p for p in ph) else float("nan")
                     for n in names]
            wall = statistics.median(x["wall"] for x in rs)
            cpu = statistics.median(x["cpu"] for x in rs)
            duty = statistics.median(p.get("measured", 0) / x["wall"] for p, x in zip(ph, rs))
            print(f"{kind:11s} {mode:4s} " + " ".join(f"{c:8.2f}" for c in cells) + f" {wall:7.2f} {cpu:7.2f} {100 * duty:4.0f}%")
        w = {m: statistics.median(x["wall"] for x in results[(kind, m)]) for m in ("exec", "fork")}
        c = {m: statistics.median(x["cpu"] for x in results[(kind, m)]) for m in ("exec", "fork")}
        print(f"{kind:11s} fork/exec: wall {w['fork'] / w['exec']:.2f}, cpu {c['fork'] / c['exec']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
