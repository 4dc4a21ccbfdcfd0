"""The MoE layer in-process: routing, the balancing loss, skew, the FLOPs and all-to-all
formulas (worked values by hand), the layout checks, and single-rank vs EP=2 parity in one
spawned 2-rank Gloo job (no torchrun)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from workloads.core.errors import UsageError
from workloads.core.ports import free_port
from workloads.models.moe import ExpertLayout, MoEConfig, MoEMLP, balance_loss, capacity, route, skew
from workloads.testing import moe_parity
from workloads.training.metrics import flops_per_iteration, moe_flops_per_iteration, summarize_moe

# Four tokens, three experts, top-2 (rows: tokens; columns: router probabilities).
PROBS = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.1], [0.7, 0.1, 0.2], [0.2, 0.5, 0.3]])


def test_routing_queues_first_choices_first_and_drops_over_capacity():
    cfg = MoEConfig(num_experts=3, top_k=2, capacity_factor=0.75)
    assert capacity(4, cfg) == 2  # ceil(0.75 * 2 * 4 / 3)
    e, tok, gate, counts = route(PROBS, cfg, 2)
    # First choices queue: t0, t1 -> e0 (t2's first choice e0 is the third: dropped), t3 -> e1;
    # then second choices: t0 -> e1, t1 -> e1 (third: dropped), t2 -> e2, t3 -> e2.
    assert e.tolist() == [0, 0, 1, 1, 2, 2]
    assert tok.tolist() == [0, 1, 3, 0, 2, 3]
    assert counts.tolist() == [3, 3, 2]  # before the cut
    # gates renormalised over the top 2: t0's e0 = 0.6 / 0.9, t3's e1 = 0.5 / 0.8
    assert gate.tolist() == pytest.approx([0.6 / 0.9, 0.5 / 0.9, 0.5 / 0.8, 0.3 / 0.9, 0.2 / 0.9, 0.3 / 0.8])
    # top-1 keeps the raw probability as its gate (Switch)
    _, _, g1, c1 = route(PROBS, MoEConfig(num_experts=3, top_k=1), 4)
    assert c1.tolist() == [3, 1, 0] and sorted(g1.tolist()) == pytest.approx([0.5, 0.5, 0.6, 0.7])


def test_balance_loss_and_skew_worked_values():
    # f = [3, 3, 2] / (2 * 4); P = column means [0.5, 0.325, 0.175]
    # 3 * (0.375 * 0.5 + 0.375 * 0.325 + 0.25 * 0.175) = 3 * 0.353125 = 1.059375
    assert float(balance_loss(PROBS, torch.tensor([3, 3, 2]), 4, 2)) == pytest.approx(1.059375)
    even = torch.full((6, 3), 1 / 3)
    assert float(balance_loss(even, torch.tensor([4, 4, 4]), 6, 2)) == pytest.approx(1.0)  # balanced: 1
    assert skew(torch.tensor([3, 3, 2])) == pytest.approx(3 / (8 / 3))  # 1.125
    assert skew(torch.tensor([8, 0, 0, 0])) == 4.0  # one hot expert: E


def test_layer_equals_a_per_token_loop_when_nothing_is_dropped():
    torch.manual_seed(3)
    for act in ("gelu", "swiglu"):
        cfg = MoEConfig(num_experts=4, top_k=2, capacity_factor=2.0, activation=act)  # cap = N: no drops
        layer = MoEMLP(16, 24, cfg)
        with torch.no_grad():
            for p in (layer.b_in, layer.b_out):
                if p is not None:
                    p.normal_()
        x = torch.randn(2, 5, 16)
        got = layer(x)
        probs = torch.softmax(layer.router(x.reshape(-1, 16)), -1)
        want = torch.zeros(10, 16)
        for t, xt in enumerate(x.reshape(-1, 16)):
            p, ids = probs[t].topk(2)
            for w, i in zip(p / p.sum(), ids.tolist()):
                want[t] += w * layer._expert(i, xt[None])[0]
        assert torch.allclose(got.reshape(-1, 16), want, atol=1e-5), act
        assert float(layer.aux_loss.detach()) > 0


def test_layer_runs_under_bf16_autocast_for_both_activations():
    torch.manual_seed(4)
    for act in ("gelu", "swiglu"):
        layer = MoEMLP(16, 24, MoEConfig(num_experts=4, top_k=2, activation=act))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(torch.randn(2, 5, 16))  # fp32 in, as a LayerNorm gives it under autocast
        y.float().sum().backward()
        assert y.shape == (2, 5, 16) and layer.w_in.grad is not None, act


@pytest.mark.parametrize("act", ["gelu", "swiglu"])
def test_a_bf16_run_moves_bf16_tokens_in_both_all_to_alls(monkeypatch, act):
    """Under autocast the tokens come from a LayerNorm in fp32 (autocast's fp32 list) and a gelu
    expert adds an fp32 bias to its bf16 matmul: both exchanges must still move bf16, as the
    run's label says, and MoEStats says what moved. The exchange is played at dist's boundary
    (EP = 2, this rank's half of the experts): what it is handed is what would cross the fabric."""
    from workloads.models import moe as moe_mod

    moved = []

    def all_to_all_single(out, inp, out_splits=None, in_splits=None, group=None):
        moved.append(inp.dtype)
        out.zero_()  # the peer sends nothing: the shapes stay consistent

    monkeypatch.setattr(moe_mod.dist, "all_to_all_single", all_to_all_single)
    torch.manual_seed(5)
    groups = moe_mod.ExpertGroups(ep_size=2, ep_rank=0, world=2, ep=object())
    layer = MoEMLP(16, 24, MoEConfig(num_experts=4, top_k=2, activation=act), groups)
    layer.stats = moe_mod.MoEStats()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        layer(torch.nn.functional.layer_norm(torch.randn(2, 5, 16), (16,)))  # fp32, as autocast leaves it
    counts, dispatch, combine = moved  # the counts exchange, then the tokens there and back
    assert counts == torch.int64 and (dispatch, combine) == (torch.bfloat16, torch.bfloat16), act
    assert layer.stats.take()["dtype"] == "bfloat16"
    # without autocast the layer's own dtype moves
    moved.clear()
    layer(torch.randn(2, 5, 16))
    assert moved[1:] == [torch.float32, torch.float32]


def test_moe_flops_worked_value():
    # Mixtral-8x7B's shape, one 4096-token sample, no checkpointing (f = 3), SwiGLU (m = 3):
    # per token and layer 8h^2 = 134,217,728; 4sh = 67,108,864; 2*m*k*h*F = 2*3*2*4096*14336 =
    # 704,643,072; router 2hE = 65,536; sum 906,035,200, x 32 layers = 28,993,126,400;
    # logits 1.5 * 4096 * 32000 = 196,608,000; per token 29,189,734,400; x f=3 x s=4096:
    assert moe_flops_per_iteration(global_batch=1, seq_length=4096, num_layers=32, hidden_size=4096,
                                   padded_vocab=32000, checkpoint_activations=False, num_experts=8, top_k=2,
                                   expert_ffn_size=14336, gated=True) == 358_683_456_307_200
    # k = 1, no router, m = 2, F = 4h is GPT-NeoX's dense formula (DESIGN's 1.3B worked value)
    dense = dict(global_batch=1, seq_length=2048, num_layers=24, hidden_size=2048, padded_vocab=50304,
                 checkpoint_activations=True)
    assert moe_flops_per_iteration(**dense, num_experts=0, top_k=1, expert_ffn_size=8192, gated=False) == \
        pytest.approx(flops_per_iteration(**dense), rel=1e-12)
    assert flops_per_iteration(**dense) == pytest.approx(2.436e13, rel=1e-3)


def test_alltoall_figures_worked_value():
    # Two timed steps of 0.5 s; dispatch 0.1 + 0.1 s, combine 0.05 + 0.15 s; 4e8 B sent per step.
    steps = [{"dispatch_s": 9.0, "combine_s": 9.0, "bytes": 1, "skew": 9.0, "skew_mean": 9.0, "dropped": 0.9},
             {"dispatch_s": 0.1, "combine_s": 0.05, "bytes": 4e8, "skew": 1.5, "skew_mean": 1.25, "dropped": 0.0},
             {"dispatch_s": 0.1, "combine_s": 0.15, "bytes": 4e8, "skew": 2.0, "skew_mean": 1.75, "dropped": 0.1}]
    m = summarize_moe(steps, [5.0, 0.5, 0.5], warmup_steps=1, ep_size=4)
    assert m["alltoall_share"] == pytest.approx(0.4 / 1.0)
    assert m["dispatch_share"] == pytest.approx(0.2) and m["combine_share"] == pytest.approx(0.2)
    assert m["alltoall_bytes_per_step(B)"] == 4e8
    # busbw = 8e8 B / 0.4 s = 2 GB/s algbw, x (4 - 1) / 4 = 1.5 GB/s (nccl-tests' alltoall factor)
    assert m["alltoall_busbw(GB/s)"] == pytest.approx(1.5)
    assert m["routing_skew"] == pytest.approx(1.5) and m["routing_skew_max"] == 2.0
    assert m["dropped_fraction"] == pytest.approx(0.05)


@pytest.mark.parametrize("kw,needle", [
    ({"num_experts": 4, "top_k": 5}, "top_k=5"),
    ({"num_experts": 4, "capacity_factor": 0}, "capacity_factor=0"),
    ({"num_experts": 4, "capacity_factor": -1.0}, "capacity_factor=-1.0"),
    ({"num_experts": 0}, "num_experts"),
    ({"num_experts": 4, "activation": "relu"}, "activation"),
])
def test_config_errors_name_the_key(kw, needle):
    with pytest.raises(UsageError, match=needle):
        MoEConfig(**kw)


def test_layout_multiplies_to_the_world():
    assert ExpertLayout.resolve(8, 2, 1, None, 8) == ExpertLayout(2, 1, 4)
    for args, needle in [((6, 4, 1, None, 4), "num_experts=6 does not divide"),
                         ((4, 2, 1, 2, 2), "= 4, not the world size 2"),
                         ((4, 3, 1, None, 4), "does not divide the world"),
                         ((4, 1, 2, None, 2), "tensor_parallel=2")]:
        with pytest.raises(UsageError, match=needle):
            ExpertLayout.resolve(*args)


CASES = [("top2-ep2", {"num_experts": 4, "top_k": 2, "capacity_factor": 2.0}, 2),
         ("top1-ep2", {"num_experts": 4, "top_k": 1, "capacity_factor": 4.0}, 2),
         ("top2-ep1-replicas", {"num_experts": 4, "top_k": 2, "capacity_factor": 2.0}, 1)]


@pytest.fixture(scope="module")
def parity(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "parity.json"
    mp.spawn(moe_parity.ep_vs_single, args=(2, free_port(), str(out), CASES), nprocs=2, join=True)
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_single_rank_and_expert_parallel_losses_are_identical(parity, case):
    r = parity[case]
    # Same seed, same global batch, same routing (no token dropped at these capacities): the
    # global-batch loss of the 2-rank run equals the 1-rank loss at every step, to float64
    # rounding (the cross-entropy runs in float32 in both, as in training).
    assert r["ep"] == pytest.approx(r["single"], rel=1e-6, abs=0)
    assert r["ep"][-1] < r["ep"][0]  # and it trains
    assert all(d == 0.0 for d in r["dropped"])


def test_expert_parallel_sends_the_real_skewed_counts(parity):
    r = parity["top2-ep2"]
    assert max(r["skew"]) > 1.0  # routing is not balanced ...
    r0, r1 = r["bytes_by_rank"]
    assert r0 != r1  # ... and the ranks' all-to-all payloads differ with it (no capacity padding)
    assert all(b > 0 for b in r0 + r1) and all(t > 0 for t in r["a2a_s"])
    assert all(b == 0 for b in parity["top2-ep1-replicas"]["bytes_by_rank"][0])  # EP=1: no all-to-all


def test_the_reference_inference_engine_refuses_an_moe_model_in_one_line():
    from workloads.inference.protocol import dense_only

    with pytest.raises(UsageError, match="model=neox-moe-tiny is a mixture of experts"):
        dense_only({"name": "neox-moe-tiny", "moe": {"num_experts": 4}})
    dense_only({"name": "neox-tiny"})  # dense: served
