"""Point-to-point latency and bandwidth between two ranks, as the OSU micro-benchmarks
report them, so inter-node GPU-to-GPU latency can be read off directly.

    latency  osu_latency: ping-pong; one-way latency = elapsed / (2 x iters), in us
    bw       osu_bw: the sender posts a window of non-blocking sends, the receiver a
             window of receives, then returns a 4-byte ack; MB/s = size x window x
             iters / elapsed / 1e6
    bibw     osu_bibw: both sides post a window of sends and receives at once;
             MB/s = 2 x size x window x iters / elapsed / 1e6
MB/s is 1e6 bytes per second, as OSU prints it. Only the two chosen ranks move data;
every other rank only joins the per-size barrier and the result broadcast.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from workloads.collectives.settings import P2P
from workloads.core import dist as fdist


@dataclass
class P2PRow:
    test: str  # latency | bw | bibw
    size: int  # bytes per message
    value: float  # us for latency, MB/s for bandwidth
    unit: str
    ranks: tuple[int, int]

    def as_dict(self) -> dict:
        return asdict(self)


def latency_us(elapsed_s: float, iters: int) -> float:
    return elapsed_s * 1e6 / (2 * iters)


def bandwidth_mbs(size: int, window: int, iters: int, elapsed_s: float, directions: int = 1) -> float:
    return directions * size * window * iters / elapsed_s / 1e6


def _timed(exchange, iters: int, warmup: int, device) -> float:
    """Seconds for `iters` exchanges after `warmup` untimed ones, between device syncs
    (the OSU benchmarks' burn-in-then-clock rule, shared by every p2p test)."""
    for _ in range(warmup):
        exchange()
    fdist.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(iters):
        exchange()
    fdist.synchronize(device)
    return time.perf_counter() - t0


def _latency(me: int, peer: int, first: bool, sbuf, rbuf, iters: int, warmup: int, device) -> float:
    def ping_pong():
        if first:
            dist.send(sbuf, peer)
            dist.recv(rbuf, peer)
        else:
            dist.recv(rbuf, peer)
            dist.send(sbuf, peer)

    return _timed(ping_pong, iters, warmup, device)


def _bw(me: int, peer: int, first: bool, sbuf, rbuf, iters: int, warmup: int, window: int, device,
        bidirectional: bool) -> float:
    ack = torch.zeros(1, dtype=torch.int32, device=device)  # the 4-byte ack

    def window_of_messages():
        if bidirectional:
            reqs = [dist.irecv(rbuf, peer) for _ in range(window)] + [dist.isend(sbuf, peer) for _ in range(window)]
            for w in reqs:
                w.wait()
        elif first:
            for w in [dist.isend(sbuf, peer) for _ in range(window)]:
                w.wait()
            dist.recv(ack, peer)
        else:
            for w in [dist.irecv(rbuf, peer) for _ in range(window)]:
                w.wait()
            dist.send(ack, peer)

    return _timed(window_of_messages, iters, warmup, device)


def run_p2p(p: P2P, ranks: tuple[int, int], rank: int, device: torch.device, printer=None) -> list[P2PRow]:
    """Run every test of `p` over its sizes between `ranks` (p.ranks, or the pair run.py chose);
    all ranks call this (the others only synchronise). Returns the rows on every rank."""
    say = printer or (lambda line: None)
    a, b = ranks
    iters, warmup, window = p.iters, p.warmup, p.window
    rows: list[P2PRow] = []
    for test in p.tests:
        unit = "us" if test == "latency" else "MB/s"
        say(f"# fabricbench point-to-point {test} (osu_{test} style), ranks {a} <-> {b}, "
            f"{iters} iters, {warmup} warm-up" + ("" if test == "latency" else f", window {window}"))
        say(f"# {'Size':<10}{'Avg Latency(us)' if test == 'latency' else 'Bandwidth (MB/s)':>18}")
        for size in p.sizes:
            value = 0.0
            if rank in (a, b):
                peer, first = (b, True) if rank == a else (a, False)
                sbuf = torch.ones(size, dtype=torch.uint8, device=device)
                rbuf = torch.zeros(size, dtype=torch.uint8, device=device)
                if test == "latency":
                    value = latency_us(_latency(rank, peer, first, sbuf, rbuf, iters, warmup, device), iters)
                else:
                    elapsed = _bw(rank, peer, first, sbuf, rbuf, iters, warmup, window, device, test == "bibw")
                    value = bandwidth_mbs(size, window, iters, elapsed, 2 if test == "bibw" else 1)
            # The first rank's clock is the one OSU reports; everyone learns it.
            t = torch.tensor([value if rank == a else 0.0], dtype=torch.float64, device=device)
            dist.all_reduce(t)
            value = float(t.item())
            say(f"{size:<12d}{value:>18.2f}")
            rows.append(P2PRow(test, size, value, unit, (a, b)))
    return rows
