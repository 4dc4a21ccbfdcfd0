"""server.nixl_pthr_delay_us: NIXL's progress thread sleeps between UCX events instead of spinning.

With the engine venv's own nixl (.engines/vllm): an agent made the way vLLM's NixlConnector makes
it (UCX backend, 4 threads), with one tensor registered, and the CPU time of its busiest thread
read from /proc over 2 s. The control, without the shim, must show the spin (else the check could
not fail); with the shim that thread must be near idle and the instance's stderr must say what it
set. Then the pieces that need no engine: the shadowed sitecustomize still runs, nothing is
touched without the variable, and the adapter's PYTHONPATH keeps the user's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers import child_env
from workloads.core.errors import UsageError
from workloads.inference.adapters.vllm_pd import DEFAULTS, NIXL_SHIM, applied_pthr_delay, nixl_env

PROBE = r"""
import os, sys, time
import torch
import nixl._api as api
agent = api.nixl_agent("probe", api.nixl_agent_config(num_threads=4))
agent.register_memory(torch.zeros(1024))
def ticks():
    out = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        fields = open(f"/proc/{os.getpid()}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        out[tid] = int(fields[11]) + int(fields[12])   # utime + stime, clock ticks
    return out
a, t0 = ticks(), time.monotonic()
time.sleep(2)
b, t1 = ticks(), time.monotonic()
busiest = max(b[k] - a.get(k, 0) for k in b) / os.sysconf("SC_CLK_TCK")
print("BUSIEST", busiest / (t1 - t0))
"""


def _busiest(python, env: dict) -> tuple[float, str]:
    # UCX_MODULES=^ib, as the adapter sets across emulated nodes: where libibverbs is installed
    # but no RDMA device exists (this machine once libibverbs1 was installed for `doctor
    # --container`), the bundled UCX 1.23's ib module crashed the agent at exit (SIGSEGV, every run).
    r = subprocess.run([str(python), "-c", PROBE], env=child_env() | {"UCX_MODULES": "^ib"} | env,
                       capture_output=True, text=True, timeout=300, cwd="/tmp")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("BUSIEST"))
    return float(line.split()[1]), r.stderr


@pytest.mark.timing  # a share of a core, read on the timed worker
def test_the_progress_thread_spins_without_and_sleeps_with_the_delay(vllm_python):
    spin, err = _busiest(vllm_python, {})
    assert applied_pthr_delay(err) is None
    # NIXL's own setting: one thread on a core for as long as the agent lives (under this suite's
    # load it gets at least a third of one)
    assert spin >= 0.3, spin
    calm, err = _busiest(vllm_python, nixl_env(DEFAULTS | {"nixl_pthr_delay_us": 1000}, {}))
    assert applied_pthr_delay(err) == 1000, err[-2000:]
    # 1000 wake-ups a second at most, each a poll() and a UCX progress: ~2% of a core here
    assert calm <= 0.1 and calm * 5 <= spin, (calm, spin)


def _run(env: dict, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=child_env() | env, capture_output=True, text=True,
                          timeout=60, cwd="/tmp")


def test_the_sitecustomize_it_shadows_still_runs(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('yes')\n")
    env = nixl_env(DEFAULTS | {"nixl_pthr_delay_us": 2000}, {"PYTHONPATH": str(theirs)})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(NIXL_SHIM), str(theirs)]
    r = _run(env, "import sys; print([type(f).__name__ for f in sys.meta_path])")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ran").read_text() == "yes"
    assert "_BindingsFinder" in r.stdout


def test_nothing_is_touched_without_the_variable():
    r = _run({"PYTHONPATH": str(NIXL_SHIM)}, "import sys; print([type(f).__name__ for f in sys.meta_path])")
    assert r.returncode == 0 and "_BindingsFinder" not in r.stdout, r.stdout + r.stderr
    assert nixl_env(DEFAULTS, {}) == {}  # null: NIXL's own behaviour, no PYTHONPATH of ours


@pytest.mark.parametrize("bad", [-1, 1.5, "fast", True])
def test_a_delay_that_is_not_whole_microseconds_is_refused(bad):
    with pytest.raises(UsageError, match=r"server.nixl_pthr_delay_us=.*a whole number of microseconds >= 0"):
        nixl_env(DEFAULTS | {"nixl_pthr_delay_us": bad}, {})

