"""Training benchmark entry point (GPT-NeoX, DDP or DeepSpeed ZeRO).

    torchrun --nproc_per_node=2 launch/train.py fabric=loopback
    torchrun --nproc_per_node=8 launch/train.py fabric=roce model=neox-1.3b parallel=zero1 train.precision=bf16
    torchrun --nproc_per_node=2 launch/train.py -m train.micro_batch_size=1,2,4,8
    python launch/train.py -m hydra/launcher=slurm hydra.launcher.tasks_per_node=8 train.micro_batch_size=1,2

Started with plain `python` it validates the config first, then launches
`launcher.nproc_per_node` local ranks itself (torchrun's machinery, without its
traceback on failure). The work lives in workloads/training/run.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.training.run import run_training

    run_training(cfg, overrides=overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run)
