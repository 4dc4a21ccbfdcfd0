"""Result records as the workloads write them, built by hand for analysis tests: a training
record at a chosen samples/s, a collectives record with per-op busbw, and synthetic trials with
a known ratio and lognormal noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workloads.core.records import write_record


def train_record(fabric: str, sps: float, mb: int = 4, world: int = 2, trial: int = 0, **over) -> dict:
    rec = {
        "schema": "fabricbench.record/1", "workload": "pretrain", "status": "ok", "run_id": f"{fabric}-{trial}",
        "config": {"fabric": {"name": fabric, "env": {"X": fabric}}, "model": {"name": "neox-tiny"},
                   "parallel": {"name": "ddp"}, "train": {"micro_batch_size": mb, "seq_length": 128, "precision": "fp32"},
                   "run_id": f"{fabric}-{trial}", "output_root": f"/tmp/{fabric}", "trial": trial},
        "model": {"name": "neox-tiny", "num_layers": 2, "hidden_size": 64},
        "fabric": {"name": fabric, "backend": "gloo", "env": {"X": fabric}},
        "world": {"world_size": world, "nodes": 1, "local_world_size": world},
        "batch": {"micro_batch_size": mb, "grad_accum_steps": 1, "global_batch_size": mb * world, "seq_length": 128},
        "fingerprint": {"hostname": f"host-{fabric}", "torch": "2.5.0", "gpu": "NVIDIA H100", "gpu_count": 8,
                        "git": {"commit": "abc", "dirty": False}},
        "metrics": {"samples_per_sec": sps, "tflops_per_gpu": sps / 100, "tokens_per_sec": "<redacted>"},
    }
    for path, v in over.items():
        node = rec
        *parents, leaf = path.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return rec


def synthetic(ratio: float, noise: float, n: int, seed: int) -> list[dict]:
    """n trials of fabric A at 100 samples/s and of B at 100*ratio, lognormal noise `noise`."""
    rng = np.random.default_rng(seed)
    a = 100 * np.exp(rng.normal(0, noise, n))
    b = 100 * ratio * np.exp(rng.normal(0, noise, n))
    return [train_record("a", float(v), trial=i) for i, v in enumerate(a)] + \
           [train_record("b", float(v), trial=i) for i, v in enumerate(b)]


def train(fabric: str, trial: int, **metrics) -> dict:
    return {"schema": "fabricbench.record/1", "workload": "pretrain", "status": "ok", "run_id": f"{fabric}-{trial}",
            "config": {"fabric": {"name": fabric}, "model": {"name": "neox-tiny"}, "trial": trial},
            "fabric": {"name": fabric}, "world": {"world_size": 16, "nodes": 2},
            "batch": {"micro_batch_size": 4, "global_batch_size": 64, "seq_length": 2048},
            "metrics": {"samples_per_sec": 100.0, **metrics}}


def coll(fabric: str, trial: int, world: int = 8, dtype: str = "float", busbw: float = 40.0) -> dict:
    ops = {"all_reduce": busbw, "alltoall": busbw / 4}
    rows = [{"op": op, "size": size, "type": dtype, "group_size": world,
             "out_of_place": {"busbw": bw * k}, "in_place": {"busbw": bw * k * 1.02}}
            for op, bw in ops.items() for size, k in ((1 << 10, 0.1), (1 << 20, 1.0))]
    return {"workload": "collectives", "status": "ok", "run_id": f"{fabric}-{world}-{dtype}-{trial}",
            "config": {"fabric": {"name": fabric}, "trial": trial, "collectives": {"datatype": dtype}},
            "fabric": {"name": fabric}, "world": {"world_size": world, "nodes": world // 8},
            "collectives": {"ops": list(ops), "pattern": "all", "datatype": dtype},
            "metrics": {"avg_busbw(GB/s)": sum(ops.values()) / 2, **{f"{op}/avg_busbw(GB/s)": v for op, v in ops.items()}},
            "rows": rows}


# A driver/CUDA/GPU/torch upgrade between the two mb=8 runs: 4 differing keys, more than the
# 3 the old --allow hint listed.
UPGRADE = {"fingerprint__torch": "2.6.0", "fingerprint__cuda": "12.8", "fingerprint__driver": "570",
           "fingerprint__gpu": "NVIDIA H200"}


def sweep(root: Path) -> None:
    """emu-veth (baseline) and loopback both at mb=4 (compared), a near miss at mb=8 (same
    sweep point, software upgraded in between), and three points only loopback ran."""
    def put(run: str, rec: dict) -> None:
        write_record(root / run / "records", rec, "pretrain")  # the same file name in every run directory

    for i, (base, fab) in enumerate(((100.0, 130.0), (101.0, 131.0), (99.0, 129.0), (100.5, 130.5))):
        put(f"emu-mb4-t{i}", train_record("emu-veth", base, mb=4, trial=i))
        put(f"lo-mb4-t{i}", train_record("loopback", fab, mb=4, trial=i))
    for i in range(2):
        put(f"emu-mb8-t{i}", train_record("emu-veth", 100.0 + i, mb=8, trial=i))
        put(f"lo-mb8-t{i}", train_record("loopback", 120.0 + i, mb=8, trial=i, **UPGRADE))
        put(f"lo-mb1-t{i}", train_record("loopback", 50.0 + i, mb=1, trial=i))
        put(f"lo-mb2-t{i}", train_record("loopback", 70.0 + i, mb=2, trial=i))
        put(f"lo-zero3-t{i}", train_record("loopback", 90.0 + i, mb=4, trial=i, config__parallel__name="zero3"))
