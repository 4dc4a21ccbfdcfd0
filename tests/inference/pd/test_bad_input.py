"""server=vllm-pd's bad inputs end in one line and a non-zero exit before anything is measured:
P and D at different TP degrees (refused before any process starts) and a decode instance that
never answers /health (serve.py with real stand-in processes: a prefill that answers, a decode
that never listens). A connector the engine lacks needs the engine's own registry:
tests/inference/pd/test_vllm_pd.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import child_env, records_in, run_entry
from workloads.core.dist import free_port

HEALTHY = ("import http.server, sys\n"
           "class H(http.server.BaseHTTPRequestHandler):\n"
           "    def do_GET(self):\n"
           "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
           "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


@pytest.mark.parametrize("script,args,message", [
    ("infer.py", ["+server.prefill_tp=1", "+server.decode_tp=2"],
     "prefill TP 1 and decode TP 2 must both equal server.tp=1"),
    # P and D on two nodes: only the emulator's two namespaces
    ("infer.py", ["server.nnodes=2", "server.dist_init_addr=10.0.0.1:29500"],
     "P and D on two real nodes is not built yet"),
    # refused from the composed config, before any namespace exists (no root needed to be told)
    ("emulate.py", ["--nodes", "3", "launch/infer.py", "fabric=emu-100m"],
     "server=vllm-pd runs its prefill instance in node 0 and its decode instance in node 1; use 2 emulated nodes, "
     "not 3"),
])
def test_refused_before_anything_starts(tmp_path, script, args, message):
    head = args[:args.index("launch/infer.py") + 1] if "launch/infer.py" in args else []
    r = run_entry(script, *head, "server=vllm-pd", "model=llama-tiny", "server.model_path=/nonexistent",
                  *args[len(head):], f"output_root={tmp_path}", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert records_in(tmp_path) == []


def _serve(plan: dict) -> tuple[int, str, int]:
    p = subprocess.Popen([sys.executable, "-m", "workloads.inference.pd.serve", json.dumps(plan)], env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out, p.pid


def test_a_decode_that_hangs_on_a_taken_port_is_not_waited_for(tmp_path):
    """vLLM's NIXL listener thread dies on a taken side-channel port and the instance hangs; its
    log line ends the start-up at once (ready_timeout_s here is 600 s)."""
    ports = {"prefill": free_port(), "decode": free_port()}
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 600, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl")}
    hang = ("import time; print(\"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')\", flush=True); "
            "time.sleep(600)")
    for role, argv in (("prefill", [sys.executable, "-c", HEALTHY, str(ports["prefill"])]),
                       ("decode", [sys.executable, "-c", hang])):
        plan[role] = {"host": "127.0.0.1", "port": ports[role], "argv": argv, "env": {}, "log": str(tmp_path / f"{role}.log")}
    (tmp_path / "decode.log").write_text("an earlier run's Address already in use\n")  # not this start's
    t0 = time.monotonic()
    rc, out, _ = _serve(plan)
    assert rc == 3 and time.monotonic() - t0 < 30, out
    assert "error: vllm-pd: the decode instance cannot start: zmq.error.ZMQError: Address already in use" in out


def test_decode_never_ready(tmp_path):
    ports = {"prefill": free_port(), "decode": free_port()}
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 4, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl")}
    for role, argv in (("prefill", [sys.executable, "-c", HEALTHY, str(ports["prefill"])]),
                       ("decode", [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"])):
        plan[role] = {"host": "127.0.0.1", "port": ports[role], "argv": argv, "env": {}, "log": str(tmp_path / f"{role}.log")}
    t0 = time.monotonic()
    rc, out, pid = _serve(plan)
    assert rc == 3, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [f"error: vllm-pd: the decode instance did not answer /health within server.ready_timeout_s=4 s "
                      f"(its log: {tmp_path / 'decode.log'})"], out
    assert "loading" in out  # the end of the decode instance's own log is quoted
    assert time.monotonic() - t0 < 30
    assert "prefill instance ready" in out
    # both instances were stopped by serve.py itself, not left to the orchestrator
    assert subprocess.run(["pgrep", "-s", str(pid)], capture_output=True).stdout.strip() == b""
