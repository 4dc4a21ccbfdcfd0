"""launch/gpu_check.py without a GPU: the table it prints, the exit code on a mismatch, what
each step's records must say, and that every step's command line composes with the real
configs. The steps themselves need CUDA GPUs (the README says they have not run on one)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "launch"))

import gpu_check  # noqa: E402


def train_record(dtype="float32", verdict="ok", mfu=0.42, world=8):
    return {"status": "ok", "world": {"world_size": world}, "comm": {"dtype": dtype},
            "metrics": {"mfu": mfu, "mfu_peak(TFLOPS)": 989.0, "tflops_per_gpu": 415.4},
            "fabric": {"transport": {"verdict": verdict, "message": None if verdict == "ok" else "x"}}}


def coll_record(ours=180.0, theirs=200.0, wrong=0, ext_status="ok"):
    size = 268435456
    cell = lambda bw: {"time_us": 1.0, "algbw": bw, "busbw": bw, "wrong": 0}  # noqa: E731
    return {"status": "ok", "metrics": {"wrong_elements": wrong, "avg_busbw(GB/s)": 120.0},
            "fabric": {"transport": {"verdict": "ok"}},
            "rows": [{"op": "all_reduce", "size": size, "in_place": cell(ours), "out_of_place": None}],
            "external": {"status": ext_status, "rows": [{"size": size, "in_place": cell(theirs), "out_of_place": cell(theirs)}]}}


def serve_record(point="c1", failed=0):
    return {"status": "ok", "point": point, "metrics": {"completed": 32 - failed, "failed": failed,
                                                       "output_throughput": 900.0},
            "fabric": {"transport": {"verdict": "ok"}}}


def all_rows(**over):
    return (gpu_check.train_rows("train/ddp", "ddp", over.get("ddp", train_record()))
            + gpu_check.train_rows("train/zero1", "zero1", over.get("zero1", train_record("bfloat16")))
            + gpu_check.collectives_rows(over.get("coll", coll_record()))
            + gpu_check.serve_rows("serve/tp2", over.get("serve", [serve_record("c1"), serve_record("c8")])))


def test_a_healthy_machine_is_all_ok_and_exits_0():
    rows = all_rows()
    assert [r.status for r in rows].count("MISMATCH") == 0 and gpu_check.exit_code(rows) == 0
    table = gpu_check.render(rows, "8 x NVIDIA H100 80GB HBM3")
    assert table.splitlines()[0] == "# gpu-check on 8 x NVIDIA H100 80GB HBM3"
    assert table.splitlines()[-1] == f"# {len(rows)} of {len(rows)} checks ok"
    ext = next(r for r in rows if r.check == "collectives vs all_reduce_perf")
    assert ext.result == "180.00 vs 200.00 GB/s at 268435456 B (0.90x)" and ext.status == "ok"


@pytest.mark.parametrize("over, check", [
    ({"ddp": train_record("bfloat16")}, "train/ddp gradient dtype"),
    ({"zero1": train_record("float32")}, "train/zero1 gradient dtype"),
    ({"ddp": train_record(verdict="mismatch")}, "train/ddp transport"),
    ({"coll": coll_record(ours=100.0)}, "collectives vs all_reduce_perf"),
    ({"coll": coll_record(wrong=3)}, "collectives wrong elements"),
    ({"serve": [serve_record("c1", failed=2)]}, "serve/tp2 point c1"),
    ({"zero1": None}, "train/zero1"),
])
def test_any_mismatch_exits_1_and_names_its_row(over, check):
    rows = all_rows(**over)
    bad = [r.check for r in rows if r.status == "MISMATCH"]
    assert bad == [check] and gpu_check.exit_code(rows) == 1
    assert "1 MISMATCH" in gpu_check.render(rows, "m").splitlines()[-1]


def test_what_is_not_a_mismatch():
    # no all_reduce_perf on PATH, an unknown GPU (no MFU), one GPU (no gradient collective)
    rows = all_rows(coll=coll_record(ext_status="skipped"), ddp=train_record(mfu=None, dtype=None, world=1))
    assert gpu_check.exit_code(rows) == 0
    na = {r.check for r in rows if r.status == "n/a"}
    assert {"collectives vs all_reduce_perf", "train/ddp MFU", "train/ddp gradient dtype"} <= na


def test_every_step_composes_with_the_real_configs(tmp_path):
    from hydra import compose, initialize_config_dir

    from workloads.core import rundir

    rundir.register_resolvers()
    names = {"launch/train.py": "config", "launch/collectives.py": "config", "launch/infer.py": "infer"}
    for name, argv, limit in gpu_check.steps(2, "intranode", tmp_path):
        overrides = [a for a in argv[1:]]
        if argv[0] == "launch/collectives.py":
            overrides.append("workload=collectives")
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            cfg = compose(config_name=names[argv[0]], overrides=overrides)
        assert cfg.fabric.name == "intranode" and cfg.fabric.backend == "nccl", name
        assert limit <= 180
    assert sum(limit for _, _, limit in gpu_check.steps(8, "intranode", tmp_path)) < 600  # the 10-minute budget


def test_without_a_gpu_it_says_so_in_one_line():
    r = subprocess.run([sys.executable, str(ROOT / "launch" / "gpu_check.py")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("gpu-check: no GPU here") and len(r.stderr.strip().splitlines()) == 1
