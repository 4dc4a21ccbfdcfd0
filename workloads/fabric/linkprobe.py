"""Two measurements of an emulated link between node 0 and node 1 of a Topology, shared by the
delay line's tests and its benchmark: the median TCP round trip of a 1-byte ping-pong, and
iperf3's received rate. Root only (`ip netns exec`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

PING = """
import os, socket, statistics, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(5))  # the probe times the wire, not the run queue
except OSError:
    pass
role, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, 5999)); s.listen(1)
    print("listening", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (d := c.recv(64)):
        c.sendall(d)
else:
    c = socket.create_connection((host, 5999)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rt = []
    for i in range(n):
        t = time.perf_counter_ns(); c.sendall(b"x"); c.recv(64); rt.append((time.perf_counter_ns() - t) / 1e3)
    print(statistics.median(rt[n // 10:]))  # the first tenth: slow start, first ARP
"""


def _in(ns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def rtt_us(topo, n: int = 200) -> float:
    """Median round trip (µs) of node 0 pinging node 1 over TCP, one byte each way."""
    server = subprocess.Popen(_in(topo.nodes[1], sys.executable, "-c", PING, "serve", topo.spec.addr(1), "0"),
                              stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "listening":
            raise RuntimeError("the ping-pong server did not start in node 1")
        out = subprocess.run(_in(topo.nodes[0], sys.executable, "-c", PING, "ping", topo.spec.addr(1), str(n)),
                             capture_output=True, text=True, timeout=120, check=True)
        return float(out.stdout)
    finally:
        server.kill()
        server.wait()


def iperf3_mbit(topo, seconds: int = 4, omit: int = 1) -> tuple[float, int]:
    """(Mbit/s node 1 received from node 0, TCP retransmits), iperf3 over `seconds` after `omit`."""
    server = subprocess.Popen(_in(topo.nodes[1], "iperf3", "-s", "-1", "-B", topo.spec.addr(1)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):
            out = subprocess.run(_in(topo.nodes[0], "iperf3", "-J", "-c", topo.spec.addr(1), "-t", str(seconds),
                                     "-O", str(omit)), capture_output=True, text=True, timeout=seconds + omit + 60)
            report = json.loads(out.stdout or "{}")
            if out.returncode == 0 and "error" not in report:
                end = report["end"]
                return end["sum_received"]["bits_per_second"] / 1e6, end["sum_sent"].get("retransmits", 0)
            time.sleep(0.1)  # the server not listening yet
        raise RuntimeError(f"iperf3 never connected: {out.stdout[-300:]} {out.stderr[-300:]}")
    finally:
        server.kill()
        server.wait()
