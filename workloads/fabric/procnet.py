"""What /proc tells about a process's network: its TCP sockets, the addresses of its network
namespace, its title and its environment.

    table = socket_table("/proc/1234")   # LISTEN and ESTABLISHED endpoints of pid 1234's sockets
    pids = listeners(8000)               # who holds a socket listening on port 8000

Transport verification (verify.py, verify_server.py) reads a rank's sockets to see which
interface Gloo bound; the serving orchestrator reads them to name who holds a port it needs.
Both read the same tables the same way, here. Every function reads a snapshot and tolerates a
process that exits while it is being read (missing files count as nothing found).
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import subprocess
from glob import glob
from pathlib import Path
from typing import Iterator

# <linux/sockios.h>: get an interface's IPv4 address (struct ifreq in, ifreq with a sockaddr_in out).
SIOCGIFADDR = 0x8915
# /proc/net/tcp `st` column (include/net/tcp_states.h)
TCP_ESTABLISHED = "01"
TCP_LISTEN = "0A"


def hex_addr(h: str) -> tuple[str, int]:
    """A /proc/net/tcp{,6} endpoint ("0100007F:1F90") -> ("127.0.0.1", 8080)."""
    ip_hex, port_hex = h.split(":")
    raw = bytes.fromhex(ip_hex)
    # /proc prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        ip = socket.inet_ntop(socket.AF_INET, words)
    else:
        ip = socket.inet_ntop(socket.AF_INET6, words)
        if ip.startswith("::ffff:") and "." in ip:
            ip = ip[7:]  # IPv4-mapped
    return ip, int(port_hex, 16)


def socket_inodes(proc: str = "/proc/self") -> set[str]:
    """The inodes of the sockets among process `proc`'s open fds ("socket:[123]" -> "123")."""
    inodes = set()
    for fd in glob(f"{proc}/fd/*"):
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def tcp_sockets(proc: str = "/proc/self") -> Iterator[tuple[tuple[str, int], tuple[str, int], str, str]]:
    """(local, remote, state, inode) of every TCP socket in the network namespace of `proc`
    (the tables are per namespace, not per process: filter by `socket_inodes` for its own)."""
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"{proc}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) >= 10:
                yield hex_addr(f[1]), hex_addr(f[2]), f[3], f[9]


def socket_table(proc: str = "/proc/self") -> dict:
    """This process's TCP sockets: LISTEN endpoints and ESTABLISHED (local, remote) pairs.
    Only sockets whose inode is one of this process's fds count (the tables are per netns)."""
    inodes = socket_inodes(proc)
    listen, established = [], []
    for local, remote, state, inode in tcp_sockets(proc):
        if inode not in inodes:
            continue
        if state == TCP_LISTEN:
            listen.append(list(local))
        elif state == TCP_ESTABLISHED:
            established.append([list(local), list(remote)])
    return {"host": socket.gethostname(), "listen": listen, "established": established,
            "addresses": addresses_seen_by(proc)}


def listeners(port: int) -> list[int]:
    """Pids of the processes holding a TCP socket that LISTENs on `port` (any address) in this
    network namespace, read from /proc/net/tcp{,6} and every process's fd links (what `ss -ltnp` does)."""
    inodes = {inode for local, _, state, inode in tcp_sockets() if state == TCP_LISTEN and local[1] == port}
    pids = set()
    if inodes:
        for proc in glob("/proc/[0-9]*"):
            if socket_inodes(proc) & inodes:
                pids.add(int(proc.rsplit("/", 1)[1]))
    return sorted(pids)


def addresses_seen_by(proc: str) -> dict[str, str]:
    """ip -> interface name in the network namespace of process `proc` (another namespace's
    addresses, e.g. an engine rank in an emulated node, are read there with nsenter)."""
    try:
        same = os.readlink(f"{proc}/ns/net") == os.readlink("/proc/self/ns/net")
    except OSError:
        same = True  # cannot tell: this namespace's names are the best guess
    if same:
        return interface_addresses()
    pid = proc.rstrip("/").rsplit("/", 1)[-1]
    try:
        out = subprocess.run(["nsenter", "-t", pid, "-n", "ip", "-o", "addr", "show"], capture_output=True,
                             text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    # "2: emu0    inet 10.77.0.1/24 brd ... scope global emu0\ ..."
    return {f[3].split("/")[0]: f[1] for f in (line.split() for line in out.splitlines())
            if len(f) > 3 and f[2] in ("inet", "inet6")}


def interface_addresses() -> dict[str, str]:
    """ip -> interface name, for this host (IPv4 by ioctl SIOCGIFADDR, IPv6 from /proc)."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                # struct ifreq: 16 bytes of name, then the sockaddr_in whose address is bytes 20-24
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
                out[socket.inet_ntoa(packed[20:24])] = name
            except OSError:
                pass  # no IPv4 address
    try:
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            f = line.split()
            ip = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0]))
            out[ip] = f[5]
    except (OSError, IndexError, ValueError):
        pass
    return out


def process_cmdline(pid: int) -> list[str] | None:
    """The process's argv as /proc shows it (a retitled process shows its title); None when it
    cannot be read (gone, or another user's)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return raw.decode(errors="replace").removesuffix("\0").split("\0")


def process_title(pid: int) -> str:
    """The process's title (vLLM sets one per role: VLLM::EngineCore, VLLM::Worker_TP0, ...)."""
    return (process_cmdline(pid) or [""])[0]


def process_env(pid: int, keys) -> dict[str, str | None]:
    """`keys` as they are in the environment of process `pid` (None: not set)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    env = dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)
    return {k: env.get(k) for k in keys}
