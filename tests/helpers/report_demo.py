"""A small real results folder with every workload and a refused pair, for the report tests
and the screenshot in docs/analysis.md: `PYTHONPATH=tests python -m helpers.report_demo OUT_DIR`.

Two fabric labels that both run Gloo over loopback (`loopback`, and the same profile renamed
`loopback-b`: an A/A pair is a test device, not a fabric users should find in conf/fabric/):
training at micro-batch 1 and 2 and collectives, two trials each (a `trial=0,1` sweep key,
ignored by the guard like run_id); `loopback-b`'s training is also tracked by W&B offline when
a folder for it is given, with a secret in its fabric env that must never reach W&B. Inference
runs against the scripted SSE server (the GPU-only engines cannot run here; the scripted server
is the test double at that boundary) with a slower first token for `loopback-b`, so the TTFT
charts have two curves apart; and one near miss: each arm also ran micro-batch 2 at a sequence
length the other did not (48 vs 64), which the guard refuses. The launches run two at a time
(an A/A comparison does not care that they share the 2 cores).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from helpers import REPO, child_env

FABRICS = {"loopback": [], "loopback-b": ["fabric.name=loopback-b"]}
TRAIN = ["-m", "train.micro_batch_size=1,2", "trial=0,1", "train.steps=5", "train.warmup_steps=1", "train.seq_length=32"]
COLL = ["-m", "trial=0,1", "collectives.ops=[all_reduce]", "collectives.minbytes=1024", "collectives.maxbytes=1048576",
        "collectives.stepfactor=4", "collectives.iters=4", "collectives.warmup_iters=1", "launcher.nproc_per_node=2"]
INFER = ["server=external", "load.slo=ttft:12", "load.points=[1,4,16]", "load.num_requests=24", "load.warmup_requests=2",
         "load.dataset.input_len=16", "load.dataset.output_len=6"]
NEAR_MISS = ["train.micro_batch_size=2", "train.steps=5", "train.warmup_steps=1"]
SECRET = "hunter2"  # on loopback-b's command line; the W&B test checks it never reaches W&B's files


def _torchrun(script: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "launch" / script), *args]


class Steps:
    """Every launch's wall time, against one budget for the whole build: a launch still running
    when the budget ends is stopped and named, with the launches before it and their times,
    instead of the build being cut off silently by pytest's own timeout (600 s, pytest.ini)."""

    def __init__(self, budget_s: float):
        self.deadline = time.monotonic() + budget_s
        self.budget_s = budget_s
        self.done: list[tuple[str, float]] = []

    def run_pairs(self, cmds: list[tuple[list[str], dict]]) -> None:
        for i in range(0, len(cmds), 2):
            t0 = time.monotonic()
            procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for c, env in cmds[i:i + 2]]
            for (c, _), p in zip(cmds[i:i + 2], procs):
                name = _run_id(c)
                try:
                    out, _ = p.communicate(timeout=max(self.deadline - time.monotonic(), 1))
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    out = p.communicate()[0] or ""
                    raise RuntimeError(f"the demo folder's build ran past its {self.budget_s:.0f} s: {name} still "
                                       f"running after {time.monotonic() - t0:.0f} s; before it: {self.summary()}; "
                                       f"its output's end: {out[-1500:]}") from None
                self.done.append((name, time.monotonic() - t0))
                if p.returncode != 0:
                    raise RuntimeError(f"{' '.join(c[-4:])} failed ({p.returncode}): {out[-2000:]}")

    def summary(self) -> str:
        return ", ".join(f"{n} {s:.0f} s" for n, s in self.done) or "none"


def _run_id(cmd: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in cmd if a.startswith("run_id="))


def _done(res: Path, cmd: list[str]) -> bool:
    """A run directory that holds records already (a rerun after one launch failed)."""
    return any((res / _run_id(cmd) / "records").glob("*.json"))


def build(root: Path, budget_s: float = 540, wandb_dir: Path | None = None) -> Path:
    """Write the records under root/results and return that folder; with `wandb_dir`,
    loopback-b's training also logs to W&B offline there. Past `budget_s` (below pytest's 600 s)
    the launch still running is named, with each earlier launch's time (Steps)."""
    from workloads.testing.scripted_server import Running

    res = root / "results"
    cmds = []
    for fab, extra in FABRICS.items():
        env, logged = child_env(), []
        if wandb_dir is not None and fab == "loopback-b":
            wandb_dir.mkdir(parents=True, exist_ok=True)
            env = child_env(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir))
            env.pop("WANDB_API_KEY", None)
            logged = ["logger=wandb", f"+fabric.env.MY_SECRET_TOKEN={SECRET}"]
        cmds.append((_torchrun("train.py", [*TRAIN, *extra, *logged, f"output_root={res}", f"run_id=train-{fab}"]), env))
    for fab, extra in FABRICS.items():
        cmds.append(([sys.executable, str(REPO / "launch" / "collectives.py"), *COLL, *extra, f"output_root={res}",
                      f"run_id=coll-{fab}"], child_env()))
    # the near miss: each arm ran mb=2 once more, at a sequence length the other did not run
    cmds.append((_torchrun("train.py", [*NEAR_MISS, "train.seq_length=48", *FABRICS["loopback-b"], f"output_root={res}",
                                        "run_id=train-seq48"]), child_env()))
    cmds.append((_torchrun("train.py", [*NEAR_MISS, "train.seq_length=64", f"output_root={res}", "run_id=train-seq64"]),
                 child_env()))
    steps = Steps(budget_s)
    steps.run_pairs([c for c in cmds if not _done(res, c[0])])
    for (fab, extra), ttft in zip(FABRICS.items(), (4.0, 9.0)):
        with Running(ttft_ms=ttft, itl_ms=2.0) as url:
            cmd = [sys.executable, str(REPO / "launch" / "infer.py"), *INFER, *extra, f"server.url={url}",
                   f"output_root={res}", f"run_id=infer-{fab}"]
            steps.run_pairs([] if _done(res, cmd) else [(cmd, child_env())])
    print(f"demo folder built: {steps.summary()}")
    return res


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
