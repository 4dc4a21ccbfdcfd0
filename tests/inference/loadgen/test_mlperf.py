"""The mlperf load mode (workloads/inference/loadgen/mlperf.py): MLPerf's real LoadGen driving the
reference engine over its OpenAI endpoint. One engine (launch/serve.py, one rank) is started for the
module and every LoadGen run below is sent to it (server=external), so the engine starts once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, wait_healthy
from workloads.core.errors import UsageError
from workloads.core.ports import free_port
from workloads.inference.loadgen.mlperf import MlperfSettings, settings

TINY = ["load.dataset.input_len=16", "load.dataset.output_len=6"]


def _infer(*overrides, timeout=240):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0", WANDB_MODE="offline")
    return subprocess.run([sys.executable, str(REPO / "launch" / "infer.py"), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "launch/serve.py",
           "model=neox-tiny", "fabric=loopback", "server.host=127.0.0.1", f"server.port={port}", f"output_root={log.parent}"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, "reference engine", 240, 1)
    yield url
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def _run(engine, out, name, *extra):
    r = _infer("server=external", f"server.url={engine}", f"output_root={out}", f"run_id={name}", "load=mlperf", *TINY,
               *extra)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (path,) = sorted((out / name / "records").glob("*.json"))
    return json.loads(path.read_text()), path


@pytest.mark.slow  # starts the reference engine
def test_loadgen_offline_and_server_against_the_reference_engine(engine, tmp_path):
    for name, extra in (("off", ["load.scenario=Offline", "load.points=[400]"]),
                        ("srv", ["load.scenario=Server", "load.points=[12]", "load.mlperf.latency_percentile=90",
                                 "load.mlperf.min_duration_ms=3000", "load.mlperf.min_query_count=48"])):
        rec, path = _run(engine, tmp_path, name, *extra)
        lg = rec["mlperf"]
        assert rec["status"] == "ok" and lg["result"] == "VALID" and lg["failed"] == [], lg
        assert lg["metric"] == "tokens_per_sec" and lg["scenario"] == extra[0].split("=")[1]
        # (early stopping at p90 with no query over its constraint passes from 44 queries on)
        # LoadGen's tokens/s and the project's own output throughput, measured on the same requests
        ours, theirs = rec["metrics"]["output_throughput"], rec["metrics"]["mlperf_tokens_per_sec"]
        assert abs(theirs / ours - 1) < 0.05, (theirs, ours)
        logs = path.parent / lg["logs"]
        assert (logs / "mlperf_log_summary.txt").is_file() and (logs / "mlperf_log_detail.txt").is_file()
        assert "target_qps" in (logs / "overrides.user.conf").read_text()
        assert rec["metrics"]["completed"] == lg["summary"]["result_query_count"] or name == "off"


@pytest.mark.slow  # starts the reference engine
def test_a_too_tight_latency_constraint_is_invalid_and_named(engine, tmp_path):
    rec, _ = _run(engine, tmp_path, "tight", "load.scenario=Server", "load.points=[6]", "load.mlperf.ttft_latency_ms=1",
                  "load.mlperf.latency_percentile=90", "load.mlperf.min_query_count=24")
    assert rec["mlperf"]["result"] == "INVALID" and "latency constraint" in rec["mlperf"]["failed"]
    assert rec["status"] == "ok"  # it ran as asked; LoadGen's verdict is the record's mlperf.result


def test_bad_settings_are_one_line(tmp_path):
    with pytest.raises(UsageError, match="LoadGen has it, but"):
        MlperfSettings("SingleStream")
    with pytest.raises(UsageError, match="no such scenario"):
        MlperfSettings("Batch")
    with pytest.raises(UsageError, match="whole number of ms"):
        MlperfSettings("Server", ttft_latency_ms=0.5)
    bad = tmp_path / "user.conf"
    bad.write_text("this is not a setting\n")
    with pytest.raises(UsageError, match="LoadGen rejected it"):
        settings(MlperfSettings("Server", user_conf=str(bad)), 4.0, tmp_path)
    ts = settings(MlperfSettings("Server", min_duration_ms=1500, ttft_latency_ms=20), 3.0, tmp_path)
    # LoadGen's mlperf.conf for llama2-70b, then ours: target 3 QPS, 1.5 s, TTFT 20 ms, TPOT still 200 ms
    assert (ts.server_target_qps, ts.min_duration_ms, ts.ttft_latency, ts.tpot_latency) == (3.0, 1500, 20_000_000, 200_000_000)


def test_bad_scenario_from_the_command_line_is_one_line(tmp_path):
    r = _infer("server=external", "server.url=http://127.0.0.1:9", f"output_root={tmp_path}", "load=mlperf",
               "load.scenario=Batch", timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: load.scenario='Batch'")
    assert "Traceback" not in r.stderr and not list(Path(tmp_path).rglob("*.json"))
