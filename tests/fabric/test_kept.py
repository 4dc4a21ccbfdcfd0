"""A topology kept for a study's arm (workloads/fabric/kept.py), on real namespaces (root): a run
attaches only to the topology it asks for, finds its nodes as a new build leaves them (no cached
TCP metrics of the run before, no process of it), and hears when the kept delay line dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import need
from workloads.fabric.kept import KEPT_ENV, LENT_ENV, attach, fresh, handle, lent
from workloads.fabric.netns import EmuSpec, Topology

SPEC = EmuSpec(nodes=2, rate="1gbit", latency="500us")


@pytest.fixture(scope="module")
def topo():
    need("root")
    with Topology(SPEC, tag=f"{os.getpid()}kt", host_link=True) as t:
        yield t


def test_a_run_attaches_only_to_the_topology_it_asks_for(topo):
    env = {KEPT_ENV: handle(topo)}
    got = attach(SPEC, host_link=True, environ=env)
    assert got is not None and got.nodes == topo.nodes and got.host_addr == topo.host_addr
    assert got.env() == topo.env() and "kept for the study's arm" in got.describe()
    assert got.delay_line_problem() is None
    # another delay, another rate: the run builds its own
    assert attach(EmuSpec(nodes=2, rate="1gbit", latency="5500us"), False, env) is None
    assert attach(EmuSpec(nodes=2, rate="100mbit", latency="500us"), False, env) is None
    assert attach(SPEC, False, {}) is None
    held = json.loads(env[KEPT_ENV]) | {"host_addr": None}  # a served run needs the host's link into node 0
    assert attach(SPEC, True, {KEPT_ENV: json.dumps(held)}) is None
    assert attach(SPEC, False, {KEPT_ENV: json.dumps(held)}) is not None
    # the loan the study names reaches the run's processes, and so its record's fabric.kept
    loan = {"topology": f"fb-{topo.tag}", "built_at_run": "s-emu-t0-ar", "runs_on_it": 3}
    lent_to = attach(SPEC, True, {KEPT_ENV: handle(topo, loan)})
    assert lent(lent_to.env()) == loan and lent_to.env()[LENT_ENV] and lent(got.env()) is None and lent({}) is None
    assert "built for run s-emu-t0-ar, run 3 on it" in lent_to.describe()


def _in(ns: str, code: str) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_fresh_forgets_the_last_runs_tcp_metrics_and_refuses_a_node_still_in_use(topo):
    a, b = topo.nodes
    server = _in(b, "import socket; s = socket.create_server(('0.0.0.0', 29555)); print('up', flush=True); "
                    "c, _ = s.accept(); c.sendall(b'x' * 200000); c.close()")
    assert server.stdout.readline().strip() == "up"
    client = _in(a, f"import socket; c = socket.create_connection(('{SPEC.addr(1)}', 29555)); "
                    "n = 0\nwhile (d := c.recv(65536)): n += len(d)\nprint(n)")
    assert client.communicate(timeout=60)[0].strip() == "200000"
    server.wait(timeout=30)
    metrics = lambda ns: subprocess.run(["ip", "-n", ns, "tcp_metrics", "show"], capture_output=True,  # noqa: E731
                                        text=True).stdout.strip()
    assert metrics(a) or metrics(b)  # the closed connection left its peer's RTT behind
    assert fresh(topo)
    assert not metrics(a) and not metrics(b)
    sleeper = _in(a, "import time; print('up', flush=True); time.sleep(60)")
    try:
        assert sleeper.stdout.readline().strip() == "up"
        assert not fresh(topo)  # a process of an earlier run: the study builds the topology again
    finally:
        sleeper.kill()
        sleeper.wait()
    assert fresh(topo)


def test_a_run_hears_that_the_kept_delay_line_died():
    need("root")
    with Topology(SPEC, tag=f"{os.getpid()}kd") as t:
        got = attach(SPEC, False, {KEPT_ENV: handle(t)})
        t.delay_line.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while got.delay_line_problem() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        why = got.delay_line_problem()  # unreaped: a zombie is not a running line
        assert why is not None and f"pid {t.delay_line.pid}" in why and "carry nothing" in why, why


def test_a_kept_delay_line_ends_with_its_builder_even_on_sigkill_and_the_next_study_removes_its_namespaces():
    """A study holds its arms' delay lines for its whole run; killed with -9 it cannot stop them,
    so each line asks the kernel for SIGTERM when its builder dies (PR_SET_PDEATHSIG). Its
    namespaces (fb-<study pid>k<n>-...) stay; the next study removes them, in one line, and
    leaves those of a study that still lives alone."""
    from workloads.fabric.netns import leftovers
    from workloads.study.fabrics import remove_orphans

    need("root")
    code = ("import os, sys, time; from workloads.fabric.netns import EmuSpec, Topology\n"
            "t = Topology(EmuSpec(nodes=2, rate='1gbit', latency='500us'), tag=f'{os.getpid()}k1'); t.__enter__()\n"
            "print(t.delay_line.pid, ' '.join(t.created), flush=True); time.sleep(120)")
    builder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                               cwd=str(Path(__file__).resolve().parents[2]))
    pid, *spaces = builder.stdout.readline().split()
    mine = lambda: [n for n in leftovers() if n.startswith(f"fb-{builder.pid}k1-")]  # noqa: E731
    try:
        assert sorted(spaces) == sorted(mine()) and len(spaces) == 3, (spaces, mine())  # 2 nodes and the delay line's
        line = remove_orphans()
        assert f"fb-{builder.pid}k1-" not in (line or "") and sorted(mine()) == sorted(spaces)  # its study lives
        builder.kill()
        builder.wait(timeout=10)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{pid}").exists(), "the delay line outlived its builder"
        left = mine()
        line = remove_orphans()
        assert mine() == []
        if left:  # (unless another study on this host removed them first)
            assert line is not None and line.startswith("study: removed ") and str(builder.pid) in line, line
            assert all(n in line for n in left) and "\n" not in line, line
    finally:
        for ns in reversed(spaces):  # what the killed builder could not remove
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["rm", "-rf", f"/etc/netns/{ns}"], capture_output=True)


def test_a_wrong_keep_setting_is_refused_in_its_own_words():
    from workloads.core.errors import UsageError
    from workloads.study.fabrics import keeping

    assert keeping({}) and keeping({"FB_STUDY_KEEP_FABRIC": "1"}) and not keeping({"FB_STUDY_KEEP_FABRIC": "0"})
    with pytest.raises(UsageError, match=r"FB_STUDY_KEEP_FABRIC='no': use 1 .* or 0 \(build one per run\)"):
        keeping({"FB_STUDY_KEEP_FABRIC": "no"})
