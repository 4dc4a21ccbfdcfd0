"""Signals and deaths around a training run, self-launched (`python launch/train.py`) or under
a raw `torchrun`: real ranks over Gloo, real signals. Whatever ends the run, no rank outlives
it and the point that was being measured has one failed record saying why."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, child_env, gone, records_in

LONG = ["train.steps=100000", "train.warmup_steps=1"]


def _ranks(launcher: int) -> dict[int, int]:
    """rank -> pid of the launcher's rank processes: a rank forked from the launcher is named
    fb-rank<N> (workloads/core/forkrank.py; its /proc environ is the launcher's), one exec'd by
    torchrun has RANK in its environment."""
    out = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if int(d.joinpath("stat").read_text().rsplit(")", 1)[1].split()[1]) != launcher:
                continue
            comm = d.joinpath("comm").read_text().strip()
            env = dict(kv.split("=", 1) for kv in d.joinpath("environ").read_text().split("\0") if "=" in kv)
        except (OSError, ValueError):
            continue
        if comm.startswith("fb-rank") and comm[7:].isdigit():
            out[int(comm[7:])] = int(d.name)
        elif "RANK" in env:
            out[int(env["RANK"])] = int(d.name)
    return out


def _start_measuring(tmp_path: Path, out_root: Path, torchrun: list[str] | None = None
                     ) -> tuple[subprocess.Popen, dict[int, int]]:
    """A self-launched run (or, with `torchrun` as the agent's extra flags, one under a raw
    torchrun agent), returned once rank 0 is inside its measured point: its in-flight copy
    exists (in the launcher's folder, or beside the records)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    agent = [] if torchrun is None else ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *torchrun]
    p = subprocess.Popen([sys.executable, *agent, str(REPO / "launch" / "train.py"), f"output_root={out_root}", *LONG],
                         cwd=REPO, env=child_env(TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + 240
        while not (list(tmp.glob("fabricbench-inflight-*/*.inflight")) or _copies(out_root)):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.2)
        ranks = _ranks(p.pid)
        assert sorted(ranks) == [0, 1]
    except BaseException:  # a run of 100000 steps must not outlive the test that failed to find its ranks
        p.kill()
        p.communicate()
        raise
    return p, ranks


def _copies(out_root: Path) -> list[Path]:
    """What is left in the in-flight folders beside the records (copies, claims, temp files)."""
    return list(out_root.rglob("records/.inflight/*"))


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupt_is_one_line_and_a_failed_record(tmp_path, out_root, sig, code):
    p, ranks = _start_measuring(tmp_path, out_root)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == code, err
    assert err.strip() == f"interrupted ({sig.name}): measured points are kept", err
    (rec,) = records_in(out_root)
    assert rec["status"] == "failed" and rec["error"].startswith("interrupted")
    assert gone(ranks.values())


@pytest.mark.slow
def test_sigkilled_launcher_takes_its_ranks_down(tmp_path, out_root):
    p, ranks = _start_measuring(tmp_path, out_root)
    p.kill()
    p.wait(30)
    assert gone(ranks.values()), "ranks outlived their SIGKILLed launcher"


@pytest.mark.slow
def test_rank0_death_still_leaves_a_failed_record(tmp_path, out_root):
    p, ranks = _start_measuring(tmp_path, out_root)
    os.kill(ranks[0], signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGKILL, err  # as a shell reports a killed process (docs/reliability.md)
    assert "error: rank 0 was killed by SIGKILL (exit code -9)\n" in err, err  # nothing "above": it printed none
    (rec,) = records_in(out_root)
    assert rec["status"] == "failed" and rec["error"] == "rank 0 was killed by SIGKILL (exit code -9) during this point"
    assert rec["workload"] == "pretrain" and rec["config"]["train"]["steps"] == 100000
    assert gone(ranks.values())


@pytest.mark.slow
@pytest.mark.parametrize("agent,rank1_got", [
    ([], None),  # the agent SIGTERMs rank 1 at once: whichever comes first, the signal or Gloo's error
    (["--monitor-interval=120"], "RuntimeError"),  # an agent slow to notice: Gloo's peer-closed error
], ids=["agent-sigterm", "gloo-error"])
def test_rank0_death_under_raw_torchrun_still_leaves_a_failed_record(tmp_path, out_root, agent, rank1_got):
    """No launcher of ours watches a raw torchrun: rank 1, on rank 0's host, finds rank 0's pid
    gone when its collective fails or the agent SIGTERMs it, and writes the point's one failed
    record from rank 0's in-flight copy."""
    p, ranks = _start_measuring(tmp_path, out_root, torchrun=agent)
    time.sleep(2)  # into the steps (or DDP's first collectives on a loaded machine)
    os.kill(ranks[0], signal.SIGKILL)
    if rank1_got:  # rank 1 ends by itself; then the agent is stopped, as its user would
        assert gone([ranks[1]], within_s=90), "rank 1 outlived its dead peer"
        p.terminate()
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0
    recs = records_in(out_root)
    assert len(recs) == 1, (recs, err[-4000:])
    rec = recs[0]
    assert rec["status"] == "failed", rec["error"]
    assert rec["error"].startswith(f"rank 0 (pid {ranks[0]} on ") and "died during this point" in rec["error"]
    if rank1_got:
        assert f"rank 1 then got {rank1_got}" in rec["error"], rec["error"]
    assert rec["workload"] == "pretrain" and rec["config"]["train"]["steps"] == 100000
    assert f"error: rank 0 (pid {ranks[0]}) died during this point; rank 1 wrote its failed record" in err, err
    assert not _copies(out_root)
    assert gone(ranks.values())


_ENDING = """
import atexit, ctypes, sys, threading, time
from workloads.core.dist import exit_process
atexit.register(lambda: print("exit function ran"))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
from concurrent.futures import ThreadPoolExecutor
ThreadPoolExecutor(1).submit(print, "executor ran").result()  # its idle worker waits to be told to stop
print("python line", end="")            # unflushed, stdout is a pipe
ctypes.CDLL(None).printf(b" c line")     # C stdio, unflushed too
exit_process({code})
"""


@pytest.mark.slow
@pytest.mark.parametrize("code,status", [("None", 0), ("3", 3), ("143", 143), ("'a message'", 1)])
def test_a_rank_ends_without_teardown_and_loses_nothing(code, status):
    """exit_process (how every rank that made a process group ends, dist.py says why) keeps
    what sys.exit gives: the status, the exit functions, threads joined (an idle executor's
    worker included, which waits to be told), and every line written, Python's and C's,
    though the streams are pipes and nothing was flushed."""
    env = child_env()
    env.pop("PYTHONUNBUFFERED")  # which would make C's stdout unbuffered as well as Python's
    r = subprocess.run([sys.executable, "-c", _ENDING.format(code=code)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == status, r.stderr
    for line in ("python line", "thread finished", "executor ran", "exit function ran", " c line"):
        assert line in r.stdout, r.stdout
    assert r.stderr == ("a message\n" if status == 1 else ""), r.stderr


_STOPPED_WHILE_ENDING = """
import sys, threading, time
from workloads.core import signals
from workloads.core.dist import exit_process
signals.install()
threading.Thread(target=time.sleep, args=(60,)).start()  # exit_process joins it, as Python's exit would
# threading's exit hooks run inside exit_process, just before that join: the test signals from here on
threading._register_atexit(print, "ending", flush=True)
print("peer gone", file=sys.stderr, flush=True)
exit_process(1)
"""


@pytest.mark.slow
def test_a_stop_that_lands_while_a_rank_ends_ends_it_quietly_with_its_status():
    """A rank already ending (here joining a thread still at work) that torchrun then stops: the SIGTERM
    ends it at once with the status it was ending with, and no traceback follows its one line
    (a full run saw the Terminated exception escape exit_process with every exception before it)."""
    p = subprocess.Popen([sys.executable, "-c", _STOPPED_WHILE_ENDING], cwd=REPO, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ending\n"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=15)  # not the thread's 60 s, nor SIGTERM's 20 s grace
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1 and err == "peer gone\n", err


# The signal's exception raised inside a weakref callback, where Python prints it as "Exception
# ignored" and drops it (CI saw it in the import system's module-lock callback): then a peer's
# failure, as a rank whose peers did stop meets it.
_LOST = """
import os, signal, sys, weakref
from workloads.commands import entry

def run(cfg, overrides):
    class Owner: pass
    def callback(_):
        os.kill(os.getpid(), signal.{sig})
        for _ in range(100000): pass  # the handler runs here and its exception is dropped
    owner = Owner(); ref = weakref.ref(owner, callback); del owner
    print("carried on", flush=True)
    {then}

entry.hydra_entry(__file__, run, distributed=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
@pytest.mark.parametrize("then", ["raise RuntimeError('Connection closed by peer')", "import time; time.sleep(30)"])
def test_an_interruption_python_dropped_still_interrupts(tmp_path, sig, code, then):
    """What follows a dropped interruption is the interruption, said in the one line: a later
    error (a peer gone) is not a bug's traceback, and a rank that meets none still stops
    (the interruption is raised again, outside the callback), not at a grace timer's os._exit."""
    script = tmp_path / "entry.py"
    script.write_text(_LOST.format(sig=sig, then=then))
    r = subprocess.run([sys.executable, str(script), f"output_root={tmp_path}/results"], cwd=tmp_path,
                       env=child_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert "carried on" in r.stdout, r.stderr
    assert (r.returncode, r.stderr) == (code, "interrupted: measured points are kept\n"), r.stderr


# The same drop inside a Cython `noexcept` callback, which prints what it drops through
# sys.excepthook before sys.unraisablehook sees it (Cython's __Pyx_WriteUnraisable): uvloop's
# getaddrinfo callback, where a fast-lane run's SIGTERM landed (test_sweep.py's mid-sweep stop
# printed uvloop's traceback above its one line). The signal is sent from inside that callback's
# call of socket.AddressFamily(...), so it lands there every time.
_LOST_IN_CYTHON = """
import enum, os, signal, socket
from workloads.commands import entry

def run(cfg, overrides):
    import asyncio, uvloop
    armed = [True]
    convert = enum.EnumType.__call__
    def call(cls, value, *args, **kwargs):
        if cls is socket.AddressFamily and armed:
            armed.clear()
            os.kill(os.getpid(), signal.{sig})
            for _ in range(100000): pass  # the handler runs here, inside uvloop's callback
        return convert(cls, value, *args, **kwargs)
    enum.EnumType.__call__ = call
    async def resolve():
        await asyncio.get_running_loop().getaddrinfo("127.0.0.1", 80)
        await asyncio.sleep(30)
    print("resolving", flush=True)
    uvloop.run(resolve())

entry.hydra_entry(__file__, run, distributed=False)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig,code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_an_interruption_a_cython_callback_dropped_is_one_line(tmp_path, sig, code):
    script = tmp_path / "entry.py"
    script.write_text(_LOST_IN_CYTHON.format(sig=sig))
    r = subprocess.run([sys.executable, str(script), f"output_root={tmp_path}/results"], cwd=tmp_path,
                       env=child_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert "resolving" in r.stdout, r.stderr
    assert (r.returncode, r.stderr) == (code, "interrupted: measured points are kept\n"), r.stderr


# A SIGTERM that lands inside Hydra's loading of a multirun's next job, which library code turns
# into another exception: in a full run OmegaConf's flag_override met Terminated mid-assignment and
# raised "AttributeError: 'NoneType' object has no attribute '_invalidate_flags_cache'" in its
# place, and Hydra printed that as a bug's traceback. Here the same happens by hand at the same
# place (ConfigLoaderImpl.load_sweep_config, after the first job), as that code did it.
_BETWEEN_JOBS = """
import os, signal
from hydra._internal import config_loader_impl
from workloads.commands import entry

load = config_loader_impl.ConfigLoaderImpl.load_sweep_config
jobs = []

def interrupted_load(self, *args, **kwargs):
    if jobs:  # the second job's config: the stop arrives while Hydra builds it
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100000): pass  # the handler raises here
        except KeyboardInterrupt:
            raise AttributeError("'NoneType' object has no attribute '_invalidate_flags_cache'")
    return load(self, *args, **kwargs)

config_loader_impl.ConfigLoaderImpl.load_sweep_config = interrupted_load

def run(cfg, overrides):
    jobs.append(cfg.trial)
    print("job", cfg.trial, flush=True)

entry.hydra_entry(__file__, run, distributed=False)
"""


@pytest.mark.slow
def test_a_stop_between_a_sweeps_jobs_is_an_interruption_whatever_it_became(tmp_path):
    script = tmp_path / "entry.py"
    script.write_text(_BETWEEN_JOBS)
    r = subprocess.run([sys.executable, str(script), "-m", "trial=0,1", f"output_root={tmp_path}/results"],
                       cwd=tmp_path, env=child_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)
    assert "job 0" in r.stdout and "job 1" not in r.stdout, r.stdout + r.stderr
    assert (r.returncode, r.stderr) == (143, "interrupted: measured points are kept\n"), r.stderr


_LANDS_ON_EXIT = """
import json, os, signal, sys
from pathlib import Path
from workloads import session
from workloads.core import signals
from workloads.core.loggers import Loggers

signals.install()
out = Path(sys.argv[1])


class Info:
    is_main, world_size, rank, nodes = True, 1, 0, 1


def measure():
    raise RuntimeError("Connection closed by peer")  # as a stopped peer reaches rank 0's collective


def land_on_exit(frame, event, arg):  # the signal's handler then runs at __exit__'s first instruction
    if event == "call" and frame.f_code is session.Recorded.__exit__.__code__:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)


record = {"schema": "fabricbench.record/1", "workload": "pretrain", "status": "running", "error": None, "fabric": {}}
sys.setprofile(land_on_exit if sys.argv[2] == "on" else None)
try:
    session.run_point(session.Point(record, out, "p", Info()), measure, None, loggers=Loggers([]),
                      summarize=lambda r, p: None, group=False, noise=False)
except KeyboardInterrupt:
    print("interrupted")
except RuntimeError:
    print("failed")
print(json.dumps(sorted(json.loads(f.read_text())["error"] for f in out.glob("*.json"))))
"""


@pytest.mark.parametrize("lands", ["on", "off"])
def test_a_stop_that_lands_on_the_points_way_out_still_records_it(tmp_path, lands):
    """A signal's handler runs where the interpreter next looks; under load that was once the first
    instruction of Recorded.__exit__, entered because rank 0's collective failed as its stopped
    peer left: __exit__ ended before writing, and the launcher wrote the point from its copy (a
    second line, 1 stress run in ~30). The point is recorded as the interruption it is; without
    the signal, as the failure it was."""
    r = subprocess.run([sys.executable, "-c", _LANDS_ON_EXIT, str(tmp_path / "records"), lands], cwd=REPO,
                       env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    said, errors = r.stdout.splitlines()
    assert (said, errors) == (("interrupted", '["interrupted (Ctrl-C or SIGTERM)"]') if lands == "on"
                              else ("failed", '["RuntimeError: Connection closed by peer"]')), r.stdout


_TIMER_JOINS_ITSELF = """
import gc, sys, threading
from datetime import timedelta
from torch.distributed.elastic.rendezvous.utils import _PeriodicTimer
from workloads.core import signals

if sys.argv[1] == "installed":
    signals.install()
holder, done = {}, threading.Event()


def tick():  # the timer's last reference dropped in its own thread: its finalizer joins that thread
    holder.pop("timer", None)
    done.set()


timer = _PeriodicTimer(timedelta(seconds=0.01), tick)
timer.start()
holder["timer"] = timer
del timer
done.wait(30)
gc.collect()
"""


@pytest.mark.parametrize("hook", ["installed", "python's"])
def test_torchs_timer_that_joins_itself_says_nothing(hook):
    """torch's rendezvous keep-alive timer, finalized from its own thread, raises "cannot join
    current thread" where Python can only print it (a launcher's stderr after its one line, under
    load); the thread stops regardless. Our hook keeps it off stderr; Python's own prints it."""
    r = subprocess.run([sys.executable, "-c", _TIMER_JOINS_ITSELF, hook], cwd=REPO, env=child_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    if hook == "installed":
        assert r.stderr == "", r.stderr
    else:
        assert "cannot join current thread" in r.stderr, r.stderr
