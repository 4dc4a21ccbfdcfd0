"""The training workload end to end: real torchrun ranks over Gloo on loopback."""

import re

import numpy as np
import pytest
import torch

from helpers import records_in, run_entry
from workloads.models.hf import save_hf
from workloads.models.neox import GPTNeoX, NeoXConfig
from workloads.training.metrics import flops_per_iteration

FAST = ["train.steps=6", "train.warmup_steps=2"]


@pytest.mark.slow
def test_main_command_trains_two_ranks_and_writes_one_record(out_root):
    # README's `make train` command, shortened: plain python validates, then launches 2 ranks.
    r = run_entry("train.py", f"output_root={out_root}", *FAST)
    assert r.returncode == 0, r.stderr[-3000:]
    for label in ("samples/s", "tokens/s", "TFLOPS/GPU", "comm share"):
        assert label in r.stdout
    (run,) = out_root.iterdir()  # named as docs/records.md says: <time>-p<launcher pid>, no rdzv-<uuid>
    assert re.fullmatch(r"\d{8}-\d{6}-p\d+", run.name), run.name
    (rec,) = records_in(out_root)
    assert rec["status"] == "ok" and rec["error"] is None
    assert rec["workload"] == "pretrain"
    assert rec["fabric"]["name"] == "loopback" and rec["fabric"]["backend"] == "gloo"
    assert rec["fabric"]["env"]["GLOO_SOCKET_IFNAME"] == "lo"
    assert rec["world"] == {"world_size": 2, "nodes": 1, "local_world_size": 2}
    assert rec["batch"]["global_batch_size"] == 8
    assert rec["fingerprint"]["torch"] == torch.__version__
    assert rec["fingerprint"]["git"]["commit"]
    steps = rec["samples"]["step_time_s"]
    assert len(steps) == 6 and len(rec["samples"]["comm_time_s"]) == 6
    m = rec["metrics"]
    # The record's metrics are recomputable from its own raw samples (docs/metrics.md).
    it = float(np.mean(steps[2:]))
    assert m["iteration_time(s)"] == pytest.approx(it)
    assert m["samples_per_sec"] == pytest.approx(8 / it)
    assert m["tokens_per_sec"] == pytest.approx(8 / it * 128)
    assert 0 < m["comm_share"] < 1  # measured: Gloo all_reduce time over step time
    assert m["mfu"] is None  # no peak for a CPU: not guessed


@pytest.mark.slow
def test_zero_stages_in_one_torchrun_multirun(out_root):
    # One torchrun job, three sweep points: the process group is created once and reused.
    r = run_entry("train.py", "-m", "parallel=zero1,zero2,zero3", f"output_root={out_root}", "train.steps=4",
                  "train.warmup_steps=1", "train.grad_accum_steps=2", "train.activation_checkpointing=true",
                  torchrun=2, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records_in(out_root)
    assert sorted(x["config"]["parallel"]["name"] for x in recs) == ["zero1", "zero2", "zero3"]
    assert len({x["run_id"] for x in recs}) == 1  # all points of one job share one run directory
    assert not [p for p in out_root.rglob("records/.inflight/*")]  # each point's in-flight copy went with its record
    for x in recs:
        assert x["status"] == "ok"
        assert x["batch"]["global_batch_size"] == 4 * 2 * 2  # micro x accumulation x world
        m = x["metrics"]
        assert m["samples_per_sec"] == pytest.approx(16 / m["iteration_time(s)"])
        # Activation checkpointing counts the forward twice: f = 4 in GPT-NeoX's formula.
        flops = flops_per_iteration(global_batch=16, seq_length=128, num_layers=2, hidden_size=64,
                                    padded_vocab=1024, checkpoint_activations=True)
        assert m["tflops_per_gpu"] == pytest.approx(flops / (m["iteration_time(s)"] * 2) / 1e12)
        assert m["comm_share"] > 0


@pytest.fixture
def checkpoint_and_tokens(tmp_path):
    torch.manual_seed(3)
    cfg = NeoXConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=500, max_position_embeddings=128)
    ckpt = save_hf(GPTNeoX(cfg), tmp_path / "ckpt")
    tokens = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 500, 20_000, dtype=np.uint16).tofile(tokens)
    bad = tmp_path / "bad.bin"
    np.full(20_000, 9999, dtype=np.uint16).tofile(bad)
    return ckpt, tokens, bad


@pytest.mark.slow
def test_finetune_sweep_from_local_checkpoint_and_failed_record(out_root, checkpoint_and_tokens):
    ckpt, tokens, bad = checkpoint_and_tokens
    r = run_entry("train.py", "-m", "workload=finetune", f"init.checkpoint={ckpt}", "data.kind=tokens",
                  f"data.path={tokens}", "train.seq_length=64", "train.micro_batch_size=1,2", f"output_root={out_root}",
                  *FAST, torchrun=2, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = records_in(out_root)
    assert sorted(x["batch"]["micro_batch_size"] for x in recs) == [1, 2]
    for x in recs:
        assert x["workload"] == "finetune" and x["status"] == "ok"
        assert x["model"]["padded_vocab"] == 512 and x["model"]["num_layers"] == 2  # the checkpoint's shape
        assert x["model"]["name"] == "ckpt"  # what ran: the checkpoint's directory, not model=neox-tiny

    # Token ids beyond the vocabulary are found after init: the run fails, and says why in its record.
    bad_root = out_root.parent / "bad"
    r = run_entry("train.py", "workload=finetune", f"init.checkpoint={ckpt}", "data.kind=tokens", f"data.path={bad}",
                  "train.seq_length=64", f"output_root={bad_root}", *FAST, torchrun=2)
    assert r.returncode != 0
    (rec,) = records_in(bad_root)
    assert rec["status"] == "failed" and "beyond the model's vocabulary" in rec["error"]
    # Each rank prints one line; torchrun then adds its own failure summary, which is
    # outside our process (launch/train.py without torchrun prints the line alone).
    assert "error: token file" in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides,message",
    [
        (["fabric=nosuch"], "Could not find 'fabric/nosuch'"),
        (["model=neox-999b"], "Could not find 'model/neox-999b'"),
        (["train.micro_batch_size=0"], "micro_batch_size must be a positive integer"),
        (["train.global_batch_size=7"], "not divisible by micro_batch_size (4) x world size (2)"),
        (["-m", "train.micro_batch_size=1,0"], "micro_batch_size must be a positive integer"),
    ],
)
def test_bad_input_one_message_before_any_rank(overrides, message, out_root):
    r = run_entry("train.py", *overrides, f"output_root={out_root}", timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
    assert not out_root.exists() or not list(out_root.rglob("*.json"))  # no rank ever started
