"""Ranks forked from their launcher (workloads/core/forkrank.py), against torchrun's exec: real
self-launched training runs over Gloo. Both start real, separate rank processes that each build
their own process group; the record says how the writing rank started and where its time went;
a wrong FB_RANK_START is one line before anything starts. (The signals, in-flight and bad-input
tests exercise the forked ranks' deaths, exits and messages: fork is the default.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers import REPO, child_env, records_in

SHORT = ["train.steps=4", "train.warmup_steps=1"]


def _train(out, mode: str | None, *extra: str) -> subprocess.CompletedProcess:
    env = child_env(**({"FB_RANK_START": mode} if mode else {}))
    return subprocess.run([sys.executable, str(REPO / "launch" / "train.py"), f"output_root={out}", *SHORT, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_forked_and_execd_ranks_both_measure_and_say_how_they_started(tmp_path):
    for mode, expect in ((None, "fork"), ("exec", "exec")):
        out = tmp_path / expect
        r = _train(out, mode, f"run_id={expect}")
        assert r.returncode == 0, r.stderr[-3000:]
        (rec,) = records_in(out)
        tl = rec["timeline"]
        assert tl["rank_start"] == expect, tl
        # one clock from the launch: the rank started, joined its group, measured, then wrote
        assert 0 < tl["process"] <= tl["group"] <= tl["window"] < tl["window_end"] <= tl["record"], tl
        assert rec["world"]["world_size"] == 2 and rec["metrics"]["samples_per_sec"] > 0
        assert rec["fabric"]["transport"]["verdict"] == "ok"  # each rank's own sockets, found in its own /proc


def test_a_wrong_rank_start_is_one_line(tmp_path):
    r = _train(tmp_path / "o", "spawn")
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: FB_RANK_START='spawn': choose fork (ranks forked from the launcher) or exec "
                                "(a fresh interpreter per rank, as torchrun starts them)"), r.stderr
    assert not list((tmp_path / "o").rglob("*.json"))


_THREADS = """
import os, sys, torch
from pathlib import Path
from workloads.core import forkrank
torch.set_num_threads(3)   # the launcher's pool, as OpenMP sized it where torch loaded
out = Path(sys.argv[1])
for name, env in (("own", {"OMP_NUM_THREADS": "1"}), ("unset", {})):
    def body(name=name):
        (out / name).write_text(str(torch.get_num_threads()))
        return 0
    assert forkrank.fork(["x"], body, {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, **env},
                         name).wait(60) == 0
"""


def test_a_forked_child_takes_its_own_omp_threads(tmp_path):
    """A fork keeps the launcher's OpenMP pool size; a fresh interpreter reads OMP_NUM_THREADS. A
    forked rank (or node agent) given OMP_NUM_THREADS=1 runs one intra-op thread, as torchrun's
    exec'd rank would; without the variable it keeps the launcher's, as an exec'd one would
    take the default. (Missed, each emulated rank ran both cores' threads: steps 10-30x slower.)"""
    r = subprocess.run([sys.executable, "-c", _THREADS, str(tmp_path)], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ((tmp_path / "own").read_text(), (tmp_path / "unset").read_text()) == ("1", "3")


_SIGNAL_IN_FORK = """
import os, signal, sys
from workloads.core import forkrank

class SignalException(Exception):  # what torch's elastic agent raises from its handler
    pass

def handler(signum, frame):
    raise SignalException(signum)

signal.signal(signal.SIGTERM, handler)
# The signal lands while the launcher is inside the fork, as emulate's --timeout did in CI: from
# an after-fork hook (logging's _releaseLock is one), where Python only prints what is raised.
os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGTERM))
try:
    child = forkrank.fork(["rank"], lambda: 0, dict(os.environ), "rank")
except SignalException:
    print("raised", file=sys.stderr)
    sys.exit(3)
print("not raised", child.wait(), file=sys.stderr)
"""


def test_a_stop_signal_during_the_fork_reaches_the_launcher_not_a_fork_hook():
    """A SIGTERM taken inside an after-fork hook ran the agent's handler there, where Python
    prints "Exception ignored" with a traceback and drops the exception: the agent carried on,
    unsignalled. Held across the fork, it is raised in the launcher's own code once the child is known."""
    r = subprocess.run([sys.executable, "-c", _SIGNAL_IN_FORK], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr.strip()) == (3, "raised"), r.stderr[-3000:]
