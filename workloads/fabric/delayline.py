"""A delay line for emulated links on kernels without netem: one process in a "hop" namespace
spliced into a link, holding every frame for a fixed one-way delay before passing it on.

    node A emu0 ── veth ── [hop: a  <delay line>  b] ── veth ── node B emu0

The hop's two veth ends carry no address and no bridge, so its kernel passes nothing between
them; this process reads each frame from one end with a packet socket (AF_PACKET, every
protocol: ARP too), keeps it until the kernel's receive timestamp plus the delay, and writes it
to the other end. The delay is constant per direction, so a FIFO per direction is the whole
schedule (no heap). tbf stays on the nodes' egress, so rate and delay compose and are set apart.

Why a packet socket with PACKET_VNET_HDR rather than a TUN device: it splices into any veth at
layer 2 (a pair, a node's bridge port, a leaf-spine uplink) without new routes or addresses,
and with the virtio header a 64 KiB GSO frame that tbf let through whole is passed on whole, as
the kernel handed it over (without the header, sending it on a 1500-byte link fails).

What it did is written (atomically, twice a second and at exit) to a JSON stats file: frames,
bytes, drops (its own queue limit and the socket's), and a histogram of each frame's achieved
one-way delay, the time from the kernel's receive timestamp to the send. The ranks read it
before and after a point (fabric/delaymeter.py), so a record carries the delay its own packets saw.

Standard library only: it starts in ~50 ms, beside ranks that take seconds to import torch.

    python -m workloads.fabric.delayline --link l0:l0a:l0b:2000 --stats /tmp/x.json
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import gc
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_STATISTICS = 6        # struct tpacket_stats {u32 tp_packets; u32 tp_drops}, reset on read
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23  # Linux >= 4.20: our own sends are not read back on that socket
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_RCVBUFFORCE = 33          # asm-generic/socket.h; root may pass net.core.rmem_max
PR_SET_TIMERSLACK = 29
PACKET_OUTGOING = 4          # sockaddr_ll.sll_pkttype of a frame this host sent
BUCKET_US = 10               # histogram resolution; the line's own error is tens of µs
MAX_BUCKET = 1_000_000 // BUCKET_US  # 1 s: a frame later than that is counted in the last bucket
RCVBUF = 32 * 1024 * 1024    # bytes: a burst must wait in the socket, not be dropped, while we sleep
STATS_EVERY_S = 0.5
MAX_LEAD_NS = 300_000       # never aim more than 300 µs early
RT_PRIORITY = 10             # SCHED_FIFO, low among RT tasks: the kernel's own threads stay ahead


def _quiet_timers() -> str:
    """Ask for 1 µs timer slack (the default 50 µs would be added to every hold) and a real-time
    priority: the line stands in for a wire, and on a loaded machine (ranks, a test suite) an
    ordinary process waits for a core for hundreds of µs, which would be delay nobody asked
    for. netem runs in the kernel's softirq, ahead of every process; SCHED_FIFO is the nearest a
    process gets. The kernel's RT throttling still leaves 5% of each second to the rest.
    Returns the policy it got."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return "fifo"
    except (OSError, AttributeError):
        return "other"


def open_end(ifname: str) -> socket.socket:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:
        s.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernels: outgoing frames are told apart by sll_pkttype instead
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF)
    except OSError:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    s.bind((ifname, ETH_P_ALL))
    s.setblocking(False)
    return s


class Direction:
    """Frames read from `src`, due on `dst`: the FIFO, and what happened to them."""

    def __init__(self, name: str, src: socket.socket, dst: socket.socket, delay_ns: int, limit: int):
        self.name, self.src, self.dst, self.delay_ns, self.limit = name, src, dst, delay_ns, limit
        self.queue: collections.deque[tuple[int, int, bytes]] = collections.deque()  # (due, rx, frame)
        self.frames = self.bytes = self.queue_drops = self.socket_drops = self.send_errors = 0
        self.max_queue = 0
        # only the buckets that were hit: the report is rewritten twice a second from the loop,
        # and walking 100,000 empty buckets took ~10 ms, held every frame due meanwhile
        self.hist: dict[int, int] = {}

    def read(self) -> None:
        """Everything waiting on the socket, stamped with the kernel's receive time."""
        while True:
            try:
                data, anc, _flags, addr = self.src.recvmsg(70000, 64)
            except (BlockingIOError, InterruptedError):
                return
            if addr[2] == PACKET_OUTGOING:
                continue
            rx = next((sec * 1_000_000_000 + ns for level, kind, raw in anc
                       if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS
                       for sec, ns in [struct.unpack("qq", raw[:16])]), None) or time.time_ns()
            if len(self.queue) >= self.limit:
                self.queue_drops += 1
                continue
            self.queue.append((rx + self.delay_ns, rx, data))
            self.max_queue = max(self.max_queue, len(self.queue))

    def release(self, now: int) -> int:
        """Send every frame due by `now`; the sum of how late each went (ns, negative when early)."""
        q = self.queue
        late = 0
        while q and q[0][0] <= now:
            due, rx, frame = q.popleft()
            try:
                self.dst.send(frame)
            except OSError:
                self.send_errors += 1
                continue
            sent = time.time_ns()
            self.frames += 1
            self.bytes += len(frame) - 10  # less the virtio header
            k = min(MAX_BUCKET, max(0, sent - rx) // (BUCKET_US * 1000))
            self.hist[k] = self.hist.get(k, 0) + 1
            late += sent - due
        return late

    def count_socket_drops(self) -> None:
        raw = self.src.getsockopt(SOL_PACKET, PACKET_STATISTICS, 8)
        self.socket_drops += struct.unpack("II", raw)[1]

    def stats(self) -> dict:
        return {"frames": self.frames, "bytes": self.bytes, "queue_drops": self.queue_drops,
                "socket_drops": self.socket_drops, "send_errors": self.send_errors, "max_queue": self.max_queue,
                "hist": {str(i): n for i, n in self.hist.items()}}


class Link:
    """One spliced link: its two ends in this namespace and both directions between them."""

    def __init__(self, label: str, a: str, b: str, delay_us: float, limit: int):
        self.label, self.delay_us = label, delay_us
        sa, sb = open_end(a), open_end(b)
        ns = int(delay_us * 1000)
        # "n0-n1": the link's two ends are named by the label, and its directions after them
        x, y = label.split("-", 1) if label.count("-") == 1 else (a, b)
        self.dirs = [Direction(f"{x}->{y}", sa, sb, ns, limit), Direction(f"{y}->{x}", sb, sa, ns, limit)]

    def stats(self) -> dict:
        return {"delay_us": self.delay_us, "directions": {d.name: d.stats() for d in self.dirs}}


def write_stats(path: Path, links: list[Link], state: str, policy: str) -> None:
    body = {"bucket_us": BUCKET_US, "pid": os.getpid(), "state": state, "policy": policy,
            "time_ns": time.time_ns(), "links": {k.label: k.stats() for k in links}}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body))
    os.replace(tmp, path)


def serve(links: list[Link], stats: Path) -> int:
    policy = _quiet_timers()
    # The loop makes no reference cycles; a collector pass over a deque of held frames would
    # only pause the line (ms) with frames due.
    gc.disable()
    dirs = [d for k in links for d in k.dirs]
    by_fd = {d.src.fileno(): d for d in dirs}
    stop, asked = [], []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: asked.append(True))  # a meter wants the report now (delaymeter.fresh)
    poller = select.poll()
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    write_stats(stats, links, "running", policy)
    next_stats = time.monotonic() + STATS_EVERY_S
    # A wake-up is late by a roughly steady amount (the syscall, the scheduler, Python): aim
    # that much early, learnt from how late the frames went (an integral controller on the
    # mean lateness, clamped to [0, MAX_LEAD]). The record reports the delay achieved, not aimed at.
    lead = 0
    while not stop:
        now = time.time_ns()
        for d in dirs:
            if (n := len(d.queue)) and d.queue[0][0] <= now + lead:
                late = d.release(now + lead)
                sent = n - len(d.queue)
                lead = min(MAX_LEAD_NS, max(0, lead + (late // max(1, sent)) // 8))
        due = min((d.queue[0][0] - lead for d in dirs if d.queue), default=None)
        wait_ns = None if due is None else due - time.time_ns()
        # poll rounds its ms timeout up, which would add up to 1 ms to a hold: poll only for the
        # whole ms short of the due time, then sleep the rest (1 µs slack). A frame that arrives
        # meanwhile waits in the socket, stamped by the kernel, so it is not held any longer.
        try:
            if wait_ns is None:
                events = poller.poll(50)
            elif wait_ns > 2_000_000:
                events = poller.poll(wait_ns // 1_000_000 - 1)
            else:
                events = poller.poll(0)
                if not events and wait_ns > 0:
                    time.sleep(wait_ns / 1e9)
        except InterruptedError:
            continue
        for fd, _ev in events:
            by_fd[fd].read()
        if asked or time.monotonic() >= next_stats:
            asked.clear()
            for d in dirs:
                d.count_socket_drops()
            write_stats(stats, links, "running", policy)
            next_stats = time.monotonic() + STATS_EVERY_S
    for d in dirs:
        d.count_socket_drops()
    write_stats(stats, links, "stopped", policy)
    return 0


def parse_link(text: str, limit: int) -> tuple[str, str, str, float, int]:
    """LABEL:END_A:END_B:DELAY_US -> its parts."""
    label, a, b, us = text.split(":")
    return label, a, b, float(us), limit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--link", action="append", required=True,
                   help="LABEL:END_A:END_B:DELAY_US, one spliced link (its two interfaces in this namespace); repeatable")
    p.add_argument("--stats", type=Path, required=True, help="where to write what the line did (JSON)")
    p.add_argument("--limit", type=int, default=100_000, help="frames held per direction before dropping")
    args = p.parse_args(argv)
    try:
        links = [Link(*parse_link(t, args.limit)) for t in args.link]
        return serve(links, args.stats)
    except (OSError, ValueError) as e:
        print(f"delay line: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
