"""Collective micro-benchmarks entry point (nccl-tests' table and meaning, on any fabric).

    python launch/collectives.py collectives.maxbytes=1M
    torchrun --nproc_per_node=8 launch/collectives.py fabric=roce collectives.ops=all
    # two nodes, static rendezvous (one agent per node; same run_id on both):
    torchrun --nnodes=2 --node_rank=$NODE --nproc_per_node=8 --master_addr=$HEAD --master_port=29500 \
        launch/collectives.py fabric=roce collectives.pattern=one_per_node run_id=ar-1

`workload=collectives` is implied. Started with plain `python` it validates the config first, then launches
`launcher.nproc_per_node` local ranks itself. The work lives in workloads/collectives/.
Exit status: 0 ok, 1 measured but wrong (bad elements, or below collectives.min_busbw),
2 bad input.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.collectives.run import run_collectives

    run_collectives(cfg, overrides=overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run, workload="collectives")
