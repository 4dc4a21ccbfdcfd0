"""Single-rank vs expert-parallel parity for the MoE layer (tests/models/test_moe.py).

One spawned Gloo job of `world` ranks trains the same tiny MoE GPT-NeoX, from the same seed,
on the same global batch, under the DDP engine with expert parallelism (each rank its half of
the batch and its share of the experts), while rank 0 also trains a plain single-process copy
on the whole batch with torch's own optimizer loop. The global-batch loss of the EP run (the
mean of the ranks' losses) must equal the single-rank loss at every step. Runs in float64 so
that only the reduction order differs.

    torch.multiprocessing.spawn(ep_vs_single, args=(2, port, out_json, CASES), nprocs=2)
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from workloads.models import moe
from workloads.models.neox import GPTNeoX, NeoXConfig
from workloads.training.engines import DDPEngine, TrainSettings, _adamw, lm_loss

MICRO, SEQ, STEPS = 2, 16, 4


def tiny(moe_cfg: dict) -> NeoXConfig:
    return NeoXConfig(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=100,
                      max_position_embeddings=64, rotary_pct=0.25, gpt_j_residual=True, moe=moe_cfg)


def _batch(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.randint(0, 100, (MICRO * world, SEQ + 1), generator=torch.Generator().manual_seed(7))
    return t[:, :-1], t[:, 1:]


def _ep_run(cfg: NeoXConfig, ep: int, s: TrainSettings, x, y) -> tuple[list[float], list[dict]]:
    rank, world = dist.get_rank(), dist.get_world_size()
    groups = moe.ExpertGroups.build(ep)
    torch.manual_seed(0)
    model = GPTNeoX(cfg, groups).double()
    stats = moe.MoEStats()
    moe.attach_stats(model, stats)
    engine = DDPEngine(model, s, torch.device("cpu"), groups=groups)
    mine = slice(rank * MICRO, (rank + 1) * MICRO)
    losses, steps = [], []
    for _ in range(STEPS):
        losses.append(float(engine.step([(x[mine], y[mine])])))
        steps.append(stats.take())
    t = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / world).tolist(), steps


def _single_run(cfg: NeoXConfig, s: TrainSettings, x, y) -> list[float]:
    torch.manual_seed(0)
    model = GPTNeoX(cfg).double()
    opt = _adamw(model, s)
    losses = []
    for _ in range(STEPS):
        loss = lm_loss(model(x), y) + moe.aux_loss(model)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def ep_vs_single(rank: int, world: int, port: int, out: str, cases: list[tuple[str, dict, int]]) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = TrainSettings(MICRO, 1, lr=1e-2, weight_decay=0.0, grad_clip=1.0, precision="fp32",
                      activation_checkpointing=False)
    x, y = _batch(world)
    results = {}
    for name, moe_cfg, ep in cases:
        cfg = tiny(moe_cfg)
        ep_losses, steps = _ep_run(cfg, ep, s, x, y)
        sent = torch.tensor([float(st["bytes"]) for st in steps], dtype=torch.float64)
        every = [torch.empty_like(sent) for _ in range(world)]
        dist.all_gather(every, sent)
        if rank == 0:
            results[name] = {"ep": ep_losses, "single": _single_run(cfg, s, x, y),
                             "skew": [st["skew"] for st in steps], "dropped": [st["dropped"] for st in steps],
                             "bytes_by_rank": [e.tolist() for e in every],
                             "a2a_s": [st["dispatch_s"] + st["combine_s"] for st in steps]}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    from workloads.core.dist import end_group_and_exit

    end_group_and_exit()  # not interpreter teardown (workloads/core/dist.py says why)
