"""Training benchmark entry point (GPT-NeoX, DDP or DeepSpeed ZeRO).

    torchrun --nproc_per_node=2 launch/train.py fabric=loopback
    torchrun --nproc_per_node=8 launch/train.py fabric=roce model=neox-1.3b parallel=zero1 train.precision=bf16
    torchrun --nproc_per_node=2 launch/train.py -m train.micro_batch_size=1,2,4,8

Started with plain `python` it validates the config first, then launches
`launcher.nproc_per_node` local ranks itself (torchrun's machinery, without its
traceback on failure). The work lives in workloads/train.py.
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
    from workloads.train import run_training

    try:
        run_training(cfg, overrides=list(HydraConfig.get().overrides.task))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ and "SLURM_PROCID" not in os.environ:
        from workloads.launcher import self_launch

        sys.exit(self_launch(__file__, sys.argv[1:], CONF))
    main()
