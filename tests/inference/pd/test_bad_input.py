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
from workloads.core.ports import free_port

HEALTHY = ("import http.server, sys\n"
           "class H(http.server.BaseHTTPRequestHandler):\n"
           "    def do_GET(self):\n"
           "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
           "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


@pytest.mark.parametrize("script,args,message", [
    ("infer.py", ["+server.prefill_tp=1", "+server.decode_tp=2"],
     "prefill TP 1 and decode TP 2 must both equal server.tp=1"),
    # P and D on two real nodes: node 0 must be told where node 1's decode instance listens
    ("infer.py", ["server.nnodes=2", "server.dist_init_addr=10.0.0.1:29500"],
     "server=vllm-pd on two real nodes needs server.decode_host=<node 1's address>"),
    ("infer.py", ["server.nnodes=3", "server.dist_init_addr=10.0.0.1:29500"],
     "server=vllm-pd runs its prefill instance on node 0 and its decode instance on node 1: server.nnodes=2, not 3"),
    ("infer.py", ["server.nixl_pthr_delay_us=-5"],
     "server.nixl_pthr_delay_us=-5: a whole number of microseconds >= 0"),
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
    assert rc == 1 and time.monotonic() - t0 < 30, out
    assert "error: vllm-pd: the decode instance cannot start: zmq.error.ZMQError: Address already in use" in out


def test_the_proxys_port_is_held_from_the_start(tmp_path):
    """serve.py binds the proxy's port before it starts any instance (an outgoing connection
    could take the number during their minute of start-up): one taken by then ends it at once,
    with one line, and no instance was started."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plan = {"host": "127.0.0.1", "port": port, "model_name": "m", "ready_timeout_s": 600, "warmup_timeout_s": 5,
                "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl")}
        for role in ("prefill", "decode"):
            plan[role] = {"host": "127.0.0.1", "port": free_port(), "argv": [sys.executable, "-c", "import time; time.sleep(600)"],
                          "env": {}, "log": str(tmp_path / f"{role}.log")}
        rc, out, _ = _serve(plan)
    assert rc == 1, out
    assert [line for line in out.splitlines() if line.startswith("error:")] == [
        f"error: vllm-pd: server.port={port} on 127.0.0.1 cannot be bound for the proxy (Address already in use); "
        "stop what holds it or choose another server.port"], out
    assert not (tmp_path / "prefill.log").exists() and not (tmp_path / "decode.log").exists()


def test_decode_never_ready(tmp_path):
    ports = {"prefill": free_port(), "decode": free_port()}
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 4, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl")}
    for role, argv in (("prefill", [sys.executable, "-c", HEALTHY, str(ports["prefill"])]),
                       ("decode", [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"])):
        plan[role] = {"host": "127.0.0.1", "port": ports[role], "argv": argv, "env": {}, "log": str(tmp_path / f"{role}.log")}
    t0 = time.monotonic()
    rc, out, pid = _serve(plan)
    assert rc == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [f"error: vllm-pd: the decode instance did not answer /health within server.ready_timeout_s=4 s "
                      f"(its log: {tmp_path / 'decode.log'})"], out
    assert "loading" in out  # the end of the decode instance's own log is quoted
    assert time.monotonic() - t0 < 30
    assert "prefill instance ready" in out
    # both instances were stopped by serve.py itself, not left to the orchestrator
    assert subprocess.run(["pgrep", "-s", str(pid)], capture_output=True).stdout.strip() == b""


def test_two_real_nodes_split_the_plan(monkeypatch, tmp_path):
    """On two real nodes node 0's serve.py starts the prefill and waits for the decode at
    decode_host:port+1; node 1's starts only the decode, on that port, and serves no proxy."""
    from workloads.inference.adapters import vllm_pd
    from workloads.inference.adapters.base import ServerSpec

    monkeypatch.delenv("FABRICBENCH_EMULATED_NODES", raising=False)
    model = {"name": "llama-tiny", "path": "/models/tiny"}
    plans = {}
    for rank, host in ((0, "10.0.0.1"), (1, "10.0.0.2")):
        spec = ServerSpec(adapter="vllm_pd", host=host, port=18000, nnodes=2, node_rank=rank,
                          dist_init_addr="10.0.0.1:29500", run_dir=str(tmp_path),
                          options={"decode_host": "10.0.0.2"})
        plans[rank] = json.loads(vllm_pd.command(spec, model).argv[-1])
    zero, one = plans[0], plans[1]
    assert zero["proxy"] is True and (zero["host"], zero["port"]) == ("10.0.0.1", 18000)
    assert zero["decode"] == {"host": "10.0.0.2", "port": 18001, "log": str(tmp_path / "server" / "vllm-pd-decode.log"),
                              "remote": True}
    assert zero["prefill"]["host"] == "10.0.0.1" and "--host" in zero["prefill"]["argv"]
    assert one["proxy"] is False and "prefill" not in one and one["watch"] == "http://10.0.0.1:18000/health"
    assert (one["decode"]["host"], one["decode"]["port"]) == ("10.0.0.2", 18001)
    argv = one["decode"]["argv"]
    assert argv[argv.index("--port") + 1] == "18001" and argv[argv.index("--host") + 1] == "10.0.0.2"
    assert one["decode"]["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.2"


def test_another_nodes_decode_that_never_answers(tmp_path):
    """Node 0 of two real nodes: its prefill comes up, node 1's decode instance never answers
    (its worker never started): one line naming the address and what to check, exit 3, and the
    local prefill stopped."""
    ports = {"prefill": free_port(), "decode": free_port()}
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 4, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl"), "proxy": True,
            "prefill": {"host": "127.0.0.1", "port": ports["prefill"], "argv": [sys.executable, "-c", HEALTHY,
                                                                                str(ports["prefill"])],
                        "env": {}, "log": str(tmp_path / "prefill.log")},
            "decode": {"host": "127.0.0.1", "port": ports["decode"], "log": str(tmp_path / "decode.log"), "remote": True}}
    rc, out, pid = _serve(plan)
    assert rc == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [f"error: vllm-pd: the decode instance at 127.0.0.1:{ports['decode']} (another node's; is its worker "
                      f"running?) did not answer /health within server.ready_timeout_s=4 s (its log: "
                      f"{tmp_path / 'decode.log'})"], out
    assert "prefill instance ready" in out
    assert subprocess.run(["pgrep", "-s", str(pid)], capture_output=True).stdout.strip() == b""


def test_a_node_without_the_proxy_keeps_its_instance_until_it_exits(tmp_path):
    """Node 1 of two real nodes: it starts its decode instance, waits for it, then serves no proxy
    and ends with the instance (here a stand-in that answers /health for 2 s, then exits 7)."""
    port = free_port()
    brief = HEALTHY.replace("http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n",
                            "import time\ns = http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H)\n"
                            "s.timeout = 0.2\nend = time.time() + 2\n"
                            "while time.time() < end: s.handle_request()\nsys.exit(7)\n")
    assert brief != HEALTHY
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 20, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl"), "proxy": False,
            "decode": {"host": "127.0.0.1", "port": port, "argv": [sys.executable, "-c", brief, str(port)], "env": {},
                       "log": str(tmp_path / "server" / "decode.log")}}
    rc, out, _ = _serve(plan)
    assert rc == 7, out
    assert f"vllm-pd: decode instance ready on port {port}" in out and "the decode instance exited with code 7" in out
    assert not (tmp_path / "w.json").exists()  # no proxy, no warm-up on this node


def test_a_node_without_the_proxy_ends_when_node_0s_proxy_goes(tmp_path):
    """Node 1 of two real nodes watches node 0's proxy: once seen up, 5 missed probes in a row
    mean node 0's sweep is over, and node 1 stops its instance and exits 0 (the job's normal end)."""
    port, proxy_port = free_port(), free_port()
    probed = tmp_path / "probed"
    # node 0's proxy stand-in notes each probe, so the test ends it only once serve.py has seen it up
    counting = HEALTHY.replace("self.send_response(200)", f"open({str(probed)!r}, 'a').write('.'); self.send_response(200)")
    assert counting != HEALTHY
    proxy = subprocess.Popen([sys.executable, "-c", counting, str(proxy_port)])
    plan = {"host": "127.0.0.1", "port": free_port(), "model_name": "m", "ready_timeout_s": 20, "warmup_timeout_s": 5,
            "warmup_path": str(tmp_path / "w.json"), "timings_path": str(tmp_path / "t.jsonl"), "proxy": False,
            "watch": f"http://127.0.0.1:{proxy_port}/health",
            "decode": {"host": "127.0.0.1", "port": port, "argv": [sys.executable, "-c", HEALTHY, str(port)], "env": {},
                       "log": str(tmp_path / "decode.log")}}
    p = subprocess.Popen([sys.executable, "-m", "workloads.inference.pd.serve", json.dumps(plan)], env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not probed.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert probed.exists() and p.poll() is None
        proxy.kill()
        proxy.wait()
        out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        proxy.kill()
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, out
    assert f"node 0's proxy (http://127.0.0.1:{proxy_port}/health) stopped answering" in out, out
    assert subprocess.run(["pgrep", "-s", str(p.pid)], capture_output=True).stdout.strip() == b""
