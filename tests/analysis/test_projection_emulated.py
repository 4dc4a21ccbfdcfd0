"""The projection checked where the truth is known (root): emulated nodes in a star, tbf at 10
Mbit/s on every node's link, so the bus bandwidth of a ring is the TCP payload ceiling, 10e6 x
1448/1514 / 8 = 1.1955 MB/s. The latency half of the truth (a 2 ms delay line per link: one 8 ms
round trip per ring step) is asserted on the calibration's latency floor (the fastest of many
calls), not on the block-timed alpha: while this suite's other workers loaded the 2 cores, the
line (one process for every link) let frames wait up to 835 ms (its own p99, in the record) even
at 2 nodes, and a check of alpha then measures the host.

tools/projection_grid.py sweeps all_reduce and all_gather at 2, 4 and 8 nodes (64 KiB-512 KiB here:
at 10 Mbit/s the 8-node 4 MiB all_reduce alone takes 6 s a call; docs/projection.md has the whole
grid, 10 and 100 Mbit/s, 0 and 2 ms, up to 16 MiB, from a run of the tool); a calibration fitted on 2
and 4 must find the rate and hold the 8-node cells inside its 90% intervals. The 8-node check runs
without a delay line: with 8 nodes the line (one process, every link) fell behind on this shared
2-core host while another job's line ran (p99 406 ms where 2 ms was asked), and then measures the
host, not the model. Beside it a 2-node and a 4-node neox-tiny DDP run on the same fabric
(communication-bound: ~85% of each step has a gradient all_reduce in flight): the 2-node run's
trace is replayed alone, and its step time is projected to 4 nodes. The assertions depend on
measured speed: `timing`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import projection as pj
from helpers import REPO, child_env, cpu_share
from workloads.core.records import iter_records

pytestmark = [pytest.mark.requires("root"), pytest.mark.slow, pytest.mark.timing]

EMU = ["fabric=emu-100m", "fabric.emulate.rate=10mbit", "fabric.emulate.burst=16384", "+fabric.emulate.topology=star"]
PAYLOAD = 10e6 * 1448 / 1514 / 8      # B/s


def _emulate(nodes: int, entry: str, *overrides: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(REPO / "launch" / "emulate.py"), "--nodes", str(nodes), entry, *EMU,
                        *overrides], cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grid")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "projection_grid.py"), str(out), "--settings",
                        "10mbit/0", "--minbytes", "64K", "--maxbytes", "512K", "--stepfactor", "2", "--json", str(out / "grid.json")],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out / "10mbit-0"


@pytest.fixture(scope="module")
def calibration(grid) -> dict:
    return pj.fit([(p, r) for n in (2, 4) for p, r in iter_records(grid / f"n{n}", "**/records/*.json")], boot=200)


@pytest.fixture(scope="module")
def training(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("train")
    recs = {}
    for n in (2, 4):
        _emulate(n, "launch/train.py", "train.steps=8", "train.warmup_steps=2", f"output_root={out}", f"run_id=t{n}",
                 "+fabric.env.TORCH_FR_BUFFER_SIZE=2000",  # the Flight Recorder too: both traces of one run
                 # the grid's fabric (tools/projection_grid.py): a step is projected with its own fabric's calibration
                 "+fabric.emulate.sysctls={net.ipv4.tcp_slow_start_after_idle:0}")
        (rec,) = [r for _, r in iter_records(out / f"t{n}", "records/*.json")]
        recs[n] = rec | {"_path": str(next((out / f"t{n}" / "records").glob("*.json")))}
    return recs


def test_the_fit_finds_the_emulated_rate(calibration):
    ar = calibration["ops"]["all_reduce"]
    # the bus bandwidth of a large all_reduce is the link's TCP payload ceiling (measured 91-100%)
    assert abs(ar["bandwidth_GBps"] * 1e9 / PAYLOAD - 1) <= 0.10, (ar["bandwidth_GBps"], cpu_share.state())
    assert calibration["ops"]["all_gather"]["bandwidth_GBps"] * 1e9 <= 1.05 * PAYLOAD   # never above the wire


def test_eight_nodes_fall_inside_the_projected_intervals(grid, calibration):
    rows = pj.check_against(calibration, list(iter_records(grid / "n8", "**/records/*.json")))
    assert len(rows) == 8 and {r["label"] for r in rows} == {"extrapolated"}
    inside = sum(r["inside"] for r in rows)
    errors = sorted(r["abs_error"] for r in rows)
    median = (errors[3] + errors[4]) / 2
    detail = [(r["op"], r["size"], round(r["measured_s"], 4), round(r["low_s"], 4), round(r["high_s"], 4)) for r in rows]
    assert inside >= 0.85 * len(rows) and median <= 0.10, (pj.check_summary(rows), detail, cpu_share.state())
    # the CLI says the same from the same records
    cal = grid / "cal.json"
    cal.write_text(json.dumps(calibration))
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", "check", str(cal), str(grid / "n8")],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and pj.check_summary(rows) in r.stdout, r.stderr


def test_a_replayed_trace_reproduces_the_runs_communication_time(training, tmp_path):
    rec = training[2]
    out = tmp_path / "replay"
    _emulate(2, "launch/replay.py", f"replay.trace={rec['_path']}", "replay.steps=6", f"output_root={out}",
             "run_id=r2")
    (rp,) = [r for _, r in iter_records(out / "r2", "records/*.json")]
    m = rp["metrics"]
    assert rp["replay"]["source"] == "record" and m["calls_per_step"] >= 1
    assert m["original_comm_time_per_step(s)"] == pytest.approx(
        sum(rec["samples"]["comm_time_s"][2:8]) / 6, rel=1e-9)          # the captured run's own, same steps
    assert abs(m["replay_vs_original"] - 1) <= 0.15, (m, cpu_share.state())
    # the same run's Flight Recorder dump (every collective since the group started: the setup's
    # broadcasts too) holds the gradient bucket the record's trace replayed
    from workloads.replay.trace import load

    fr = load(rec["comm"]["flight_recorder"])
    bucket = rec["samples"]["comm_calls"][0][0][2]
    assert fr.source == "flight-recorder" and fr.world == 2
    assert sum(1 for c in fr.steps[0] if c.op == "all_reduce" and c.numel == bucket) == 8   # one per step


def test_the_four_node_step_is_projected_from_two_inside_its_interval(training, calibration):
    two, four = training[2], training[4]
    assert two["metrics"]["comm_share"] > 0.8                            # communication-bound, as the model needs
    sp = pj.project_step(calibration, two, 4)
    measured = four["metrics"]["iteration_time(s)"]
    assert sp.low_s <= measured <= sp.high_s, (pj.step_line(sp), measured, cpu_share.state())


def test_the_latency_floor_recovers_the_configured_round_trip(tmp_path):
    """2 ms one way on every node's link of a star: node to node is two links, 4 ms one way, and a
    Gloo ring step on an idle pair is a round trip (the receiver announces its receive, then the
    data comes: gloo/transport/tcp/pair.cc), 8 ms, plus the host's least cost of a step (0.2-0.4
    ms measured without a line). The calibration's latency floor (the fastest of 40 calls of 1
    KiB, less its bytes) must be within 10% of the round trip the line achieved (4 x its median
    delay, in the record); the block-timed alpha, which holds every scheduling delay of a 2-core
    host under load, is not asserted (docs/projection.md, "Latency")."""
    out = tmp_path / "lat"
    _emulate(2, "launch/collectives.py", "fabric.emulate.latency=2ms",
             "+fabric.emulate.sysctls={net.ipv4.tcp_slow_start_after_idle:0}", "collectives.ops=[all_reduce,all_gather]",
             "collectives.minbytes=1K", "collectives.maxbytes=4K", "collectives.stepfactor=4", "collectives.iters=3",
             "collectives.warmup_iters=2", "collectives.sample_iters=40", f"output_root={out}", "run_id=lat")
    recs = list(iter_records(out / "lat", "records/*.json"))
    (rec,) = [r for _, r in recs]
    p50 = [d["p50_us"] for link in rec["fabric"]["delay"]["links"].values() for d in link["directions"].values()]
    round_trip = 4 * sorted(p50)[len(p50) // 2] / 1e6
    floors = {op: pj.latency_floor(recs, op, 1 / PAYLOAD)["2"]["alpha_floor_s"] for op in ("all_reduce", "all_gather")}
    assert abs(min(floors.values()) / round_trip - 1) <= 0.10, (floors, round_trip, cpu_share.state())
