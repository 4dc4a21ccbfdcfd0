"""What a study's warm emulated runs save: each arm's topology built once per study and each run's
emulator forked from the study, against a topology and a fresh interpreter per run (root).

    sudo .venv/bin/python benchmarks/kept_fabric.py                 # 2 ABBA rounds, 4 studies
    sudo .venv/bin/python benchmarks/kept_fabric.py --rounds 3 --blocks 3
    sudo .venv/bin/python benchmarks/kept_fabric.py --workload tp2   # served: the reference engine at TP=2
    .venv/bin/python benchmarks/kept_fabric.py --local               # loopback arms: forked launchers only

Each study is conf/study/emu-latency.yaml's two arms (0.5 ms and 5.5 ms one way on one 1 Gbit/s
link, through the delay line) with one of its workloads, `--blocks` blocks: 2 x blocks runs,
each a real emulated run as every study starts it: the 1 KiB all_reduce, or (`--workload tp2`) the
served TP=2 reference engine at the size tests/study/test_latency_study.py runs it (4 requests of 8
tokens after 1 warm-up), whose engine and node agents are also forked where the topology is kept
(workloads/inference/adapters/forkstart.py; each such run's server log says so, and is counted). The same study runs with the topology kept for
each arm and the emulators forked (the default: workloads/study/fabrics.py) and with both off
(FB_STUDY_KEEP_FABRIC=0: a topology built around every run, `python launch/emulate.py` exec'd);
with `--local` the arms are two loopback ones and what differs is each run's launcher, forked from
the warm study or a fresh `python launch/<script>.py`,
in ABBA order so the machine's drift falls on both. Prints, per mode, the median over studies of the study's wall time
(builds included: a kept topology is built before its arm's first run, outside the run), of its
runs' mean wall time (timings.jsonl) and of the CPU time of everything the study started, then
the ratios kept / per run. The machine's other load moves both modes alike.
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

import yaml

REPO = Path(__file__).resolve().parent.parent
MODES = {"kept": "1", "per-run": "0"}


# the served cell's size in CI (tests/study/test_latency_study.py)
CI_SERVED = {"load.num_requests": "load.num_requests=4", "load.warmup_requests": "load.warmup_requests=1",
             "load.dataset.output_len": "load.dataset.output_len=8"}


def spec_file(tmp: Path, blocks: int, workload: str = "allreduce-1k", local: bool = False) -> Path:
    spec = yaml.safe_load((REPO / "conf" / "study" / "emu-latency.yaml").read_text())
    spec.update(name="kept-bench", blocks=blocks, detect="60%")
    if local:  # two loopback arms: nothing to keep but the warm study each launcher is forked from
        spec["arms"] = [{"label": "a", "fabric": "loopback", "baseline": True}, {"label": "b", "fabric": "loopback"}]
    spec["workloads"] = [w for w in spec["workloads"] if w["name"] == workload]
    for w in spec["workloads"]:
        w["overrides"] = [CI_SERVED.get(o.split("=")[0], o) for o in w["overrides"]]
    path = tmp / "kept-bench.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one(spec: Path, mode: str, out: Path, k: int, local: bool = False) -> dict:
    env = dict(os.environ, FB_STUDY_KEEP_FABRIC=MODES[mode], OMP_NUM_THREADS="1")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "study", str(spec), "--output-root", str(out),
                        "--id", f"{mode}-{k}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"study ({mode}) failed, exit {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    runs = [json.loads(x)["seconds"] for x in (out / f"{mode}-{k}" / "timings.jsonl").read_text().splitlines() if x]
    kept = sum("kept for the study's arm" in p.read_text() for p in (out / f"{mode}-{k}" / "logs").glob("*.log"))
    if not local and (kept == len(runs)) != (mode == "kept"):
        sys.exit(f"study ({mode}): {kept} of {len(runs)} runs said they ran on a kept topology")
    served = list((out / f"{mode}-{k}").rglob("server/reference.log"))
    forked = sum("forked from the warm load generator" in p.read_text() for p in served)
    if served and (forked == len(served)) != (mode == "kept"):
        sys.exit(f"study ({mode}): {forked} of {len(served)} served runs forked their engine")
    return {"wall": wall, "run": statistics.mean(runs), "cpu": (after.ru_utime + after.ru_stime)
            - (before.ru_utime + before.ru_stime), "runs": len(runs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="ABBA rounds (each: kept, per-run, per-run, kept)")
    ap.add_argument("--blocks", type=int, default=2, help="blocks per study (2 runs each)")
    ap.add_argument("--workload", default="allreduce-1k", choices=("allreduce-1k", "tp2"),
                    help="the study's one workload: the 1 KiB all_reduce, or the served TP=2 reference engine")
    ap.add_argument("--local", action="store_true",
                    help="two loopback arms (no root): each run's launcher forked from the study against exec'd")
    args = ap.parse_args()
    if os.geteuid() != 0 and not args.local:
        sys.exit("run as root: the studies build network namespaces")
    got: dict[str, list[dict]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="fb-kept-") as tmp:
        spec = spec_file(Path(tmp), args.blocks, args.workload, args.local)
        k = 0
        for _ in range(args.rounds):
            for mode in ("kept", "per-run", "per-run", "kept"):
                k += 1
                res = one(spec, mode, Path(tmp) / f"out{k}", k, args.local)  # alone: no plan reads another's noise
                got[mode].append(res)
                print(f"{mode:8s} study {res['wall']:6.1f} s wall, {res['runs']} runs of mean {res['run']:5.1f} s, "
                      f"cpu {res['cpu']:6.1f} s  (load {os.getloadavg()[0]:.1f})", flush=True)
    med = {m: {f: statistics.median(r[f] for r in rs) for f in ("wall", "run", "cpu")} for m, rs in got.items()}
    for m, v in med.items():
        print(f"median {m:8s}: study {v['wall']:.1f} s, run {v['run']:.2f} s, cpu {v['cpu']:.1f} s")
    print(f"kept / per-run: study wall {med['kept']['wall'] / med['per-run']['wall']:.3f}, "
          f"run wall {med['kept']['run'] / med['per-run']['run']:.3f}, cpu {med['kept']['cpu'] / med['per-run']['cpu']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
