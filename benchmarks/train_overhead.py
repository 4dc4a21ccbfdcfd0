"""What does the training harness cost? Harness vs a minimal hand-written DDP loop.

    uv run python benchmarks/train_overhead.py            # 2 ranks, Gloo, CPU
    torchrun --nproc_per_node=8 benchmarks/train_overhead.py fabric=socket train.precision=bf16   # GPUs

Both run the same GPT-NeoX, the same synthetic batches, the same optimizer and the
same number of steps in one process group, alternating (harness, bare, harness, bare,
...) so drift hits both alike. Each burns in `train.warmup_steps` steps, then times the
rest. Printed: median samples/s of each, and the median over rounds of the paired
ratio harness_i / bare_i (adjacent runs share the machine's state, so this is the
figure to quote). The harness should cost <= 2%
(ratio >= 0.98). Extra arguments are Hydra overrides of conf/config.yaml.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A CPU model big enough that a step is tens of milliseconds (less timer noise).
DEFAULTS = ["model.name=neox-bench-4x256", "model.num_layers=4", "model.hidden_size=256", "model.num_attention_heads=8",
            "train.seq_length=128", "train.micro_batch_size=4", "train.steps=40", "train.warmup_steps=5",
            "run_id=bench-train-overhead", "output_root=bench-results"]
ROUNDS = 7


def bare_loop(cfg, info) -> float:
    """The minimal DDP loop a person would write: forward, backward, clip, step."""
    import torch
    import torch.nn.functional as F
    from omegaconf import OmegaConf
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workloads.models.neox import GPTNeoX, NeoXConfig
    from workloads.training.data import synthetic_batches

    torch.manual_seed(int(cfg.seed))
    mcfg = NeoXConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))
    model = DDP(GPTNeoX(mcfg).to(info.device))
    opt = torch.optim.AdamW(model.parameters(), lr=float(cfg.train.lr), betas=(0.9, 0.95), eps=1e-8)
    mb, seq = int(cfg.train.micro_batch_size), int(cfg.train.seq_length)
    pool = synthetic_batches(seed=int(cfg.seed), rank=info.rank, vocab=mcfg.vocab_size, micro_batch=mb, seq=seq,
                             device=info.device)
    steps, warm = int(cfg.train.steps), int(cfg.train.warmup_steps)
    for step in range(steps):
        if step == warm:
            if info.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        x, y = pool[step % len(pool)]
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), float(cfg.train.grad_clip))
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()  # the harness reads the loss every step too
    if info.device.type == "cuda":
        torch.cuda.synchronize()
    return mb * info.world_size * (steps - warm) / (time.perf_counter() - t0)


def main(overrides: list[str]) -> None:
    import json

    from hydra import compose, initialize_config_dir

    from workloads.core import dist as fdist
    from workloads.core.rundir import register_resolvers
    from workloads.training.run import run_training

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[*DEFAULTS, *overrides])
    harness, bare = [], []
    for _ in range(ROUNDS):
        path = run_training(cfg)
        info = fdist.init_once(cfg.fabric.backend, cfg.fabric.name, float(cfg.dist.timeout_s))
        if info.is_main:
            harness.append(json.loads(Path(path).read_text())["metrics"]["samples_per_sec"])
        sps = bare_loop(cfg, info)
        bare.append(sps)
    if info.is_main:
        h, b = statistics.median(harness), statistics.median(bare)
        paired = statistics.median(x / y for x, y in zip(harness, bare))
        print(f"harness samples/s (median of {ROUNDS}): {h:.2f}   runs: {', '.join(f'{x:.2f}' for x in harness)}")
        print(f"bare DDP samples/s (median of {ROUNDS}): {b:.2f}   runs: {', '.join(f'{x:.2f}' for x in bare)}")
        print(f"paired ratio harness/bare (median of {ROUNDS}): {paired:.4f}  "
              f"(harness cost {100 * (1 - paired):+.2f}%; budget 2%)")


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        from torch.distributed.run import get_args_parser, run

        os.environ.setdefault("OMP_NUM_THREADS", "1")
        run(get_args_parser().parse_args(["--standalone", "--nproc_per_node=2", __file__, *sys.argv[1:]]))
    else:
        main(sys.argv[1:])
