"""Replay entry point: a captured run's collectives, alone, on any fabric (docs/projection.md).

    python launch/replay.py replay.trace=results/<run>/records/pretrain-loopback-....json
    sudo python launch/emulate.py launch/replay.py fabric=emu-100m replay.trace=<record or Flight Recorder dump>
    torchrun --nproc_per_node=8 launch/replay.py fabric=roce replay.trace=fr_dump_rank0.json replay.pace=none

`workload=replay` is implied. Started with plain `python` it validates the config first, then launches
`launcher.nproc_per_node` (2) local ranks itself. The work lives in workloads/replay/.
Exit status: 0 ok, 1 the replay failed (recorded), 2 bad input.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.replay.run import run_replay

    run_replay(cfg, overrides=overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run, workload="replay")
