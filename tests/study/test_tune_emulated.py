"""A real tune on an emulated link (root): conf/tune/emu-buffers.yaml, socket buffers under the
delay line, as a user runs it. One tune (8 runs: search 2, confirmation 6) serves every check:
the plan before the first run, the confirmed winner and its interval, the settings in every
run's fingerprint, the derived arm, and a resume that repeats no finished run."""

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
