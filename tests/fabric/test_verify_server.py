"""Transport verdicts for servers that run in other processes (inference workload).

SGLang and vLLM cannot run here (GPU-only): their NCCL INFO logs are stood in for by the
fixture logs written from NCCL's documented formats, placed where the server's
NCCL_DEBUG_FILE would put them (<run dir>/nccl/). The reference engine's own report is
exercised for real in tests/inference/test_sweep.py (TP=2 over Gloo).
"""

import shutil
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from helpers import FIXTURES, REPO
from helpers.profiles import NCCL_LOGS
from workloads.fabric import verify_server
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify_server import report_transport, server_transport

FIX = FIXTURES / "nccl_logs"
CONF = REPO / "conf"


def profile(name: str) -> FabricProfile:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"fabric={name}"])
    return FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))


def run_dir_with(tmp_path: Path, fixture: str) -> Path:
    shutil.copytree(FIX / fixture, tmp_path / "nccl")
    return tmp_path


def test_server_nccl_logs_decide_the_verdict(tmp_path):
    ok = server_transport(profile("roce"), run_dir_with(tmp_path / "a", "nccl_roce"))
    assert ok["verdict"] == "ok" and ok["summary"]["networks"] == ["IB"]
    assert {d["link_layer"] for d in ok["summary"]["devices"]} == {"RoCE"}

    bad = server_transport(profile("roce"), run_dir_with(tmp_path / "b", "nccl_socket_fallback"))
    assert bad["verdict"] == "mismatch"
    assert bad["message"].startswith("fabric=roce but") and "NET/Socket" in bad["message"]


def test_training_summary_line_reads_both_kinds():
    from workloads.training.run import _transport_line

    roce = server_transport(profile("roce"), run_dir_with(Path(__import__("tempfile").mkdtemp()), "nccl_roce"))
    assert _transport_line(roce) == "ok: IB mlx5_0:1/RoCE,mlx5_1:1/RoCE [NET/IB x4]"
    gloo = {"verdict": "ok", "summary": {"network": "Socket", "interfaces": ["lo"]}}
    assert _transport_line(gloo) == "ok: Socket lo"
    assert _transport_line(None) == "not verified"


def test_no_evidence_is_unverified_not_ok(tmp_path):
    res = server_transport(profile("roce"), tmp_path)
    assert res["verdict"] == "unverified" and "external server is never verified" in res["message"]
    off = FabricProfile("roce", "nccl", verify="off")
    assert server_transport(off, tmp_path)["verdict"] == "off"


def test_a_server_report_wins_over_logs(tmp_path):
    target = tmp_path / "server" / "transport.json"
    report_transport({"verdict": "ok", "summary": {"network": "Socket"}},
                     environ={"FABRICBENCH_TRANSPORT_FILE": str(target)})
    res = server_transport(profile("roce"), run_dir_with(tmp_path, "nccl_socket_fallback"), reported=target)
    assert res == {"verdict": "ok", "summary": {"network": "Socket"}}


# ---------------------------------------------------------------------------------------
# Gloo ranks that are other processes (vLLM's workers on CPU): real torch.distributed ranks
# in one process group with a non-rank leader, as the orchestrator starts a server.

RANK = """
import sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=int(sys.argv[1]), world_size=2)
dist.all_reduce(torch.ones(4))
print("ready", flush=True)
time.sleep(300)
"""


LEADER = """
import subprocess, sys, time
ranks = [subprocess.Popen([sys.executable, "-c", sys.argv[1], str(r), sys.argv[2]], stdout=subprocess.PIPE, text=True)
         for r in (0, 1)]
ok = all(p.stdout.readline().strip() == "ready" for p in ranks)
print("ready" if ok else "failed", *(p.pid for p in ranks), flush=True)
time.sleep(300)
"""


def _gloo_server(env: dict) -> tuple:
    """A leader in its own session (like the orchestrator's server) that starts two ranks."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    leader = subprocess.Popen([sys.executable, "-c", LEADER, RANK, port], start_new_session=True, text=True,
                              stdout=subprocess.PIPE, env=dict(os.environ, OMP_NUM_THREADS="1") | env)
    word, *pids = leader.stdout.readline().split()
    assert word == "ready"
    return leader, [int(p) for p in pids]


def _stop(leader, ranks):
    import os
    import signal

    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(30)


def test_gloo_server_ranks_from_their_own_sockets_and_env(tmp_path):
    """A: the fabric's env and interface -> ok, the two ranks found among three processes,
    each with its pid and env. B (same fabric, ranks started without its env) -> mismatch."""
    from workloads.inference.adapters.watchdog import family

    lo = profile("loopback")
    leader, ranks = _gloo_server({"GLOO_SOCKET_IFNAME": "lo"})
    try:
        pids = sorted(family(leader.pid))
        assert sorted(pids) == sorted([leader.pid, *ranks])
        ok = server_transport(lo, tmp_path, pids=pids, ranks=2)
        short = server_transport(lo, tmp_path, pids=pids, ranks=4)
    finally:
        _stop(leader, ranks)
    assert ok["verdict"] == "ok", ok["message"]
    got = ok["summary"]["ranks"]
    assert sorted(r["pid"] for r in got) == sorted(ranks)
    assert all(r["interfaces"] == ["lo"] and r["peer_connections"] >= 1 for r in got)
    assert all(r["env"] == {"GLOO_SOCKET_IFNAME": "lo"} for r in got)
    assert short["verdict"] == "unverified" and "found in 2 of the server's processes, not its 4 ranks" in short["message"]

    leader, ranks = _gloo_server({"GLOO_SOCKET_IFNAME": ""})
    try:
        bad = server_transport(lo, tmp_path, pids=sorted(family(leader.pid)), ranks=2)
    finally:
        _stop(leader, ranks)
    assert bad["verdict"] == "mismatch" and "lack the fabric's GLOO_SOCKET_IFNAME=lo" in bad["message"]


def test_server_transport_needs_one_log_per_rank(tmp_path):
    import shutil

    shutil.copytree(NCCL_LOGS / "nccl_roce", tmp_path / "nccl")
    ok = verify_server.server_transport(profile("roce"), tmp_path, ranks=2)
    assert ok["verdict"] == "ok"
    short = verify_server.server_transport(profile("roce"), tmp_path, ranks=4)
    assert short["verdict"] == "unverified" and "2 of 4 rank log(s)" in short["message"]


def test_server_transport_ignores_logs_of_an_earlier_server(tmp_path):
    import os
    import shutil
    import time

    shutil.copytree(NCCL_LOGS / "nccl_socket_fallback", tmp_path / "nccl")
    for p in (tmp_path / "nccl").iterdir():
        os.utime(p, (time.time() - 3600, time.time() - 3600))  # a resumed run's old server
    shutil.copy(NCCL_LOGS / "nccl_roce" / "nccl.node1.4100.log", tmp_path / "nccl")
    shutil.copy(NCCL_LOGS / "nccl_roce" / "nccl.node2.4101.log", tmp_path / "nccl")
    d = verify_server.server_transport(profile("roce"), tmp_path, ranks=2, since=time.time() - 60)
    assert d["verdict"] == "ok" and d["summary"]["processes"] == 2


def test_server_verdict_names_the_rank_that_went_wrong(tmp_path):
    """Two TP ranks of a server on two hosts; the logs sort by host name (a-node before
    b-node) while rank 1 lives on a-node and fell back to sockets: the message must say
    rank 1, which is what an operator looks for in that rank's log."""
    from helpers.profiles import profile
    from workloads.fabric import verify_server

    logs = tmp_path / "nccl"
    logs.mkdir()
    for host, rank, via, net in (("a-node", 1, "NET/Socket/0", "Socket"), ("b-node", 0, "NET/IB/0/GDRDMA", "IB")):
        p = f"{host}:900:950 [0] NCCL INFO "
        (logs / f"nccl.{host}.900.log").write_text("\n".join([
            p + "NCCL version 2.21.5+cuda12.4",
            p + "NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB eth0:10.0.0.1<0>",
            p + f"Using network {net}",
            p + f"comm 0x55d1 rank {rank} nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x4 - Init COMPLETE",
            p + f"Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via {via}", ""]))
    d = verify_server.server_transport(profile("roce"), tmp_path, ranks=2)
    assert d["verdict"] == "mismatch"
    assert "rank 1 used NET/Socket" in d["message"] and "rank 0" not in d["message"], d["message"]
    assert [r["rank"] for r in d["summary"]["ranks"]] == [0, 1]
