"""Transport verdicts for servers that run in other processes (inference workload).

SGLang and vLLM cannot run here (GPU-only): their NCCL INFO logs are stood in for by the
fixture logs written from NCCL's documented formats, placed where the server's
NCCL_DEBUG_FILE would put them (<run dir>/nccl/). The reference engine's own report is
exercised for real in tests/test_infer_sweep.py (TP=2 over Gloo).
"""

import json
import shutil
from pathlib import Path

from omegaconf import OmegaConf
from hydra import compose, initialize_config_dir

from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify import report_transport, server_transport

FIX = Path(__file__).parent / "fixtures" / "nccl_logs"
CONF = Path(__file__).resolve().parent.parent / "conf"


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
