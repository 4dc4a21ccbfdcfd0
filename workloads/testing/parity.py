"""Record every step's logits of a fixed greedy scenario, to compare tensor-parallel degrees.

    python -m torch.distributed.run --standalone --nproc_per_node=2 -m workloads.testing.parity --out tp2.pt
    python -m workloads.testing.parity --out tp1.pt          # the same scenario on one rank

Scenario (through the real engine: scheduler, plan broadcast, paged KV cache): requests
A and B are prefilled together and decoded greedily; after `--join-after` decode steps
request C arrives and is prefilled in the same step as A's and B's decode (mixed batch).
Rank 0 saves, per step, the last-token logits of every sequence in the step and each
request's tokens, for each residual layout (parallel and sequential) of a random tiny
GPT-NeoX seeded identically on every rank. Works over Gloo (CPU) and NCCL (GPU).
"""

from __future__ import annotations

import argparse
import os

import torch

from workloads.inference.engine.engine import EngineSettings, SamplingParams, build_engine
from workloads.models.neox import NeoXConfig

PROMPTS = {"A": [11, 22, 33, 44, 55, 66, 77], "B": [5, 4, 3], "C": [900, 800, 700, 600, 500]}


def tiny_config(parallel_residual: bool) -> NeoXConfig:
    return NeoXConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000,
                      max_position_embeddings=256, rotary_pct=0.25, gpt_j_residual=parallel_residual)


def scenario(engine, new_tokens: int, join_after: int, only: str | None = None) -> dict:
    """Run on rank 0 (the leader). `only` runs one request alone (its solo baseline)."""
    logits: list[torch.Tensor] = []
    run = engine.execute

    def capture(entries):
        out = run(entries)
        logits.append(out.float().clone())
        return out

    engine.execute = capture
    tokens: dict[str, list[int]] = {}
    done: set[str] = set()

    def submit(name):
        tokens[name] = []

        def emit(tok, reason):
            if tok is not None:
                tokens[name].append(tok)
            if reason is not None:
                done.add(name)

        engine.submit(PROMPTS[name], SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True), emit)

    names = [only] if only else ["A", "B", "C"]
    for n in names[:2] if not only else names:
        submit(n)
    steps = 0
    while len(done) < len(names):
        engine.leader_step()
        steps += 1
        if not only and steps == join_after + 1:
            submit("C")
    engine.execute = run
    return {"logits": logits, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--join-after", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        torch.distributed.init_process_group(backend)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if world > 1 and torch.cuda.is_available() \
        else torch.device("cpu")
    results = {}
    for residual in (True, False):
        engine = build_engine(tiny_config(residual), EngineSettings(max_kv_tokens=512), rank, world, device, a.seed)
        key = "parallel" if residual else "sequential"
        if rank == 0:
            results[key] = scenario(engine, a.new_tokens, a.join_after)
            engine._broadcast({"kind": "stop"})
        else:
            engine.run_follower()
    if rank == 0:
        torch.save(results, a.out)
    if world > 1:
        from workloads.core.dist import end_group_and_exit

        end_group_and_exit()


if __name__ == "__main__":
    main()
