"""launch/infer.py end to end: real processes, real HTTP on 127.0.0.1.

- against the scripted SSE server (server=external): a sweep writes one record per point,
  and a rerun with the same run_id and more points runs only the missing one; no prompt
  reaches the server twice over warm-up and all points (a prefix cache would answer it);
- bad input: one `error:` line, exit 2, no traceback;
- against the reference engine (launch/serve.py) at TP=2 over Gloo: a concurrency sweep.
"""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, child_env, gone, quiet_port
from workloads.core.ports import free_port
from workloads.inference.loadgen.datasets import run_salt
from workloads.testing.scripted_server import Running


def _infer(*overrides, timeout=240, **extra_env):
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0", WANDB_MODE="offline",
               **extra_env)
    return subprocess.run([sys.executable, str(REPO / "launch" / "infer.py"), *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _records(root):
    return [json.loads(p.read_text()) for p in sorted(Path(root).rglob("records/*.json"))]


SMALL = ["load.num_requests=12", "load.warmup_requests=2", "load.dataset.input_len=16", "load.dataset.output_len=6"]


@pytest.mark.slow  # a sweep against a started server: the fast lane starts none
def test_sweep_records_and_resume(tmp_path):
    out = tmp_path / "res"
    with Running(ttft_ms=4, itl_ms=2) as url:
        common = ["server=external", f"server.url={url}", f"output_root={out}", "run_id=sweep1", *SMALL]
        r = _infer(*common, "load.points=[1,4]")
        assert r.returncode == 0, r.stderr
        recs = _records(out)
        assert sorted(x["point"] for x in recs) == ["c1", "c4"]
        for x in recs:
            m = x["metrics"]
            assert x["status"] == "ok" and x["workload"] == "inference" and m["completed"] == 12 and m["failed"] == 0
            assert m["total_output_tokens"] == 12 * 6  # ignore_eos + usage: exactly what was asked
            # the server sends the first token after 4 ms and the other 5 at 2 ms apart: no client sees
            # the last before 14 ms. TPOT can be 0: a client descheduled past the pacing reads the
            # remaining tokens in one chunk (seen under load: TTFT 18.8 ms, every token in one read)
            assert m["mean_ttft_ms"] >= 4 and m["mean_e2el_ms"] >= 4 + 5 * 2 and m["median_tpot_ms"] >= 0
            assert len(x["samples"]["requests"]) == 12
            assert x["fabric"]["name"] == "loopback" and x["server"]["adapter"] == "external"
            assert x["client"] == {"event_loop": "uvloop"}  # load.event_loop=auto, uvloop installed
            # its measured window on the run's clock is its measured requests' (the study's duty cycle)
            tl = x["timeline"]
            assert tl["window_end"] - tl["window"] == pytest.approx(m["duration"], abs=0.002) and tl["window_end"] <= tl["record"]
        # what a study's plan reads of this sweep's window (workloads/study/served.py): one more
        # request at every point adds their durations / 12; the batch statistic over a whole
        # point is the point's own metric (the same function), and a closed loop's throughput
        # statistic times the concurrency is its request_throughput while the workers are busy
        from workloads.study.served import requests_of, statistic

        c4 = next(x for x in recs if x["point"] == "c4")
        got = requests_of(c4, recs, "request_throughput")
        assert got.steps == 12 and got.step_s == pytest.approx(sum(x["metrics"]["duration"] for x in recs) / 12)
        assert got.within2 >= 0 and requests_of(c4, recs, "p99_itl_ms") is not None
        rows = c4["samples"]["requests"]
        for name in ("median_ttft_ms", "p99_itl_ms", "mean_tpot_ms"):
            assert statistic(name, "closed")(rows) == pytest.approx(c4["metrics"][name]), name
        assert 4 * statistic("request_throughput", "closed")(rows) == pytest.approx(
            c4["metrics"]["request_throughput"], rel=0.3)
        # Interrupted after c1, c4 ... : a rerun with one more point runs only that one,
        # and tells W&B (offline here) about that one point: one W&B run per record.
        wandb_dir = tmp_path / "wandb"
        r = _infer(*common, "load.points=[1,4,8]", "logger=wandb", WANDB_DIR=str(wandb_dir))
        assert r.returncode == 0, r.stderr
        assert "point c1: already recorded" in r.stdout and "point c4: already recorded" in r.stdout
        assert sorted(x["point"] for x in _records(out)) == ["c1", "c4", "c8"]
        assert len(list((wandb_dir / "wandb").glob("offline-run-*"))) == 1
        # The same run_id with another experiment is refused, not resumed from old points.
        r = _infer(*common, "load.points=[1,4,8]", "load.dataset.output_len=7")
        assert r.returncode == 2 and "already holds points measured with another configuration" in r.stderr
        assert "load.dataset.output_len: 6 -> 7" in r.stderr
        # Three points over two invocations, 2 warm-up + 12 measured each: 42 requests, and
        # the server saw 42 different prompts (ids lists): warm-up never resends a measured
        # prompt, no point resends another's, and the resumed c8 is disjoint from c1 and c4.
        seen = json.loads(urllib.request.urlopen(url + "/prompts", timeout=5).read())
        assert len(seen["prompts"]) == 3 * (2 + 12) and len(set(seen["prompts"])) == 3 * (2 + 12)
        for x in _records(out):
            d = x["dataset"]
            assert d["kind"] == "random" and d["prompts_unique"] == 12 and d["repeats_within_point"] == 0
            assert d["prompts_seen_before"] == 0 and d["repeats_across_points"] is False
        # (load.seed, run, trial, slot): the resumed run draws its points' prompts as the first did
        run = run_salt("sweep1", 0)
        assert {x["point"]: x["dataset"]["seed"] for x in _records(out)} == {
            "c1": [0, *run, 1], "c4": [0, *run, 3], "c8": [0, *run, 5]}
        # load.flush_cache_path: one POST before each point, before its warm-up.
        r = _infer("server=external", f"server.url={url}", f"output_root={out}", "run_id=sweep2", *SMALL,
                   "load.points=[2,3]", "load.flush_cache_path=/flush_cache")
        assert r.returncode == 0, r.stderr
        seen = json.loads(urllib.request.urlopen(url + "/prompts", timeout=5).read())
        assert seen["flushes"] == [42, 42 + 14]
        # Another run against the same server sends none of the first run's prompts (its points
        # 0 and 1 used to redraw sweep1's slots exactly: cache hits a flush alone must undo).
        assert len(seen["prompts"]) == len(set(seen["prompts"])) == 42 + 28
        assert all(x["dataset"]["cache_flushed"] for x in _records(out / "sweep2"))
        # Open loop: Poisson at 50 req/s, with the client's send lag recorded per request.
        r = _infer("server=external", f"server.url={url}", f"output_root={out}", "run_id=rate1", *SMALL,
                   "load=rate_sweep", "load.points=[50]", "load.duration_s=null", "load.slo=ttft:1000")
        assert r.returncode == 0, r.stderr
        (rec,) = _records(out / "rate1")
        assert rec["point"] == "poisson-r50" and rec["metrics"]["request_goodput"] > 0
        assert rec["metrics"]["p99_send_lag_ms"] is not None


@pytest.mark.slow
def test_reference_engine_tp2_sweep(tmp_path):
    out = tmp_path / "res"
    r = _infer("server=reference", "server.tp=2", "fabric=loopback", "load.points=[1,2]", f"output_root={out}",
               "run_id=ref", f"server.port={quiet_port()}", *SMALL, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    recs = _records(out)
    assert sorted(x["point"] for x in recs) == ["c1", "c2"]
    for x in recs:
        assert x["status"] == "ok" and x["metrics"]["completed"] == 12 and x["server"]["tp"] == 2
        assert x["metrics"]["total_output_tokens"] == 12 * 6
        # The engine verified its own wire (both TP ranks' Gloo sockets) and reported it.
        t = x["fabric"]["transport"]
        assert t["verdict"] == "ok" and t["summary"]["interfaces"] == ["lo"] and len(t["summary"]["ranks"]) == 2
        # The engine's run folder is the sweep's (its NCCL logs land beside the records), not
        # one of its own under the working directory's results/.
        assert t["run_dir"] == str(out / "ref") and f"output_root='{out}'" in x["server"]["argv"]
    log = (out / "ref" / "server" / "reference.log").read_text()
    assert "nproc_per_node=2" in log


@pytest.mark.slow  # a sweep against a started server: the fast lane starts none
def test_failed_requests_make_a_point_partial_and_resume_remeasures_it(tmp_path):
    """A point is ok only when every request completed (load.max_failed_fraction=0): with
    every 5th request answered HTTP 500 the point is `partial` with its counts, exit 1, and
    a rerun measures it again instead of skipping it."""
    out = tmp_path / "res"
    with Running(ttft_ms=2, itl_ms=1, fail_every=5) as url:
        common = ["server=external", f"server.url={url}", f"output_root={out}", "run_id=p1", *SMALL,
                  "load.points=[2]", "load.warmup_requests=0"]
        r = _infer(*common)
        assert r.returncode == 1, r.stderr
        (rec,) = _records(out)
        assert rec["status"] == "partial" and rec["metrics"]["completed"] + rec["metrics"]["failed"] == 12
        assert rec["error"].startswith(f"{rec['metrics']['failed']} of 12 requests failed, more than "
                                       "load.max_failed_fraction=0 allows")
        assert "point c2: PARTIAL" in r.stdout
        r = _infer(*common, "load.max_failed_fraction=0.5")
        assert r.returncode == 0, r.stderr
        assert "already recorded" not in r.stdout
        assert [x["status"] for x in _records(out)] == ["partial", "ok"]


@pytest.mark.slow  # a sweep against a started server: the fast lane starts none
def test_a_server_death_is_named_in_the_point_record(tmp_path):
    """The server started here (a scripted one behind the vLLM adapter's command line) is
    SIGKILLed by its 20th request, during point c4: that point's record says so."""
    out = tmp_path / "res"
    fake = tmp_path / "vllm"
    # a traceback in its log, as an engine's (and torchrun's) would be: the console gets its last line only
    fake.write_text("#!/bin/sh\necho 'Traceback (most recent call last):' >&2\necho '  File \"x.py\"' >&2\n"
                    "echo 'RuntimeError: scripted engine fault' >&2\n"
                    f"exec {sys.executable} -m workloads.testing.scripted_server --die-after 20 \"$@\"\n")
    fake.chmod(0o755)
    port = free_port()
    r = _infer("server=vllm", f"server.executable={fake}", "model=llama-3.1-8b", f"server.model_path={tmp_path}",
               f"server.port={port}",
               "server.ready_timeout_s=30", f"output_root={out}", "run_id=d1", *SMALL, "load.warmup_requests=0",
               "load.points=[1,4]")
    assert r.returncode == 1, r.stdout + r.stderr  # a fault, not bad input (docs/reliability.md's exit codes)
    assert "error: server=vllm exited with code -9 during point c4" in r.stderr
    assert "its last error line: RuntimeError: scripted engine fault" in r.stderr
    assert "Traceback" not in r.stderr and len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1
    recs = {x["point"]: x for x in _records(out)}
    assert recs["c1"]["status"] == "ok"
    assert recs["c4"]["status"] == "failed"
    assert recs["c4"]["error"] == "server=vllm exited with code -9 during point c4"


def _received(port: int) -> int:
    """How many requests the scripted server has received (its GET /prompts)."""
    import json
    import urllib.request

    try:
        return len(json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/prompts", timeout=2).read())["prompts"])
    except OSError:
        return 0


@pytest.mark.slow  # a sweep against a started server: the fast lane starts none
def test_sigterm_mid_sweep_stops_it_at_once_and_keeps_the_finished_point(tmp_path):
    """SIGTERM (a scheduler's cancel) during point c2 of [1, 2]: the sweep stops then, not when
    its points are done. The signal lands in the event loop's callbacks, which swallow an
    Exception raised there (it did: the sweep ran on), so it is a KeyboardInterrupt
    (workloads/core/signals.py). The server started here (a scripted one behind the vLLM
    adapter's command line) is stopped, c1's record stays ok, c2's says interrupted, and the
    one line and exit 143 are every entry point's."""
    out, pid_file = tmp_path / "res", tmp_path / "server.pid"
    fake = tmp_path / "vllm"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n"
                    f"exec {sys.executable} -m workloads.testing.scripted_server --itl-ms 50 \"$@\"\n")
    fake.chmod(0o755)
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO / "launch" / "infer.py"), "server=vllm", f"server.executable={fake}",
                          "model=llama-3.1-8b", f"server.model_path={tmp_path}", f"server.port={port}",
                          "server.ready_timeout_s=60",
                          f"output_root={out}", "run_id=t1", *SMALL, "load.num_requests=3", "load.warmup_requests=0",
                          "load.dataset.output_len=40", "load.points=[1,2]"],
                         cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120  # c1: 3 requests of 40 tokens 50 ms apart, ~6 s; c2 ~4 s
    # Inside c2, not between points: c1's record is written and the server has received c2's
    # first request (its 4th). Signalled on c1's record alone, the sweep could stop before c2
    # began, with no c2 record at all (seen once in a full run).
    while not (_records(out) and _received(port) >= 4):
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    out_text, err = p.communicate(timeout=60)
    assert (p.returncode, err.splitlines()[-1:]) == (143, ["interrupted: measured points are kept"]), \
        (out_text[-4000:], err)
    assert "Traceback" not in err, err
    recs = {x["point"]: x for x in _records(out)}
    assert recs["c1"]["status"] == "ok"
    assert (recs["c2"]["status"], recs["c2"]["error"]) == ("failed", "interrupted")
    assert gone([int(pid_file.read_text())]), "the server outlived its sweep"


@pytest.mark.slow  # a sweep against a started server: the fast lane starts none
def test_unreachable_wandb_costs_one_timeout_per_run(tmp_path):
    """W&B online with a key but nothing listening at its address: the first point's W&B
    start fails once (one warning), the later points do not try again; records are all ok."""
    port = free_port()  # closed: nothing listens there
    with Running(ttft_ms=2, itl_ms=1) as url:
        r = _infer("server=external", f"server.url={url}", f"output_root={tmp_path}/res", "run_id=w1", *SMALL,
                   "load.points=[1,2,3]", "logger=wandb", "logger.mode=online", "logger.init_timeout_s=5",
                   WANDB_BASE_URL=f"http://127.0.0.1:{port}", WANDB_API_KEY="x" * 40,
                   WANDB_DIR=str(tmp_path / "wandb"))
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: W&B")]
    assert len(warnings) == 1, r.stderr
    assert [x["status"] for x in _records(tmp_path / "res")] == ["ok"] * 3
    assert "x" * 40 not in r.stdout + r.stderr


def test_a_sweep_point_goes_through_run_point_with_the_sweeps_own_words(tmp_path, monkeypatch):
    """The sweep's points close in session.run_point as every workload's do, with its options:
    no process group, so no in-flight copy (nothing could finish it); the tracker run named
    after the point; and the errors sweeps have always recorded ("interrupted"; a UsageError
    raised inside a point with its type and traceback, it being the server's doing there)."""
    from types import SimpleNamespace

    from workloads import session
    from workloads.core import inflight
    from workloads.core.errors import UsageError
    from workloads.core.loggers import Loggers
    from workloads.core.records import new_record
    from workloads.inference.run import _point_failure

    monkeypatch.delenv(inflight.INFLIGHT_ENV, raising=False)
    labels, copies = [], []
    monkeypatch.setattr(session, "build_loggers", lambda tracking, info, label=None: labels.append(label) or Loggers())
    server = SimpleNamespace(is_main=True, world_size=2, nodes=1)  # what the trackers are told
    for k, (exc, error) in enumerate([(KeyboardInterrupt(), "interrupted"),
                                      (UsageError("load.slo is bad"), "UsageError: load.slo is bad")]):
        rec = new_record("inference", config={"trial": 0}, run_id="r", point=f"c{k}")

        def measure(exc=exc):
            copies.extend(tmp_path.rglob(f"*{inflight.SUFFIX}"))
            raise exc

        with pytest.raises(type(exc)):
            session.run_point(session.Point(rec, tmp_path / "records", f"c{k}", server), measure, None,
                              summarize=lambda r, p: None, group=False, label=f"c{k}", describe=_point_failure,
                              noise=False)
        (written,) = (tmp_path / "records").glob(f"c{k}*.json")
        on_disk = json.loads(written.read_text())
        assert (on_disk["status"], on_disk["error"]) == ("failed", error)
        assert ("traceback" in on_disk) == (k == 1)
    assert labels == ["c0", "c1"] and copies == []
