"""Raw-link baseline entry point: iperf3 (TCP) or perftest (RDMA) between two nodes.

    python launch/link.py                                   # two local ranks over lo (fabric=loopback)
    sudo python launch/emulate.py launch/link.py fabric=emu-100m          # across the shaped veth
    # two hosts, one rank each (the server runs on node 0's fabric interface):
    torchrun --nnodes=2 --node_rank=$NODE --nproc_per_node=1 --master_addr=$HEAD --master_port=29500 \
        launch/link.py fabric=socket link.streams=4 run_id=link-1
    torchrun ... launch/link.py fabric=roce link.tool=ib_write_bw link.device=mlx5_0

`workload=link` is implied. Started with plain `python` it validates the config first, then launches
`launcher.nproc_per_node` (2) local ranks itself. The work lives in workloads/link/.
Exit status: 0 ok, 1 the tool failed (recorded), 2 bad input.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run(cfg, overrides):
    from workloads.link.run import run_link

    run_link(cfg, overrides=overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run, workload="link")
