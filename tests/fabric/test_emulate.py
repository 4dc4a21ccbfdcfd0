"""Emulated fabrics: namespaces + veth + tc shaping, one torchrun agent per namespace.

The root tests build real namespaces and shape real veths with tbf, then run the real
training and collectives entry points across them. Afterwards no namespace of ours may
remain (deleting a namespace deletes its veths and their qdiscs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, child_env, records_in
from helpers.tcp_probe import tcp_hello
from workloads.commands.emulate import agent_argv
from workloads.core.errors import UsageError
from workloads.fabric.netns import EmuSpec, Topology, leftovers, rate_bits_per_s

EMULATE = [sys.executable, str(REPO / "launch" / "emulate.py")]




def our_namespaces(tag: str) -> list[str]:
    return [n for n in leftovers() if n.startswith(f"fb-{tag}-")]


# --- pure parts ------------------------------------------------------------------------

def test_rate_units_are_tc_units():
    assert rate_bits_per_s("100mbit") == 1e8
    assert rate_bits_per_s("1gbit") == 1e9
    assert rate_bits_per_s("2.5Gbit") == 2.5e9
    assert rate_bits_per_s("10mbps") == 8e7          # tc: mbps is megabytes per second
    with pytest.raises(UsageError, match="not a tc rate"):
        rate_bits_per_s("100 Mb/s")
    for rate in ("1bit", "500bit", "100tbit"):  # tbf: "the rate parameter is mandatory"; "illegal value for burst"
        with pytest.raises(UsageError, match="outside what tc's tbf can shape here"):
            rate_bits_per_s(rate)


def test_spec_from_profile_block_and_its_errors():
    s = EmuSpec.from_config({"nodes": 2, "rate": "100mbit", "qdisc": "tbf", "burst": None, "latency": None})
    assert (s.nodes, s.rate, s.qdisc) == (2, "100mbit", "tbf")
    assert s.burst_bytes() == 128 * 1024            # 4 ms at 100 Mbit/s is only 50 kB
    assert EmuSpec.from_config({"rate": "10gbit"}).burst_bytes() == 5_000_000
    assert EmuSpec.from_config({"rate": "100mbit"}, rate="none").rate is None
    for block, msg in [({"nodes": 1}, "2 to 64"), ({"qdisc": "netem"}, "tbf or htb"),
                       ({"latency": "fast"}, "500us"), ({"colour": 1}, "unknown keys"), ({"burst": 10}, "one packet")]:
        with pytest.raises(UsageError, match=msg):
            EmuSpec.from_config(block)


def test_agents_use_static_rendezvous_on_node0_veth():
    spec = EmuSpec(nodes=3, rate="1gbit")
    argv = agent_argv("py", spec, 2, 4, "launch/train.py", ["fabric=emu-1g", "a=b c"])
    assert argv[:4] == ["py", "-m", "workloads.commands.emulate", "--agent"]
    assert "--nnodes=3" in argv and "--node_rank=2" in argv and "--nproc_per_node=4" in argv
    assert "--master_addr=10.77.0.1" in argv and "--local_addr=10.77.0.3" in argv
    assert argv[-3:] == ["launch/train.py", "fabric=emu-1g", "a=b c"]  # one word each, never a shell


@pytest.mark.slow
def test_bad_input_is_one_message():
    env = child_env()
    p = subprocess.run(EMULATE + ["launch/train.py", "fabric=loopback"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "fabric=loopback has no emulate: block" in p.stderr
    assert "Traceback" not in p.stderr
    p = subprocess.run(EMULATE + ["--rate", "fast", "launch/train.py", "fabric=emu-100m"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not a tc rate" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(EMULATE + ["launch/train.py", "-m", "fabric=emu-100m,emu-1g"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "2 different emulated fabrics" in p.stderr, p.stderr
    # The same command through the `fabricbench` registry.
    p = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "emulate", "--nodes", "1", "launch/train.py",
                        "fabric=emu-100m"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "emulate.nodes=1; use 2 to 64" in p.stderr and "Traceback" not in p.stderr


def test_non_root_is_told_so(monkeypatch):
    from workloads.fabric import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    with pytest.raises(UsageError, match="need root"):
        netns.require_root()


# --- real namespaces -------------------------------------------------------------------

@pytest.mark.requires("root")
def test_topology_shapes_and_is_removed(tmp_path):
    """Two nodes direct, three through a bridge: addresses reachable, tbf on every egress,
    and nothing left afterwards, also when building fails half-way."""
    for nodes in (2, 3):
        tag = f"{os.getpid()}t{nodes}"
        with Topology(EmuSpec(nodes=nodes, rate="100mbit"), tag=tag) as topo:
            assert len(our_namespaces(tag)) == nodes + (nodes > 2)
            q = subprocess.run(["tc", "-n", topo.nodes[0], "qdisc", "show", "dev", "emu0"], capture_output=True,
                               text=True, check=True).stdout
            assert "tbf" in q and "rate 100Mbit" in q
            # A TCP connection from the first node to the last one's veth address.
            tcp_hello(topo.nodes[-1], topo.nodes[0], topo.spec.addr(nodes - 1))
        assert our_namespaces(tag) == []
    tag = f"{os.getpid()}bad"
    with pytest.raises(RuntimeError, match="failed"):
        with Topology(EmuSpec(nodes=2, rate="100mbit"), tag=tag) as topo:
            topo._shape(topo.nodes[0], "no-such-dev")
    assert our_namespaces(tag) == []


# A forked node agent's view of its node (netns.enter): run in the child, its answer on stdout
# (or into the file NODE_VIEW names).
_NODE_VIEW = """
import json, os, sys
out = open(os.environ["NODE_VIEW"], "w") if "NODE_VIEW" in os.environ else sys.stdout
print(json.dumps({"net": os.readlink("/proc/self/ns/net"), "ifaces": sorted(os.listdir("/sys/class/net")),
                  "hosts": open("/etc/hosts").read(), "comm": open("/proc/self/comm").read().strip(),
                  "sid": os.getsid(0) == os.getpid()}), file=out, flush=True)
"""


@pytest.mark.requires("root")
def test_a_forked_agent_sees_its_node_as_ip_netns_exec_shows_it(tmp_path):
    """An emulated node's agent forked from the emulator (forkrank.module + netns.enter) is where
    `ip netns exec` would put it: the node's network namespace, a /sys listing the node's
    interfaces (the NIC counters are read there), the node's hosts file over /etc/hosts, a
    session of its own, named fb-agent<N>; and the emulator's own view is unchanged."""
    from workloads.core import forkrank
    from workloads.fabric.netns import enter

    script = tmp_path / "view.py"
    script.write_text(_NODE_VIEW)
    tag = f"{os.getpid()}fa"
    with Topology(EmuSpec(nodes=2), tag=tag) as topo:
        want = subprocess.run(["ip", "netns", "exec", topo.nodes[1], sys.executable, "-c", _NODE_VIEW],
                              capture_output=True, text=True, check=True).stdout
        out = tmp_path / "out.json"
        p = forkrank.fork([sys.executable, str(script)], lambda: forkrank._run(
            lambda: exec(compile(script.read_text(), str(script), "exec"), {"__name__": "__main__"})),
            dict(os.environ, NODE_VIEW=str(out)), "fb-agent1", enter=lambda: enter(topo.nodes[1]))
        assert p.wait(timeout=60) == 0
    got, seen = json.loads(out.read_text()), json.loads(want)
    assert got["net"] == seen["net"] != os.readlink("/proc/self/ns/net")
    assert got["ifaces"] == seen["ifaces"] and "emu0" in got["ifaces"]
    assert got["hosts"] == seen["hosts"] and "fabricbench emulated nodes" in got["hosts"]
    assert got["comm"] == "fb-agent1" and got["sid"]
    assert "emu0" not in os.listdir("/sys/class/net")   # the mounts did not propagate back
    assert our_namespaces(tag) == []


# One emulation's side of test_concurrent_host_links_get_distinct_subnets: its namespaces built,
# it takes its host link when `go` appears and keeps it until `done` does.
_HOST_LINKER = """
import sys, time
from pathlib import Path
from workloads.fabric.netns import EmuSpec, Topology
tag, go, done = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
with Topology(EmuSpec(nodes=2), tag=tag) as topo:
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.001)
    try:
        topo._link_host()
        print(topo.host_addr, flush=True)
    except Exception as e:
        print(f"failed: {e}", flush=True)
    while not done.exists():
        time.sleep(0.05)
"""


@pytest.mark.requires("root")
def test_concurrent_host_links_get_distinct_subnets(tmp_path):
    """Six emulations take their host links at the same moment (as two test workers, or two
    users, may): each gets a /30 of its own, because the choice and the address are made under
    one flock (netns.HOST_LINK_LOCK). Without the lock (measured here, three tries) the six took
    one, two and two /30s between them."""
    go, done = tmp_path / "go", tmp_path / "done"
    tags = [f"{os.getpid()}lk{i}" for i in range(6)]
    procs = [subprocess.Popen([sys.executable, "-c", _HOST_LINKER, tag, str(go), str(done)], cwd=REPO,
                              env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in tags]
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready"] * len(procs), [p.stderr.read() for p in procs]
        go.touch()
        got = [p.stdout.readline().strip() for p in procs]
    finally:
        done.touch()
        errs = [p.communicate(timeout=60)[1] for p in procs]
    assert all(a.startswith("10.78.") and a.endswith(".2") for a in got), (got, errs)
    assert len({a.rsplit(".", 1)[0] for a in got}) == len(procs), got
    assert all(p.returncode == 0 for p in procs), errs
    assert not [n for tag in tags for n in our_namespaces(tag)]


@pytest.mark.requires("root")
@pytest.mark.slow
def test_timeout_is_124(tmp_path):
    """--timeout ran out (here while the agents still import): every agent stopped, the namespaces
    removed, exit 124 as coreutils' timeout says it (docs/reliability.md's exit codes)."""
    p = subprocess.run(EMULATE + ["--timeout", "1", "launch/collectives.py", "fabric=emu-100m", f"output_root={tmp_path}"],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 124, p.stderr[-3000:]
    assert "error: emulated run exceeded 1s; stopping all agents" in p.stderr and "Traceback" not in p.stderr
    assert not list(tmp_path.rglob("records/*.json"))


@pytest.mark.requires("root")
@pytest.mark.slow
@pytest.mark.parametrize("args,spaces", [(["fabric=emu-100m"], 2),
                                         (["fabric=emu-leafspine", "fabric.emulate.nodes=2"], 6)],  # + 2 leaves, 2 spines
                         ids=["pair", "leaf-spine"])
def test_sigterm_removes_namespaces(tmp_path, args, spaces):
    p = subprocess.Popen(EMULATE + ["launch/train.py", *args, f"output_root={tmp_path}"], cwd=REPO,
                         env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = str(p.pid)
    deadline = time.monotonic() + 60
    while len(our_namespaces(tag)) < spaces and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert len(our_namespaces(tag)) == spaces, p.stderr.read() if p.poll() is not None else "namespaces never appeared"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "namespaces removed" in err
    assert "Traceback" not in err, err[-3000:]  # the agents stop quietly; the emulator says it once
    assert our_namespaces(tag) == []


@pytest.mark.requires("root")
@pytest.mark.slow
def test_ctrl_c_of_an_emulated_run_is_one_line(tmp_path):
    """Ctrl-C in a terminal signals the whole foreground group: emulator, agents and ranks.
    Each agent's torchrun then raised SignalException with its traceback (80 lines)."""
    p = subprocess.Popen(EMULATE + ["launch/train.py", "fabric=emu-100m", f"output_root={tmp_path}",
                                    "train.steps=400"], cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 90
    while not list(tmp_path.rglob("*.inflight")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)  # the point is being measured once its in-flight copy exists
    # the nodes' agents are forks of the emulator (forkrank.module, netns.enter: its command line,
    # not `python -m workloads.commands.emulate --agent`), and their ranks forks of them
    try:
        agents = _children(p.pid)
        mine = Path(f"/proc/{p.pid}/cmdline").read_bytes()
        assert len(agents) == 2 and all(Path(f"/proc/{a}/cmdline").read_bytes() == mine for a in agents), agents
        ranks = {a: list(_children(a).values()) for a in agents}
        assert sorted(n for names in ranks.values() for n in names) == ["fb-rank0", "fb-rank1"], ranks
    finally:
        os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=90)
    assert p.returncode == 130 and "namespaces removed" in err, err[-3000:]
    assert "Traceback" not in err + out, err[-3000:]
    assert our_namespaces(str(p.pid)) == []
    # the point being measured is kept as an interrupted (failed) record
    assert [(r["status"], r["error"]) for r in records_in(tmp_path)] == [("failed", "interrupted (Ctrl-C or SIGTERM)")]


def _children(pid: int) -> dict[int, str]:
    """pid -> name (comm) of each child of `pid`."""
    out = {}
    for kid in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            out[int(kid)] = Path(f"/proc/{kid}/comm").read_text().strip()
        except OSError:
            pass
    return out


def _study_records(out) -> list[dict]:
    return records_in(out / "emu-ab")


@pytest.mark.timing  # a study's verdict
@pytest.mark.requires("root")
@pytest.mark.slow
def test_training_is_slower_on_100mbit_than_unshaped(emu_ab):
    """Tiny training across two namespaces, three runs on each link (the emulated A/B study of
    tests/conftest.py, which calls the verdict; here: what each run recorded)."""
    every = [r for r in _study_records(emu_ab[0]) if r["workload"] == "pretrain"]
    assert sorted(r["fabric"]["name"] for r in every) == ["emu-100m"] * 3 + ["emu-veth"] * 3
    for r in every:
        assert r["status"] == "ok" and r["world"]["nodes"] == 2 and r["world"]["world_size"] == 2
        assert r["fabric"]["env"]["GLOO_SOCKET_IFNAME"] == "emu0"
        assert r["config"]["fabric"]["emulate"]["rate"] == ("100mbit" if r["fabric"]["name"] == "emu-100m" else None)
    # ~1.5 MB of gradients per step cross the link: >= 120 ms at 100 Mbit/s, a few ms unshaped.
    # Judged as the study judges it, on the blocks' paired log-ratios (analysis/compare.py): raw
    # extremes across runs measure the machine's load (an unshaped run on a loaded machine ranged
    # 78-158 samples/s), which the interleaved blocks cancel.
    from analysis.compare import compare_table
    from analysis.load import load_table

    res = compare_table(load_table([str(emu_ab[0] / "emu-ab")]), "emu-veth")
    (c,) = [c for _, c in res.comparisons if c.metric == "samples_per_sec" and c.arm == "emu-100m"]
    assert c.blocks == 3 and c.significant and c.hi < 1 and c.ratio < 0.8, c.verdict


@pytest.mark.timing  # a measured rate against the line rate
@pytest.mark.requires("root")
@pytest.mark.slow
def test_all_reduce_busbw_matches_100mbit_link(emu_ab):
    """2 ranks: busbw = algbw x 2(n-1)/n = S/t, and each rank sends S bytes per all_reduce,
    so busbw is the link's payload rate: 100e6/8 B/s x (1448 payload / 1514 frame bytes)
    = 0.01195 GB/s. tbf counts whole frames. No run is above the link, and two of three are
    within 15% of it (one of five timed 1 MiB all_reduces losing a scheduling slice on a shared
    2-core machine costs ~20% of that run; the study test holds the median to 10%)."""
    recs = [r for r in _study_records(emu_ab[0]) if r["workload"] == "collectives" and r["fabric"]["name"] == "emu-100m"]
    assert len(recs) == 3
    link = 100e6 / 8 * 1448 / 1514 / 1e9
    busbw = sorted(rec["metrics"]["avg_busbw(GB/s)"] for rec in recs)
    assert busbw[-1] <= 1.05 * link and sum(abs(b - link) <= 0.15 * link for b in busbw) >= 2, (busbw, link)
