"""Records that lose nothing: one redaction (credentials only, never a metric), strict
JSON, one record per trial, and `-m` on every entry point without extra flags."""

from __future__ import annotations

import io
import json
import math
import multiprocessing
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from helpers import child_env, records_in, run_entry, tmpfs
from workloads.core.records import finite, write_record
from workloads.core.redact import REDACTED, redact, redact_argv

HF = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"   # the shape of a Hugging Face token
AKIA = "AKIA" + "IOSFODNN7EXAMPLE"               # AWS's documented example access key id


def _training_keys() -> dict:
    from workloads.training.metrics import ModelShape, summarize_training

    s = summarize_training(step_times_s=[0.2, 0.1, 0.11, 0.12], warmup_steps=1, shape=ModelShape(8, 128, 2, 64, 1024, False),
                           world_size=2, peak_tflops=312.0, comm_times_s=[0.05, 0.02, 0.03, 0.02])
    return s.as_metrics() | {"final_loss": 6.9}


def _collectives_keys() -> dict:
    from workloads.collectives.harness import Cell, Row
    from workloads.collectives.run import metrics

    row = Row("all_reduce", 1024, 1024, 256, "float", "sum", -1, 2, Cell(50.0, 0.02, 0.02, 0), Cell(48.0, 0.021, 0.021, 0))
    return metrics([row], ["all_reduce"]) | {"p2p_min_latency(us)": 12.5, "p2p_peak_bw(MB/s)": 900.0,
                                             "p2p_peak_bibw(MB/s)": 1700.0}


def _inference_keys() -> dict:
    from workloads.inference.loadgen.client import RequestResult
    from workloads.inference.metrics import parse_slo, summarize

    res = [RequestResult(ok=True, prompt_len=16, output_len=6, output_tokens=6, output_tokens_from="usage",
                         ttft=0.01 * i, itl=[0.008] * 5, latency=0.05 + 0.01 * i, start=float(i), scheduled=float(i),
                         send_lag=0.0001) for i in range(1, 4)]
    return summarize(res, 1.0, parse_slo("ttft:500 tpot:50"))


@pytest.mark.parametrize("keys", [_training_keys, _collectives_keys, _inference_keys],
                         ids=["training", "collectives", "inference"])
def test_every_metric_key_survives_the_redactor(keys):
    metrics = keys()
    assert len(metrics) >= 5
    out = redact({"metrics": metrics})["metrics"]
    for k, v in metrics.items():
        assert out[k] == v or (isinstance(v, float) and math.isnan(v) and math.isnan(out[k])), k
        assert out[k] != REDACTED, k
    # Whatever the value, a metric's name is never a secret's.
    assert redact({k: "text" for k in metrics}) == {k: "text" for k in metrics}


def test_inference_throughput_is_a_number_not_redacted():
    m = _inference_keys()
    assert isinstance(redact(m)["total_token_throughput"], float) and m["total_token_throughput"] > 0


def test_credentials_are_redacted_wherever_they_appear():
    rec = redact({"env": {"WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567", "HF_TOKEN": HF,
                          "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                          "AWS_SESSION_TOKEN": "FwoGZXIvYXdzEJr", "NCCL_IB_HCA": "mlx5_0", "HF_HOME": "/models"},
                  "headers": {"Authorization": "Bearer abc.def"}, "password": "hunter2",
                  "note": f"downloaded with {HF} from a key {AKIA}",
                  "git": {"commit": "0123456789abcdef0123456789abcdef01234567"}, "max_tokens": 64,
                  "tokenizer": "/models/tok", "api_key": None})
    assert rec["env"] == {"WANDB_API_KEY": REDACTED, "HF_TOKEN": REDACTED, "AWS_SECRET_ACCESS_KEY": REDACTED,
                          "AWS_SESSION_TOKEN": REDACTED, "NCCL_IB_HCA": "mlx5_0", "HF_HOME": "/models"}
    assert rec["headers"] == {"Authorization": REDACTED} and rec["password"] == REDACTED
    assert HF not in rec["note"] and AKIA not in rec["note"] and rec["note"].startswith("downloaded with <redacted>")
    assert rec["git"]["commit"] == "0123456789abcdef0123456789abcdef01234567"  # a hash is not a credential
    assert rec["max_tokens"] == 64 and rec["tokenizer"] == "/models/tok" and rec["api_key"] is None
    # Hydra overrides, and a server's command line (flag and value, or flag=value).
    assert redact(["+fabric.env.HF_TOKEN=" + HF, "train.max_tokens=3", "fabric=roce"]) == [
        "+fabric.env.HF_TOKEN=<redacted>", "train.max_tokens=3", "fabric=roce"]
    line = redact_argv(["vllm", "serve", "m", "--api-key", "s3cret", "--hf-token=" + HF, "--tokenizer", "t",
                        "--max-num-seqs", "8"])
    assert line == "vllm serve m --api-key <redacted> --hf-token=<redacted> --tokenizer t --max-num-seqs 8"
    assert "abc.def" not in redact("curl -H 'Authorization: Bearer abc.def' http://x")


def test_one_redaction_for_wandb_config_and_hydra_error_line():
    from workloads.commands.entry import _report_job_error
    from workloads.core.loggers import record_to_wandb

    config, summary = record_to_wandb({"workload": "inference", "config": {"fabric": {"env": {"HF_TOKEN": HF}}},
                                       "overrides": ["+fabric.env.HF_TOKEN=" + HF],
                                       "metrics": {"total_token_throughput": 812.5}})
    assert HF not in repr(config) and summary["total_token_throughput"] == 812.5
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            raise RuntimeError(f"login failed for {HF}")
        except RuntimeError:
            _report_job_error(["+fabric.env.HF_TOKEN=" + HF, "trial=1"])
    text = err.getvalue()
    assert text.startswith("Error executing job with overrides: ['+fabric.env.HF_TOKEN=<redacted>', 'trial=1']")
    assert "RuntimeError: login failed for <redacted>" in text and HF not in text


def test_server_log_first_line_is_redacted(tmp_path):
    import sys

    from workloads.inference.adapters.base import Launch, ServerSpec
    from workloads.inference.adapters.orchestrator import ManagedServer

    spec = ServerSpec.from_config({"name": "reference", "host": "127.0.0.1", "port": 1, "tp": 1})
    launch = Launch(argv=[sys.executable, "-c", "pass", "--hf-token", HF], env={}, model_name="m")
    srv = ManagedServer(spec, launch, tmp_path, {})
    srv.start()
    srv.proc.wait(timeout=30)
    first = srv.log_path.read_text().splitlines()[0]
    assert first.endswith("-c pass --hf-token <redacted>") and HF not in srv.log_path.read_text()


def _strict(text: str):
    def refuse(c):
        raise ValueError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


def test_records_are_strict_json_with_a_reason_for_each_null(tmp_path):
    path = write_record(tmp_path, {"schema": "fabricbench.record/1", "status": "failed",
                                   "arrival": {"kind": "burst", "rate": math.inf},
                                   "metrics": {"x": float("nan"), "y": 1.5}}, "r")
    rec = _strict(path.read_text())
    assert rec["arrival"]["rate"] is None and rec["metrics"] == {"x": None, "y": 1.5}
    assert rec["null_reasons"] == {"arrival.rate": "inf is not a JSON number", "metrics.x": "nan is not a JSON number"}
    assert finite({"a": [1.0]}) == {"a": [1.0]}  # nothing to say: no null_reasons


def _record(trial: int) -> dict:
    return {"schema": "fabricbench.record/1", "workload": "collectives", "status": "ok",
            "config": {"trial": trial, "run_id": "x", "collectives": {"maxbytes": "1M"}},
            "fabric": {"name": "loopback"}}


def _write_one(directory: str, q) -> None:
    q.put(json.loads(write_record(directory, _record(0), "c").read_text())["status"])


def test_a_trial_is_recorded_once_even_when_written_concurrently(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_write_one, args=(str(tmp_path), q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(q.get(timeout=5) for _ in procs) == ["duplicate", "duplicate", "ok"]
    dup = [r for r in map(lambda p: json.loads(p.read_text()), tmp_path.glob("*.json")) if r["status"] == "duplicate"]
    assert "trial=0 of this point is already recorded" in dup[0]["error"] and "Pass trial=1" in dup[0]["error"]
    # Another trial, or another point, is not a duplicate.
    assert json.loads(write_record(tmp_path, _record(1), "c").read_text())["status"] == "ok"
    other = _record(0) | {"config": {"trial": 0, "collectives": {"maxbytes": "2M"}}}
    assert json.loads(write_record(tmp_path, other, "c").read_text())["status"] == "ok"


def test_override_goes_beside_the_others():
    from workloads.core.config import add_override

    argv = ["collectives.py", "-m", "trial=0,1"]
    add_override(argv, "workload=collectives")
    assert argv == ["collectives.py", "-m", "workload=collectives", "trial=0,1"]
    argv = ["collectives.py"]
    add_override(argv, "workload=collectives")
    assert argv == ["collectives.py", "workload=collectives"]


@pytest.mark.slow
def test_collectives_multirun_needs_no_flag_and_a_rerun_resumes(out_root):
    """A sweep rerun with its run_id skips the trials already recorded (once each, said by
    rank 0) and measures the rest, as an inference sweep resumes; it does not stop at the
    first recorded point, and nothing is measured twice."""
    small = ["collectives.maxbytes=1K", "collectives.iters=2", "collectives.warmup_iters=1", f"output_root={out_root}",
             "run_id=m1"]
    r = run_entry("collectives.py", "-m", "trial=0,1", *small, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(x["config"]["trial"] for x in records_in(out_root)) == [0, 1]
    r = run_entry("collectives.py", "-m", "trial=1,2", *small, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.count("trial=1 of this point is already recorded") == 1 and "skipped. Pass trial=2" in r.stdout
    assert "Traceback" not in r.stderr + r.stdout
    assert sorted(x["config"]["trial"] for x in records_in(out_root)) == [0, 1, 2]


@pytest.mark.slow
def test_inference_records_are_strict_json_and_multirun_takes_trials(tmp_path):
    from workloads.testing.scripted_server import Running

    out = tmp_path / "res"
    with Running(ttft_ms=2, itl_ms=1) as url:
        import subprocess
        import sys

        from helpers import REPO

        r = subprocess.run([sys.executable, str(REPO / "launch" / "infer.py"), "-m", "trial=0,1", "server=external",
                            f"server.url={url}", f"output_root={out}", "run_id=inf1", "load.points=[1]",
                            "load.num_requests=4", "load.warmup_requests=1", "load.dataset.input_len=8",
                            "load.dataset.output_len=4"], cwd=tmp_path, env=child_env(), capture_output=True,
                           text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    # Hydra's sweep files go to the run folder, not to ./multirun/ wherever the user stood.
    assert not (tmp_path / "multirun").exists() and (out / "inf1" / "multirun.yaml").is_file()
    paths = sorted(Path(out).rglob("records/*.json"))
    recs = [_strict(p.read_text()) for p in paths]
    assert sorted(x["config"]["trial"] for x in recs) == [0, 1]
    # each trial draws its own prompts: a server's prefix cache cannot serve trial 1 from trial 0
    assert len({tuple(x["dataset"]["seed"]) for x in recs}) == 2
    for x in recs:
        m = x["metrics"]
        assert x["status"] == "ok" and isinstance(m["total_token_throughput"], float)
        assert m["total_token_throughput"] == pytest.approx((m["total_input_tokens"] + m["total_output_tokens"])
                                                            / m["duration"])


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs with 12 KiB free: room for Hydra's multirun.yaml (4 KiB, 2 pages), not
    for a training record after it (over 4 KiB: the config and fingerprint alone)."""
    with tmpfs(tmp_path / "disk") as disk:
        (disk / "filler").write_bytes(b"\0" * (1012 * 1024))
        yield disk


@pytest.mark.slow
def test_a_full_disk_keeps_the_measured_point_and_says_where(small_disk, tmp_path):
    """A training sweep whose records/ fills up: the point measured when it filled is kept in
    the rescue folder (every step time), named in one error line; no traceback, no .tmp left
    in records/, no claim of a kept copy, and the sweep stops (non-zero)."""
    rescued = tmp_path / "rescued"
    r = run_entry("train.py", "-m", "trial=0,1,2", f"output_root={small_disk}/res", "run_id=full", "train.steps=4",
                  "train.warmup_steps=1", env=child_env(FABRICBENCH_RESCUE_DIR=str(rescued)))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "copy is kept" not in out, out[-3000:]
    [kept] = list(rescued.glob("*.json"))
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert lines[0].startswith(f"error: cannot write the record into {small_disk}/res/full/records (No space left on "
                               f"device); this point's record (status ok) is kept at {kept}"), r.stderr[-3000:]
    rec = json.loads(kept.read_text())
    assert rec["status"] == "ok" and rec["config"]["trial"] == 0 and len(rec["samples"]["step_time_s"]) == 4
    assert records_in(small_disk) == [] and "trial=1" not in r.stdout  # the sweep stopped at the full disk
    assert not [p for p in small_disk.rglob("*") if p.name.endswith((".tmp", ".inflight"))]


def test_cpu_affinity_in_the_fingerprint_and_the_warning():
    import os

    from workloads.core.fingerprint import fingerprint
    from workloads.session import affinity_warning

    assert fingerprint()["cpu_affinity"] == len(os.sched_getaffinity(0))
    assert affinity_warning(1, 8).startswith("this process may run on 1 CPU(s)")
    assert affinity_warning(16, 8) is None and affinity_warning(None, 8) is None
