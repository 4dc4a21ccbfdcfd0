"""Which TCP port to listen on, for servers that bind long after the number is chosen.

The kernel hands outgoing connections (and port-0 binds) ports from its ephemeral range. A
number taken from there (free_port) is safe to bind at once; one that a server binds minutes
later, after its model loads, is by then often another process's outgoing connection on a busy
host (seen: vLLM's ZMQError "Address already in use" and a hung instance, a P/D proxy that could
not bind). Below the ephemeral range only explicit binds compete (quiet_ports).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

from workloads.core.errors import Fault


def free_port() -> int:
    """A TCP port free on this host now (the kernel's pick); the caller binds it soon after."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ephemeral_floor() -> int:
    """The kernel gives outgoing connections (and port-0 binds, free_port's) ports from here up."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def quiet_ports(count: int, width: int = 1, rng: random.Random | None = None, who: str = "the server") -> list[int]:
    """`count` bases of `width` consecutive ports, each free now and below the ephemeral range."""
    rng = rng or random.Random()
    top, out, taken = ephemeral_floor() - width, [], set()
    for _ in range(2000):
        base = rng.randrange(10000, top)
        ports = set(range(base, base + width))
        if ports & taken or not all(_bindable(p) for p in ports):
            continue
        out.append(base)
        taken |= ports
        if len(out) == count:
            return out
    raise Fault(f"{who} found no {count} free port(s) below {top + width}")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
