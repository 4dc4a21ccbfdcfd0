"""gpu-check's MoE row without a GPU: what a healthy and a wrong MoE training record print,
in the style of tests/commands/test_gpu_check.py (records in, rows out), and that the step composes."""


import pytest

from workloads.commands import gpu_check

MOE = {"num_experts": 8, "top_k": 2, "capacity_factor": 1.25, "aux_loss_coef": 0.01, "expert_ffn_size": None,
       "activation": "gelu"}
SHAPE = {"name": "neox-moe-125m", "num_layers": 12, "hidden_size": 768, "padded_vocab": 50304,
         "intermediate_size": None, "moe": MOE}


def moe_record(ep=8, it=0.5, share=0.3, busbw=None, skew=1.4, reported_tflops=None):
    from workloads.training.metrics import moe_flops_per_iteration

    world = 8
    flops = moe_flops_per_iteration(global_batch=2 * world, seq_length=2048, num_layers=12, hidden_size=768,
                                    padded_vocab=50304, checkpoint_activations=False, num_experts=8, top_k=2,
                                    expert_ffn_size=4 * 768, gated=False)
    per_step, a2a_t = 4.0e8, share * it
    return {"status": "ok", "world": {"world_size": world, "nodes": 1, "local_world_size": world},
            "model": SHAPE, "batch": {"global_batch_size": 2 * world, "seq_length": 2048},
            "config": {"train": {"precision": "bf16", "activation_checkpointing": False}, "metrics": {}},
            "samples": {"step_time_s": [3 * it, 2 * it] + [it] * 6, "warmup_steps": 2},
            "fingerprint": {"gpu": "NVIDIA H100 80GB HBM3"},
            "fabric": {"transport": {"verdict": "ok", "summary": {"graph_types": ["NVL"]}}},
            "metrics": {"tflops_per_gpu": reported_tflops or flops / (it * world) / 1e12, "expert_parallel": ep,
                        "alltoall_share": share, "dispatch_share": share / 2, "combine_share": share / 2,
                        "alltoall_time_per_step(s)": a2a_t, "alltoall_bytes_per_step(B)": per_step,
                        "alltoall_busbw(GB/s)": busbw if busbw is not None else per_step / a2a_t / 1e9 * (ep - 1) / ep,
                        "routing_skew": skew}}


def test_a_healthy_moe_record_is_all_ok():
    rows = gpu_check.moe_rows("train/moe", moe_record())
    assert [r.status for r in rows] == ["ok"] * 4 + ["n/a"], gpu_check.render(rows, "m")
    a2a = next(r for r in rows if r.check == "train/moe all-to-all")
    # 4e8 B / 0.15 s = 2.667 GB/s algbw, x 7/8 = 2.33 GB/s; an H100's NVLink top 1.2 x 450 = 540
    assert a2a.result == "30.0% of step (dispatch 15.0%, combine 15.0%), 2.33 GB/s busbw, EP=8"
    assert a2a.expected == "share in (0, 1), busbw <= 540 GB/s, no floor" and "nccl-tests#212" in a2a.source
    # the skew is shown, not judged: between 1 and E by arithmetic
    skew = rows[-1]
    assert skew.check == "train/moe routing skew" and skew.result == "1.40 max/mean tokens per expert"


@pytest.mark.parametrize("rec, check", [
    # a timer that missed the exchange (a host clock around an async call): 5 us for 4e8 B, its
    # share and busbw computed from the same sums, so only a ceiling can tell (70,000 GB/s)
    (moe_record(share=1e-5), "train/moe all-to-all"),
    (moe_record(reported_tflops=1e3), "train/moe TFLOPS/GPU"),      # not the active-expert formula
    (moe_record(share=1.5), "train/moe all-to-all"),
    (None, "train/moe"),
])
def test_a_wrong_moe_figure_is_a_mismatch(rec, check):
    rows = gpu_check.moe_rows("train/moe", rec)
    assert [r.check for r in rows if r.status == "MISMATCH"] == [check] and gpu_check.exit_code(rows) == 1


def test_one_gpu_has_no_all_to_all_and_the_step_asks_for_ep_dividing_8(tmp_path):
    rec = moe_record(ep=1)
    rec["world"]["world_size"] = 7
    rows = gpu_check.moe_rows("train/moe", rec)
    a2a = next(r for r in rows if r.check == "train/moe all-to-all")
    assert a2a.status == "n/a" and a2a.result.startswith("EP=1 (gcd(7, 8) = 1)")
    # no ceiling for the class (a GPU without an NVLink figure): n/a, not an identity called ok
    rec = moe_record()
    rec["fingerprint"]["gpu"] = "NVIDIA L40S"
    a2a = next(r for r in gpu_check.moe_rows("train/moe", rec) if r.check == "train/moe all-to-all")
    assert a2a.status == "n/a" and "no NVLink rate on file" in a2a.source
    for n, ep in ((1, 1), (2, 2), (6, 2), (8, 8)):
        (argv, limit), = [(a, lim) for name, a, lim in gpu_check.steps(n, "intranode", tmp_path) if name == "train/moe"]
        assert f"parallel.expert_parallel={ep}" in argv and "model=neox-moe-125m" in argv and limit <= 180
