"""Run an entry point across emulated nodes: network namespaces joined by shaped veth links.

    sudo python launch/emulate.py launch/train.py fabric=emu-100m
    sudo python launch/emulate.py launch/collectives.py fabric=emu-1g collectives.maxbytes=64M
    sudo python launch/emulate.py --rate none launch/train.py fabric=emu-100m   # unshaped veth, named emu-veth

One torchrun agent per namespace, Gloo over the veth (`emu0`); the shaping is the fabric
profile's `emulate:` block. The work lives in workloads/commands/emulate.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.commands.emulate import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
