"""Fault schedules on the emulated fabric (workloads/fabric/faults.py): the schedule's checks, the
links it names, the step-clock figures on worked values, and, as root, a real 2 s flap of one
node's link during 4-rank training on the emulated leaf-spine (stall, recovery, outcome; nothing
left behind), the same cut short by Ctrl-C, and bad input refused before any namespace exists."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import REPO, child_env, records_in
from workloads.core.errors import UsageError
from workloads.fabric import faults
from workloads.fabric.netns import EmuSpec, leftovers

EMULATE = [sys.executable, str(REPO / "launch" / "emulate.py")]
LEAFSPINE = EmuSpec.from_config({"nodes": 4, "topology": "leaf-spine", "rate": "100mbit", "uplink_rate": "100mbit"})


def test_schedule_is_checked_item_by_item():
    assert faults.parse([{"link": "n1", "at": 2, "down": 2}]) == (faults.Fault("n1", 2.0, 2.0),)
    got = faults.parse([{"link": "l0-s1", "at": 1, "rate": "25%", "for": 3}])[0]
    assert got.kind == "rate" and got.seconds == 3.0
    for bad, says in [([{"link": "n1", "at": 2}], "give either down"),
                      ([{"link": "n1", "at": 2, "down": 2, "rate": "5%", "for": 1}], "give either down"),
                      ([{"link": "n1", "at": -1, "down": 2}], "at must be >= 0"),
                      ([{"link": "n1", "at": 1, "rate": "150%", "for": 1}], "between 0% and 100%"),
                      ([{"link": "n1", "at": 1, "down": 1, "when": 3}], "unknown keys ['when']"),
                      ("n1", "give a list")]:
        with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("]", r"\]")):
            faults.parse(bad)


def test_links_are_the_topologys_and_a_flap_must_fit_the_run():
    assert faults.ends(LEAFSPINE, "n3", "7") == [("fb-7-3", "emu0", "100mbit"), ("fb-7-l1", "h3", "100mbit")]
    assert faults.ends(LEAFSPINE, "l1-s0", "7") == [("fb-7-l1", "u0", "100mbit"), ("fb-7-s0", "d1", "100mbit")]
    with pytest.raises(UsageError, match="names link 'n7', which this topology does not have; its links: n0, n1, n2, n3, l0-s0"):
        faults.check(faults.parse([{"link": "n7", "at": 1, "down": 1}]), LEAFSPINE, 600)
    with pytest.raises(UsageError, match="a flap longer than the run"):
        faults.check(faults.parse([{"link": "n1", "at": 5, "down": 30}]), LEAFSPINE, 20)
    unshaped = EmuSpec.from_config({"nodes": 2})
    with pytest.raises(UsageError, match="the link is unshaped"):
        faults.check(faults.parse([{"link": "n1", "at": 1, "rate": "50%", "for": 1}]), unshaped, 600)


def test_a_link_goes_down_at_one_end_and_a_rate_drop_holds_both_ways():
    down = faults._commands(LEAFSPINE, faults.Fault("n1", 0, 2.0), "7", apply=True)
    assert down == [["ip", "-n", "fb-7-l0", "link", "set", "dev", "h1", "down"]]  # the switch's port
    up = faults._commands(LEAFSPINE, faults.Fault("l0-s1", 0, 2.0), "7", apply=False)
    assert up == [["ip", "-n", "fb-7-l0", "link", "set", "dev", "u1", "up"]]      # the leaf's end
    slow = faults._commands(LEAFSPINE, faults.Fault("l0-s1", 0, None, "25%", 3.0), "7", apply=True)
    assert [c[2] for c in slow] == ["fb-7-l0", "fb-7-s1"] and all("25000000bit" in c for c in slow)
    back = faults._commands(LEAFSPINE, faults.Fault("l0-s1", 0, None, "25%", 3.0), "7", apply=False)
    assert all("100000000bit" in c for c in back)


def test_step_clock_figures_worked_value():
    # steps of 0.2 s; the link is down over [1.0, 3.0]: the step starting at 0.8 takes 2.6 s (it
    # ends at 3.4, past the restore), the next 0.3 s (not yet within 5%), then 0.2 s again
    times = [0.2, 0.2, 0.2, 0.2, 2.6, 0.3, 0.2, 0.2]
    starts, t = [], 0.0
    for x in times:
        starts.append(t)
        t += x
    ev = [{"applied_s": 1.0, "restored_s": 3.0}]
    got = faults.summarize(ev, starts, times)
    assert got["baseline_step_s"] == pytest.approx(0.2) and got["steps_before"] == 4 and got["steps_during"] == 1
    assert got["stall_s"] == pytest.approx(2.4 + 0.1)          # (2.6 - 0.2) + (0.3 - 0.2)
    assert got["degraded_throughput"] == pytest.approx(0.2 / 2.6)
    assert got["recovery_s"] == pytest.approx(3.9 - 3.0)       # the 0.2 s step from 3.7 ends at 3.9
    assert got["recovered"] and not got["zero_impact"]
    assert faults.summarize([{"applied_s": None, "restored_s": None}], starts, times)["stall_s"] is None


def test_injector_applies_on_the_window_and_restores_what_the_run_cut_short(tmp_path, monkeypatch):
    """The thread's order and its restore on the way out (the commands themselves run as root
    below; here they are collected, as `run` is the boundary the schedule drives)."""
    monkeypatch.setenv("FB_T0", str(time.time()))
    ran = []
    inj = faults.Injector(LEAFSPINE, faults.parse([{"link": "n1", "at": 0.05, "down": 30}]), "7", tmp_path / "f",
                          run=lambda argv: ran.append(argv[-1]))
    with inj:
        monkeypatch.setenv(faults.FAULTS_ENV, str(tmp_path / "f"))
        faults.window_started(time.time())
        deadline = time.monotonic() + 10
        while not ran and time.monotonic() < deadline:
            time.sleep(0.01)
    assert ran == ["down", "up"]  # up: restored on leaving, the run ended inside the fault
    assert inj.outlasted() == ["n1 down 30 s, 0.05 s into the timed steps: the run ended while it lasted"]
    ev = json.loads((tmp_path / "f" / "events.json").read_text())[0]
    assert ev["applied_s"] is not None and ev["restored_late"] is True


def test_a_run_without_faults_leaves_no_folder(tmp_path):
    # every emulated run enters the injector; one with no schedule makes nothing and writes nothing
    with faults.Injector(LEAFSPINE, (), "7", tmp_path / "f", run=lambda argv: None) as inj:
        assert inj.env() == {}
    assert not (tmp_path / "f").exists()


def test_bad_fault_is_one_line_before_any_namespace(tmp_path):
    p = subprocess.run(EMULATE + ["launch/train.py", "fabric=emu-leafspine", f"output_root={tmp_path}",
                                  "+fabric.emulate.faults=[{link: l0-s5, at: 1, down: 2}]"],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "names link 'l0-s5', which this topology does not have" in p.stderr
    assert not any(tmp_path.iterdir())


def _ours(pid: int) -> list[str]:
    return [n for n in leftovers() if n.startswith(f"fb-{pid}-")]


@pytest.mark.requires("root")
@pytest.mark.slow
def test_a_2s_flap_during_4_rank_training_stalls_recovers_and_completes(tmp_path):
    p = subprocess.Popen(EMULATE + ["launch/train.py", "fabric=emu-leafspine", f"output_root={tmp_path}",
                                    "train.steps=40", "train.warmup_steps=2",
                                    "+fabric.emulate.faults=[{link: n1, at: 1, down: 2}]"],
                         cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    (rec,) = records_in(tmp_path)
    f = rec["fault"]
    assert rec["status"] == "ok" and f["outcome"] == "completed"
    ev = f["events"][0]
    assert ev["problem"] is None and ev["restored_s"] - ev["applied_s"] == pytest.approx(2.0, abs=0.2)
    # the job waited at least the 2 s the link was away, and got back to its pace afterwards
    assert f["stall_s"] >= 1.5 and f["recovered"] and f["recovery_s"] is not None
    assert f["degraded_throughput"] < 0.5 and f["zero_impact"] is False
    assert _ours(p.pid) == []


@pytest.mark.requires("root")
@pytest.mark.slow
def test_ctrl_c_inside_a_fault_leaves_nothing_behind(tmp_path):
    p = subprocess.Popen(EMULATE + ["launch/train.py", "fabric=emu-leafspine", f"output_root={tmp_path}",
                                    "train.steps=400", "+fabric.emulate.faults=[{link: l0-s0, at: 0.5, down: 60}]"],
                         cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    deadline = time.monotonic() + 120
    events = None
    while time.monotonic() < deadline and p.poll() is None:
        found = list(tmp_path.rglob("faults/events.json"))
        events = json.loads(found[0].read_text()) if found else None
        if events and events[0]["applied_s"] is not None:
            break
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=90)
    assert events and events[0]["applied_s"] is not None, err[-3000:]
    assert p.returncode == 130 and "namespaces removed" in err, err[-3000:]
    assert _ours(p.pid) == []
    left = subprocess.run(["pgrep", "-f", f"fb-{p.pid}-"], capture_output=True, text=True).stdout.split()
    assert left == []
    (rec,) = records_in(tmp_path)
    assert rec["status"] == "failed" and rec["fault"]["outcome"].startswith("failed: interrupted")


def test_nccl_failover_lines_and_a_ras_report_are_read(tmp_path):
    """Fixtures written from NCCL 2.30.7's own format strings (their headers cite file and line)."""
    import shutil

    from helpers import FIXTURES
    from workloads.fabric import nccl_failover

    src = FIXTURES / "nccl_logs" / "nccl_2.30_port_failover"
    one = nccl_failover.failover((src / "nccl.h1.7500.log").read_text())
    assert [e["event"] for e in one["events"]] == ["device_failed", "continued"]
    assert one["events"][0] == {"event": "device_failed", "device": 1, "recovery": True, "side": "send", "host": "h1",
                                "pid": 7500}
    assert one["recovered"] and not one["fatal"]
    two = nccl_failover.failover((src / "nccl.h2.7501.log").read_text())
    assert two["fatal"] and not two["recovered"] and two["events"][-1]["reason"] == "No functional devices left"
    report = nccl_failover.ras((src / "ras-stall.txt").read_text())
    assert report["groups"] == [{"group": 0, "comms": 1, "nodes": 2, "per_node": "1", "per_comm": 2, "in_group": 2,
                                 "status": "RUNNING", "errors": "INCOMPLETE"}]
    assert report["errors"] == ["INCOMPLETE"] and report["ok"] is False
    shutil.copytree(src, tmp_path / "nccl")
    rec = {}
    nccl_failover.stamp(rec, tmp_path)
    got = rec["nccl_failover"]
    assert got["devices_failed"] == 2 and got["fatal"] and list(got["ras"]) == ["ras-stall.txt"]
    nothing = {}
    nccl_failover.stamp(nothing, tmp_path / "elsewhere")
    assert nothing == {}
