"""A real tune on an emulated link (root): conf/tune/emu-buffers.yaml, socket buffers under the
delay line, as a user runs it. One tune (8 runs: search 2, confirmation 6) serves every check:
the plan before the first run, the confirmed winner and its interval, the settings in every
run's fingerprint, the derived arm, and a resume that repeats no finished run. A second tune
(8 runs) carries every kind of setting (env, overrides, sysctls) into one confirmation, and a
confirmation left without a comparable pair fails naming why."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from helpers import REPO, child_env, need

TUNE = [sys.executable, "-m", "workloads.commands.cli", "tune", "emu-buffers"]
AUTOTUNE = {"sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456"}}


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory):
    need("root")
    out = tmp_path_factory.mktemp("tune") / "results"
    r = subprocess.run([*TUNE, "--output-root", str(out)], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return out / "emu-buffers", r


def records(folder):
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/*/records/*.json"))]


@pytest.mark.timing  # a verdict on measured speed
@pytest.mark.requires("root")
@pytest.mark.slow
def test_the_tune_confirms_autotuning_over_a_capped_buffer(tuned_run):
    folder, r = tuned_run
    out = r.stdout
    # the plan, with its number of runs, before the first run
    assert out.startswith("plan of tune emu-buffers: 8 runs = search 2 + confirmation 6"), out[:400]
    assert out.index("plan of tune") < out.index("[1/2] block 0")
    line = next(x for x in out.splitlines() if x.startswith("tune emu-buffers: "))
    assert line.startswith("tune emu-buffers: winner autotune: throughput_received(Gbit/s) at least +"), line
    assert line.endswith("chosen among 2") and "search had no round of two complete blocks" in out, line
    # the confirmation's interval excludes 0 by far: a 16 KiB window at 20 ms moves ~3 Mbit/s
    lo = float(line.split("at least ", 1)[1].split("%")[0])
    assert lo > 100, line
    doc = yaml.safe_load((folder / "tuned.yaml").read_text())
    assert doc["tune"]["outcome"] == "winner" and doc["tune"]["candidate"] == "autotune"
    assert doc["settings"] == AUTOTUNE and doc["fabric"] == "emu-100m"
    assert not (folder / "nccl-tuner.conf").exists()  # no NCCL setting: NCCL's tuner format does not fit
    recs = records(folder)
    assert len(recs) == 8 and all(x["status"] == "ok" for x in recs)
    for x in recs:
        tuned = x["fingerprint"]["tuned"]
        assert tuned["tune"] == "emu-buffers" and tuned["candidate"] == x["study"]["arm"]
        want = AUTOTUNE if x["study"]["arm"] == "autotune" else {}
        assert tuned["settings"] == want, tuned
        # and the namespaces ran with it: what the emulator was asked to set is the arm's
        cap = "4096 131072 6291456" if want else "4096 16384 16384"
        assert x["config"]["fabric"]["emulate"]["sysctls"] == {"net.ipv4.tcp_rmem": cap}
    # the search's runs are the search's: the confirmation ran on fresh blocks of its own
    assert sorted({x["study"]["id"] for x in recs}) == ["confirm", "search-1"]


@pytest.mark.timing  # shares the tune with the verdict above: one group, one worker, one launch
@pytest.mark.requires("root")
@pytest.mark.slow
def test_an_interrupted_tune_resumes_without_repeating_finished_runs(tuned_run):
    folder, _ = tuned_run
    before = {p: p.stat().st_mtime_ns for p in folder.glob("*/*/records/*.json")}
    again = subprocess.run([*TUNE, "--output-root", str(folder.parent)], cwd=REPO, env=child_env(), capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0 and "] block " not in again.stdout, again.stdout[-3000:]
    assert {p: p.stat().st_mtime_ns for p in folder.glob("*/*/records/*.json")} == before
    # a confirmation run that never finished (its folder gone): only it runs again
    last = max(folder.glob("confirm/confirm-*-t2-iperf"), key=lambda p: p.stat().st_mtime)
    shutil.rmtree(last)
    third = subprocess.run([*TUNE, "--output-root", str(folder.parent)], cwd=REPO, env=child_env(), capture_output=True,
                           text=True, timeout=900)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-2000:]
    assert third.stdout.count("] block ") == 1 and "5 of 6 runs already recorded" in third.stdout, third.stdout[-3000:]
    assert len(records(folder)) == 8
    assert "tune emu-buffers: winner autotune: throughput_received(Gbit/s) at least +" in third.stdout


# Every kind of setting in one confirmation, among them a Hydra key that the record repeats in a
# section of its own (collectives.op: config.collectives.op and collectives.op), which once left
# every confirmation of such a key without a comparable pair. The candidate's sysctls lift a
# 16 KiB receive-buffer cap under a 20 ms round trip (the effect the search must find); its env
# and override ride along. A `space:` candidate is built into the same settings (test_tune.py).
# 8 runs: search 2, confirmation 6 (3 blocks).
KINDS = """name: kinds
arm:
  fabric: emu-100m
  overrides: [fabric.emulate.latency=10ms,
              "+fabric.emulate.sysctls={net.ipv4.tcp_rmem:'4096 16384 16384'}"]
workloads:
  - {name: ar, entry: collectives, overrides: ["collectives.ops=[all_reduce]", collectives.minbytes=64K,
                                               collectives.maxbytes=64K, collectives.iters=2, collectives.warmup_iters=1,
                                               collectives.sample_iters=0]}
candidates:
  - {name: every-kind, env: {NCCL_DEBUG: WARN}, overrides: {collectives.op: max},
     sysctls: {net.ipv4.tcp_rmem: "4096 131072 6291456"}}
confirm: {blocks: 3}
detect: 200%
cv: 10%
"""
EVERY_KIND = {"env": {"NCCL_DEBUG": "WARN"}, "overrides": {"collectives.op": "max"},
              "sysctls": {"net.ipv4.tcp_rmem": "4096 131072 6291456"}}


@pytest.fixture(scope="module")
def kinds_run(tmp_path_factory):
    need("root")
    base = tmp_path_factory.mktemp("kinds")
    (base / "kinds.yaml").write_text(KINDS)
    cmd = [sys.executable, "-m", "workloads.commands.cli", "tune", str(base / "kinds.yaml"), "--output-root",
           str(base / "results")]
    r = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return base / "results" / "kinds", r, cmd


@pytest.mark.timing  # a verdict on measured speed
@pytest.mark.requires("root")
@pytest.mark.slow
def test_a_tune_over_every_kind_of_setting_confirms(kinds_run):
    folder, r, _ = kinds_run
    line = next(x for x in r.stdout.splitlines() if x.startswith("tune kinds: "))
    assert line.startswith("tune kinds: winner every-kind: ") and line.endswith("chosen among 2"), r.stdout[-3000:]
    doc = yaml.safe_load((folder / "tuned.yaml").read_text())
    assert doc["tune"]["outcome"] == "winner" and doc["settings"] == EVERY_KIND
    recs = records(folder)
    assert len(recs) == 8 and all(x["status"] == "ok" for x in recs)
    confirm = [x for x in recs if x["study"]["id"] == "confirm"]
    assert sorted(x["study"]["arm"] for x in confirm) == ["default"] * 3 + ["every-kind"] * 3
    for x in confirm:  # each kind reached the run: the override in both places, env and sysctls in the fabric
        mine = x["study"]["arm"] == "every-kind"
        assert x["collectives"]["op"] == x["config"]["collectives"]["op"] == ("max" if mine else "sum")
        assert (x["config"]["fabric"]["env"].get("NCCL_DEBUG") == "WARN") == mine
        assert (x["config"]["fabric"]["emulate"]["sysctls"]["net.ipv4.tcp_rmem"] == "4096 131072 6291456") == mine


@pytest.mark.timing  # shares the tune above
@pytest.mark.requires("root")
@pytest.mark.slow
def test_a_confirmation_without_a_comparable_pair_says_why_and_fails(kinds_run):
    folder, _, cmd = kinds_run
    # a default run of the confirmation that measured another root than its partner: the pair is
    # no longer apples to apples, every run is still recorded and ok, so nothing is left to run
    kept = {p: p.read_text() for p in folder.glob("confirm/*/records/*.json")}
    before = (folder / "tuned.yaml").read_text()
    for p, text in kept.items():
        x = json.loads(text)
        if x["study"]["arm"] == "default":
            x["collectives"]["root"] = 1
            p.write_text(json.dumps(x))
    try:
        again = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    finally:
        for p, text in kept.items():
            p.write_text(text)
    out = again.stdout.strip().splitlines()
    assert again.returncode == 1 and "] block " not in again.stdout, again.stdout[-3000:] + again.stderr[-2000:]
    assert out[-1].startswith("error: tune kinds: the confirmation of every-kind reached no verdict: compare refuses "
                              "the pair: ") and "collectives.root (1 vs 0)" in out[-1], out[-1]
    assert (folder / "tuned.yaml").read_text() == before
