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

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from workloads.errors import UsageError  # noqa: E402
from workloads.rundir import register_resolvers  # noqa: E402

register_resolvers()
CONF = str(Path(__file__).resolve().parent.parent / "conf")


@hydra.main(config_path=CONF, config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from workloads.collectives.runner import run_collectives

    try:
        if cfg.workload.name != "collectives":
            raise UsageError(f"launch/collectives.py runs workload=collectives, not {cfg.workload.name}; "
                             "add workload=collectives")
        run_collectives(cfg, overrides=list(HydraConfig.get().overrides.task))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    # This entry point runs one workload: select it unless the command line did.
    if not any(a.startswith(("workload=", "+workload=", "++workload=")) for a in sys.argv[1:]):
        sys.argv.insert(1, "workload=collectives")
    if "LOCAL_RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        from workloads.launcher import self_launch

        sys.exit(self_launch(__file__, sys.argv[1:], CONF))
    main()
