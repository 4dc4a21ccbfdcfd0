"""Server adapters and the orchestrator.

SGLang and vLLM need GPUs and cannot be installed here, so their adapters are tested at
the command-line / environment boundary: the argv they build (against the documented
flags: docs.sglang.io "Multi-Node Deployment", docs.vllm.ai "Parallelism and Scaling")
and the environment the orchestrator would give them. The orchestrator itself is tested
with real processes: a stand-in server that forks a grandchild, ignores SIGTERM, or never
becomes ready.
"""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hydra import compose, initialize_config_dir

from helpers import REPO, alive
from workloads.core.errors import UsageError
from workloads.core.ports import free_port
from workloads.fabric.profile import FabricProfile
from workloads.inference.adapters import get_adapter
from workloads.inference.adapters.base import Launch, ServerSpec
from workloads.inference.adapters.orchestrator import ManagedServer
from workloads.models.tp import check_tp_divides

CONF = str(REPO / "conf")


def _cfg(*overrides):
    with initialize_config_dir(config_dir=os.path.abspath(CONF), version_base="1.3"):
        return compose("config", overrides=["workload=inference", *overrides])


def _launch(*overrides):
    from omegaconf import OmegaConf

    c = _cfg(*overrides)
    spec = ServerSpec.from_config(OmegaConf.to_container(c.server, resolve=True))
    model = OmegaConf.to_container(c.model, resolve=True)
    return spec, get_adapter(spec.adapter).command(spec, model, c.fabric.name), c


def test_sglang_command_line():
    spec, l, _ = _launch("server=sglang", "model=llama-3.1-8b", "server.tp=8", "server.port=31000",
                         "server.extra_args=[--mem-fraction-static,0.85]", "server.device=cuda")
    assert l.argv[1:] == ["-m", "sglang.launch_server", "--model-path", "meta-llama/Llama-3.1-8B-Instruct",
                          "--tp-size", "8", "--host", "127.0.0.1", "--port", "31000", "--enable-cache-report",
                          "--mem-fraction-static", "0.85"]  # the engine's prompt-cache report is on by default
    assert l.model_name == "meta-llama/Llama-3.1-8B-Instruct"
    _, l, _ = _launch("server=sglang", "model=llama-3.1-8b", "server.tp=16", "server.nnodes=2", "server.node_rank=1",
                      "server.dist_init_addr=10.0.0.1:20000", "server.model_path=/models/llama")
    i = l.argv.index("--dist-init-addr")
    assert l.argv[i:i + 6] == ["--dist-init-addr", "10.0.0.1:20000", "--nnodes", "2", "--node-rank", "1"]
    assert l.argv[l.argv.index("--model-path") + 1] == "/models/llama"


def test_vllm_command_line(monkeypatch, tmp_path):
    from workloads.inference.adapters import vllm

    monkeypatch.setattr(vllm, "ENGINE_ENV", tmp_path / "no-engines")
    _, l, _ = _launch("server=vllm", "model=llama-3.1-8b", "server.tp=4")
    assert l.argv == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "4",
                      "--host", "127.0.0.1", "--port", "8000", "--enable-prompt-tokens-details"]
    _, head, _ = _launch("server=vllm", "model=llama-3.1-8b", "server.tp=16", "server.nnodes=2",
                         "server.dist_init_addr=10.0.0.1:29600")
    assert head.argv[-9:-1] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29600"]
    _, worker, _ = _launch("server=vllm", "model=llama-3.1-8b", "server.tp=16", "server.nnodes=2", "server.node_rank=1",
                           "server.dist_init_addr=10.0.0.1:29600")
    assert worker.argv[-1] == "--headless" and "--node-rank" in worker.argv
    assert "--enable-prompt-tokens-details" not in worker.argv  # an API server's flag; a headless node serves none


def test_vllm_launcher_rule(monkeypatch, tmp_path):
    """The documented rule (adapters/vllm.py): server.python, then server.executable, then
    .engines/vllm's interpreter (both as the API-server module), then `vllm serve`."""
    from workloads.inference.adapters import vllm

    env = tmp_path / "vllm"
    monkeypatch.setattr(vllm, "ENGINE_ENV", env)
    api = ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--tensor-parallel-size", "2"]
    assert _launch("server=vllm", "server.model_path=/m", "server.tp=2")[1].argv[:3] == ["vllm", "serve", "/m"]
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").touch()
    assert _launch("server=vllm", "server.model_path=/m", "server.tp=2")[1].argv[:7] == [str(env / "bin/python"), *api]
    assert _launch("server=vllm", "server.model_path=/m", "server.tp=2", "server.python=/opt/py")[1].argv[:7] == \
        ["/opt/py", *api]
    assert _launch("server=vllm", "server.model_path=/m", "server.executable=/opt/vllm")[1].argv[:3] == \
        ["/opt/vllm", "serve", "/m"]
    # server=vllm-pd checks its connector in the registry of the vLLM that will run, by the same
    # rule: the local engine's here, none for an executable (whose vLLM then refuses by itself)
    from workloads.inference.adapters import vllm_pd
    from workloads.inference.adapters.base import ServerSpec

    site = env / "lib" / "python3.11" / "site-packages" / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    site.mkdir(parents=True)
    (site / "factory.py").write_text('KVConnectorFactory.register_connector(\n    "NixlConnector", "m", "C")\n')
    assert vllm.interpreter(ServerSpec(adapter="vllm_pd")) == str(env / "bin" / "python")
    assert vllm_pd.known_connectors(ServerSpec(adapter="vllm_pd")) == ["NixlConnector"]
    assert vllm.interpreter(ServerSpec(adapter="vllm_pd", executable="/opt/vllm")) is None
    assert vllm_pd.known_connectors(ServerSpec(adapter="vllm_pd", executable="/opt/vllm")) is None


def test_engine_interpreter_is_configurable(monkeypatch, tmp_path):
    # In the serving images the engine lives in the image's Python, fabricbench in a venv.
    from workloads.inference.adapters import sglang

    monkeypatch.setattr(sglang, "ENGINE_ENV", tmp_path / "no-engines")
    assert _launch("server=sglang", "model=llama-3.1-8b")[1].argv[0] == sys.executable
    monkeypatch.setenv("FB_ENGINE_PYTHON", "/usr/bin/python3")
    assert _launch("server=sglang", "model=llama-3.1-8b")[1].argv[0] == "/usr/bin/python3"
    assert _launch("server=vllm", "model=llama-3.1-8b", "server.executable=/opt/vllm/bin/vllm")[1].argv[0] == \
        "/opt/vllm/bin/vllm"


def test_reference_and_external():
    _, l, _ = _launch("server=reference", "server.tp=2", "server.port=8123")
    assert l.argv[1:6] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", l.argv[5]]
    assert l.argv[5].endswith("launch/serve.py")
    assert l.argv[6:] == ["model=neox-tiny", "fabric=loopback", "server.host=127.0.0.1", "server.port=8123"]
    spec, l, _ = _launch("server=external", "server.url=http://10.1.2.3:30000/")
    assert l.argv is None and spec.base_url == "http://10.1.2.3:30000"
    with pytest.raises(UsageError, match="server.url"):
        _launch("server=external")


def test_bad_server_config():
    with pytest.raises(UsageError, match="does not divide model.num_attention_heads=32"):
        check_tp_divides(6, {"name": "llama-3.1-8b", "num_attention_heads": 32, "num_key_value_heads": 8})
    check_tp_divides(16, {"num_attention_heads": 32, "num_key_value_heads": 8})  # KV heads replicated: fine
    with pytest.raises(UsageError, match="dist_init_addr"):
        _launch("server=sglang", "model=llama-3.1-8b", "server.nnodes=2")
    with pytest.raises(UsageError, match="model_path"):
        _launch("server=vllm", "model=neox-tiny")


def test_fabric_env_reaches_the_server(tmp_path):
    """The orchestrator hands the server the fabric's variables and NCCL's log file in the
    run dir. The stand-in prints its environment, as sglang/vllm would read it."""
    c = _cfg("fabric=roce", "server=sglang", "model=llama-3.1-8b")
    from omegaconf import OmegaConf

    fabric = FabricProfile.from_config(OmegaConf.to_container(c.fabric, resolve=True))
    env = dict(os.environ)
    fabric.apply(tmp_path, env)
    spec = ServerSpec(adapter="sglang", port=free_port(), ready_timeout_s=20, env={"SGLANG_EXTRA": "1"})
    argv = [sys.executable, "-c", "import os,json; print(json.dumps(dict(os.environ)), flush=True)"]
    with pytest.raises(UsageError, match="exited with code 0 before it was ready"):
        with ManagedServer(spec, Launch(argv, dict(spec.env), "m"), tmp_path, env):
            pass
    import json

    logged = json.loads((tmp_path / "server" / "sglang.log").read_text().splitlines()[1])
    for k in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME", "NCCL_IB_TC", "SGLANG_EXTRA"):
        assert logged[k] == env.get(k, "1"), k
    assert logged["NCCL_DEBUG_FILE"].startswith(str(tmp_path / "nccl"))


STANDIN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, HTTPServer
    mode, port, pidfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    child = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(pidfile, "w").write(str(child.pid))
    print("stand-in starting; loading weights", flush=True)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "never":
        time.sleep(600)
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a): pass
    HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


@pytest.mark.parametrize("mode", ["normal", "stubborn"])
def test_stop_leaves_no_orphans(tmp_path, mode):
    pidfile = tmp_path / "child.pid"
    port = free_port()
    spec = ServerSpec(adapter="standin", port=port, ready_timeout_s=30, stop_timeout_s=1)
    argv = [sys.executable, "-c", STANDIN, mode, str(port), str(pidfile)]
    with ManagedServer(spec, Launch(argv, {}, "m"), tmp_path, dict(os.environ)) as srv:
        leader = srv.proc.pid
        child = int(pidfile.read_text())
        assert alive(child)
    # The grandchild ignores SIGTERM (and in "stubborn" the leader too): KILL follows.
    assert not alive(leader) and not alive(child)


def test_ready_timeout_shows_log_tail(tmp_path):
    pidfile = tmp_path / "child.pid"
    port = free_port()
    spec = ServerSpec(adapter="standin", port=port, ready_timeout_s=2, stop_timeout_s=1)
    argv = [sys.executable, "-c", STANDIN, "never", str(port), str(pidfile)]
    t = time.monotonic()
    with pytest.raises(UsageError) as e:
        with ManagedServer(spec, Launch(argv, {}, "m"), tmp_path, dict(os.environ)):
            pass
    assert time.monotonic() - t < 15
    msg = str(e.value)
    assert "did not answer 200" in msg and "ready_timeout_s=2" in msg and "loading weights" in msg
    assert not alive(int(pidfile.read_text()))


def _client_holding_a_server(tmp_path, restore_sigint: bool):
    """A real client process that holds a ManagedServer: (client, server leader pid, its
    grandchild's pid) once the server is ready."""
    pidfile = tmp_path / "child.pid"
    port = free_port()
    # A shell that starts jobs in the background without job control hands them SIGINT
    # ignored, and Python keeps it so; the process under test is a user's Ctrl-C-able one.
    restore = "signal.signal(signal.SIGINT, signal.default_int_handler)" if restore_sigint else ""
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        {restore}
        sys.path.insert(0, {os.path.abspath(os.path.join(CONF, '..'))!r})
        from workloads.inference.adapters.base import ServerSpec, Launch
        from workloads.inference.adapters.orchestrator import ManagedServer
        spec = ServerSpec(adapter="standin", port={port}, ready_timeout_s=30, stop_timeout_s=1)
        argv = [sys.executable, "-c", {STANDIN!r}, "normal", "{port}", {str(pidfile)!r}]
        with ManagedServer(spec, Launch(argv, {{}}, "m"), {str(tmp_path)!r}, dict(os.environ)) as s:
            print("READY", s.proc.pid, flush=True)
            time.sleep(600)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("READY"), line
    return p, int(line.split()[1]), int(pidfile.read_text())


def test_ctrl_c_stops_the_server_group(tmp_path):
    """A real SIGINT to a process that holds a ManagedServer: no orphan survives."""
    p, leader, child = _client_holding_a_server(tmp_path, restore_sigint=True)
    p.send_signal(signal.SIGINT)
    p.wait(30)
    assert not alive(leader) and not alive(child)


def test_sigkilled_client_takes_its_server_down(tmp_path):
    """SIGKILL cannot be caught, so the client cannot stop its server: the watchdog between
    them notices the parent's death and stops the whole group (leader and grandchild)."""
    p, leader, child = _client_holding_a_server(tmp_path, restore_sigint=False)
    p.kill()
    p.wait(30)
    deadline = time.monotonic() + 20
    while (alive(leader) or alive(child)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(leader) and not alive(child)


def test_a_taken_port_is_refused_and_named(tmp_path):
    from workloads.testing.scripted_server import Running

    with Running() as url:
        port = int(url.rsplit(":", 1)[1])
        spec = ServerSpec(adapter="standin", port=port, ready_timeout_s=10, stop_timeout_s=1)
        argv = [sys.executable, "-c", STANDIN, "normal", str(port), str(tmp_path / "pid")]
        with pytest.raises(UsageError, match=rf"server.port={port} .*taken by pid \d+: .*scripted_server"):
            with ManagedServer(spec, Launch(argv, {}, "m"), tmp_path, dict(os.environ)):
                pass
        assert not (tmp_path / "pid").exists()  # nothing was started


def test_a_server_outside_our_child_is_not_measured(tmp_path):
    """The port is free when we check, then another process (started here, beside ours, as a
    second user's server would be) answers first: refused after readiness, not measured."""
    import threading

    port = free_port()
    spec = ServerSpec(adapter="standin", port=port, ready_timeout_s=60, stop_timeout_s=1)
    stray = []

    def start_stray():
        while not (tmp_path / "server" / "standin.log").exists():
            time.sleep(0.02)
        stray.append(subprocess.Popen([sys.executable, "-m", "workloads.testing.scripted_server", "--port", str(port)],
                                      stdout=subprocess.DEVNULL))

    t = threading.Thread(target=start_stray)
    t.start()
    try:
        with pytest.raises(UsageError, match=r"answered by another process \(pid \d+: .*scripted_server"):
            with ManagedServer(spec, Launch(["sleep", "600"], {}, "m"), tmp_path, dict(os.environ)):
                pass
    finally:
        t.join()
        stray[0].kill()


def test_the_reference_engine_must_echo_this_runs_token(tmp_path):
    """Our own child answers, but not as the reference engine started for this run."""
    port = free_port()
    spec = ServerSpec(adapter="reference", port=port, ready_timeout_s=20, stop_timeout_s=1)
    argv = [sys.executable, "-m", "workloads.testing.scripted_server", "--port", str(port)]
    with pytest.raises(UsageError, match="lacks this run's token"):
        with ManagedServer(spec, Launch(argv, {}, "m"), tmp_path, dict(os.environ)):
            pass


def test_server_log_first_line_hides_secrets(tmp_path):
    port = free_port()
    spec = ServerSpec(adapter="standin", port=port, ready_timeout_s=1, stop_timeout_s=1)
    argv = [sys.executable, "-c", "pass", "+fabric.env.HF_TOKEN=hf_secret123"]
    with pytest.raises(UsageError):
        with ManagedServer(spec, Launch(argv, {}, "m"), tmp_path, dict(os.environ)):
            pass
    first = (tmp_path / "server" / "standin.log").read_text().splitlines()[0]
    assert "hf_secret123" not in first and "+fabric.env.HF_TOKEN=<redacted>" in first


ENGINE_THAT_LEAKS = textwrap.dedent("""
    import os, sys, time, traceback
    token, key = os.environ["FAKE_TRACE_TOKEN"], os.environ["MY_SERVICE_API_KEY"]
    print("engine starting: ordinary line", flush=True)
    sys.stdout.buffer.write(b"raw bytes \\xff\\xfe end\\n"); sys.stdout.flush()
    sys.stdout.write("split across writes " + token[:9]); sys.stdout.flush()
    time.sleep(0.3)  # the watchdog reads the first half alone
    sys.stdout.write(token[9:] + " rest\\n"); sys.stdout.flush()
    try:
        raise RuntimeError(f"login refused for {token} (key {key})")
    except RuntimeError:
        traceback.print_exc()
    sys.stderr.write(f"last words without a newline, key={key}"); sys.stderr.flush()
    os._exit(3)
""")


def test_engine_output_reaches_the_log_redacted(tmp_path):
    """What an engine prints itself (a traceback holding an hf_ token and the value of a
    secret-named variable of its environment) is redacted on its way through the watchdog
    into the server log; ordinary lines, bytes that are not UTF-8 and the last words of a
    dying engine still arrive, and so reach the orchestrator's error."""
    import uuid

    token = "hf_" + uuid.uuid4().hex  # token-shaped, made here: no real key
    key = "s3cr3t-" + uuid.uuid4().hex[:12]  # no known credential shape: hidden as the variable's value
    env = dict(os.environ, FAKE_TRACE_TOKEN=token, MY_SERVICE_API_KEY=key)
    spec = ServerSpec(adapter="leaky", port=free_port(), ready_timeout_s=30, stop_timeout_s=1)
    with pytest.raises(UsageError, match="exited with code 3 before it was ready") as e:
        with ManagedServer(spec, Launch([sys.executable, "-c", ENGINE_THAT_LEAKS], {}, "m"), tmp_path, env):
            pass
    text = (tmp_path / "server" / "leaky.log").read_text()
    for shown in (text, str(e.value)):
        assert token not in shown and key not in shown and token[9:] not in shown
        assert "RuntimeError: login refused for <redacted> (key <redacted>)" in shown, shown
        assert shown.rstrip().endswith("last words without a newline, key=<redacted>"), shown
    assert "engine starting: ordinary line\n" in text
    assert "raw bytes \ufffd\ufffd end\n" in text
    assert "split across writes <redacted> rest\n" in text


@pytest.mark.slow
def test_engine_versions_come_from_the_engines_interpreter(tmp_path):
    import sys

    from workloads.inference.engine_info import engine_versions, interpreter_of

    ours = engine_versions([sys.executable, "-m", "torch.distributed.run"])  # the reference engine
    assert ours["python"] == sys.executable and ours["torch"] == torch.__version__
    # a console script (`vllm`) runs on the interpreter of its shebang
    cli = tmp_path / "vllm"
    cli.write_text(f"#!{sys.executable}\nprint('serve')\n")
    cli.chmod(0o755)
    assert interpreter_of(str(cli)) == sys.executable
    assert engine_versions([str(cli), "serve", "m"])["torch"] == torch.__version__
    assert engine_versions(None) is None  # an external server: nothing started, nothing to ask
    assert "cannot tell" in engine_versions([str(tmp_path / "missing")])["error"]


def test_which_engines_span_emulated_nodes_is_each_adapters_own_say():
    """launch/emulate.py asks the adapter (spans_emulated_nodes): TP engines split their degree
    evenly over the nodes, P/D puts one instance per node, an external server spans nothing."""
    from workloads.inference.adapters import check_emulated

    for name in ("reference", "vllm", "sglang"):
        check_emulated({"adapter": name, "tp": 4}, 2)
        with pytest.raises(UsageError, match=re.escape("server.tp=3 cannot span 2 emulated nodes evenly; use server.tp=2")):
            check_emulated({"adapter": name, "tp": 3}, 2)
    with pytest.raises(UsageError, match="server.tp=null cannot span"):
        check_emulated({"adapter": "vllm", "tp": None}, 2)
    check_emulated({"adapter": "vllm_pd", "tp": 1}, 2)
    with pytest.raises(UsageError, match="use 2 emulated nodes, not 3"):
        check_emulated({"adapter": "vllm_pd", "tp": 1}, 3)
    with pytest.raises(UsageError, match=re.escape("server=external does not run across emulated nodes here; use "
                                                   "server=reference or server=sglang or server=vllm or server=vllm-pd")):
        check_emulated({"adapter": "external"}, 2)
