"""Training metrics against hand-computed values (formulas: docs/metrics.md)."""

import math
from pathlib import Path

import pytest
import torch

from helpers import REPO
from workloads.core.ports import free_port
from workloads.models.neox import pad_vocab_size
from workloads.training.metrics import (
    ModelShape,
    flops_per_iteration,
    peak_tflops_for,
    summarize_training,
    tflops_per_gpu,
)

V = 50304  # GPT-2 BPE 50257 padded to a multiple of 128


def per_sample(L, h, ckpt, s=2048, V=V):
    return flops_per_iteration(global_batch=1, seq_length=s, num_layers=L, hidden_size=h, padded_vocab=V,
                               checkpoint_activations=ckpt)


def test_vocab_padding_as_gpt_neox():
    assert pad_vocab_size(50257) == 50304
    assert pad_vocab_size(50277) == 50304  # Pythia's tokenizer
    assert pad_vocab_size(50304) == 50304
    assert pad_vocab_size(50257, 128, tp=8) == 51200  # multiple of 1024


def test_design_worked_value_1p3b_with_checkpointing():
    # docs/metrics.md: GPT-NeoX 1.3B (L=24, h=2048, s=2048, V=50304), checkpointing -> 2.436e13 per sample.
    assert per_sample(24, 2048, True) == pytest.approx(2.436e13, rel=5e-4)


@pytest.mark.parametrize(
    "L,h,ckpt,expected",
    [
        # 24·3·2048·12·768² = 1.043677052928e12; × (1 + 2048/4608 + 50304/147456) = ×1.78559028 -> 1.863580e12
        (12, 768, False, 1.863580e12),
        # 24·3·2048·24·2048² = 1.4843406974976e13; × 1.23063151 -> 1.826676e13
        (24, 2048, False, 1.826676e13),
        # 24·3·2048·32·2560² = 3.09237645312e13; × (1 + 2048/15360 + 50304/1310720) = ×1.17171224 -> 3.623375e13
        (32, 2560, False, 3.623375e13),
        # 24·4·2048·32·4096² = 1.05553116266496e14; × (1 + 2048/24576 + 50304/2097152) = ×1.10732015 -> 1.168811e14
        (32, 4096, True, 1.168811e14),
    ],
)
def test_flops_other_sizes(L, h, ckpt, expected):
    assert per_sample(L, h, ckpt) == pytest.approx(expected, rel=1e-6)


def test_flops_scale_linearly_with_batch_and_checkpointing_is_four_thirds():
    one = per_sample(24, 2048, False)
    assert flops_per_iteration(global_batch=16, seq_length=2048, num_layers=24, hidden_size=2048, padded_vocab=V,
                               checkpoint_activations=False) == pytest.approx(16 * one)
    assert per_sample(24, 2048, True) / one == pytest.approx(4 / 3)


def test_tflops_per_gpu_and_summary():
    # 8 GPUs, global batch 32 of 1.3B at 2048 tokens, 2.0 s per iteration:
    # 32 × 2.435569e13 / (2.0 × 8) / 1e12 = 48.711 TFLOPS/GPU
    flops = 32 * per_sample(24, 2048, True)
    assert tflops_per_gpu(flops, 2.0, 8) == pytest.approx(48.7114, rel=1e-4)

    steps = [9.0, 9.0, 2.0, 2.1, 1.9, 2.0]  # two warm-up steps are excluded
    shape = ModelShape(global_batch=32, seq_length=2048, num_layers=24, hidden_size=2048, padded_vocab=V,
                       checkpoint_activations=True)
    s = summarize_training(step_times_s=steps, warmup_steps=2, shape=shape, world_size=8, peak_tflops=989.0,
                           comm_times_s=[0, 0, 0.5, 0.5, 0.5, 0.5])
    assert s.iteration_time_s == pytest.approx(2.0)
    assert s.samples_per_sec == pytest.approx(16.0)
    assert s.tokens_per_sec == pytest.approx(16.0 * 2048)
    assert s.tflops_per_gpu == pytest.approx(48.7114, rel=1e-4)
    # MFU uses f = 3 even with checkpointing: 32 × 1.826676e13 / 16 / 1e12 / 989 = 0.036939
    assert s.mfu == pytest.approx(32 * 1.826676e13 / 16 / 1e12 / 989.0, rel=1e-5)
    assert s.comm_share == pytest.approx(2.0 / 8.0)
    assert s.as_metrics()["mfu_peak(TFLOPS)"] == 989.0
    assert s.measured_steps == 4
    assert math.isclose(s.iteration_time_std_s, 0.0816497, rel_tol=1e-4)


def test_no_timed_steps_is_an_error():
    with pytest.raises(ValueError, match="no timed steps"):
        summarize_training(step_times_s=[1.0], warmup_steps=1, shape=ModelShape(1, 8, 1, 8, 128, False), world_size=1,
                           peak_tflops=None)


def test_peak_table_and_override():
    assert peak_tflops_for("NVIDIA H200") == 989.0
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops_for("AMD Instinct MI300X") == 1300.0
    assert peak_tflops_for("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops_for("Some CPU") is None
    # Other boards of the same chip have other peaks: no MFU rather than a wrong one.
    assert peak_tflops_for("NVIDIA H100 PCIe") is None
    assert peak_tflops_for("NVIDIA H100 NVL") is None
    assert peak_tflops_for("NVIDIA H100 PCIe", override=756) == 756.0
    # The table is bf16/fp16 dense: an fp32 run gets no MFU unless the user gives its peak.
    assert peak_tflops_for("NVIDIA H200", precision="fp32") is None
    assert peak_tflops_for("NVIDIA H200", precision="fp16") == 989.0
    assert peak_tflops_for("NVIDIA H200", override=67, precision="fp32") == 67.0
    assert peak_tflops_for("NVIDIA H200", override=700) == 700.0


def _grad_bytes_rank(rank: int, tmp: str, engine: str, port: int) -> None:
    import json
    import os

    import torch.distributed as dist
    import yaml as _yaml

    from workloads.core import dist as fdist
    from workloads.models.neox import GPTNeoX, NeoXConfig
    from workloads.training.commtimer import CommTimer
    from workloads.training.engines import TrainSettings, build_engine

    # DeepSpeed reads the launcher's variables, as torchrun sets them
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    conf = REPO / "conf"
    torch.manual_seed(0)
    model = GPTNeoX(NeoXConfig.from_dict(_yaml.safe_load((conf / "model" / "neox-tiny.yaml").read_text())))
    timer = CommTimer(torch.device("cpu"))
    eng = build_engine(_yaml.safe_load((conf / "parallel" / f"{engine}.yaml").read_text()), model,
                       TrainSettings(2, 1, 1e-3, 0.0, 1.0, "bf16", False), torch.device("cpu"))
    x = torch.randint(0, 1000, (2, 16))
    with timer.active():
        timer.begin_step()
        eng.step([(x, x)])
        timer.end_step()
    if rank == 0:
        Path(tmp, f"{engine}.json").write_text(json.dumps(timer.step_bytes))
    fdist.end_group_and_exit()


@pytest.mark.slow
def test_bf16_ddp_moves_fp32_gradients_and_zero_moves_bf16(tmp_path):
    """Two real Gloo ranks per engine, precision bf16: DDP all-reduces fp32 buckets (autocast
    keeps fp32 parameters), DeepSpeed ZeRO-1 reduces bf16 (it casts the model): half the bytes."""
    import json

    import torch.multiprocessing as mp

    from workloads.training.commtimer import comm_dtypes

    seen = {}
    for engine in ("ddp", "zero1"):
        mp.spawn(_grad_bytes_rank, args=(str(tmp_path), engine, free_port()), nprocs=2)
        seen[engine] = json.loads((tmp_path / f"{engine}.json").read_text())
    assert comm_dtypes([seen["ddp"]], 0)["dtype"] == "float32"
    assert comm_dtypes([seen["zero1"]], 0)["dtype"] == "bfloat16"
    assert seen["ddp"]["float32"] == 2 * seen["zero1"]["bfloat16"]


def test_comm_dtypes_worked_values():
    from workloads.training.commtimer import comm_dtypes, payload

    steps = [{"float32": 100}, {"float32": 800, "uint8": 1}, {"float32": 1000, "int64": 8}]
    assert comm_dtypes(steps, 1) == {"bytes_per_step_by_dtype": {"float32": 900.0, "int64": 4.0, "uint8": 0.5},
                                     "dtype": "float32"}
    assert comm_dtypes([], 0) == {"bytes_per_step_by_dtype": {}, "dtype": None}
    a, b = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(8)
    assert payload("all_reduce", (a,), {}) is a and payload("reduce_scatter_tensor", (b, a), {}) is a
    assert payload("all_gather_into_tensor", (), {"output_tensor": b, "input": a}) is a
