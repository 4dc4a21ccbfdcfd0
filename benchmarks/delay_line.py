"""How exact is the delay line, and what does it cost? (target: median within max(150 µs, 5%), iperf3
within 2% of the same link without a line, no drops)

    sudo .venv/bin/python benchmarks/delay_line.py                      # the full grid, ~5 min
    sudo .venv/bin/python benchmarks/delay_line.py --rates 100mbit --delays 2ms --loads idle

For each rate (tbf on both nodes' egress; `none` = an unshaped veth), one-way delay and host load
(`idle`, or `busy`: two processes spinning at normal priority, a 2-core host's ranks), two
namespaces are built twice: once with the delay line on their link and once without, in
alternating order (plain, delayed, delayed, plain over two rounds, so drift hits both alike). Each
build measures a TCP ping-pong's median round trip (200 exchanges) and an iperf3 run (3 s). The
delayed builds also read the line's own report (the median and p99 of every frame's achieved
delay, drops) and its CPU time over the iperf3 run (/proc/<pid>/stat). Printed per row:

    rate, delay, load, Mbit/s plain | delayed (ratio), RTT added - 2d (µs), line p50 - d and p99 - d
    (µs), drops, the line's CPU (% of one core), and whether the row is within the targets.

The ratio and the errors are measured against a baseline from the same run, never a constant.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.fabric.delaymeter import DelayMeter, tolerance_us  # noqa: E402
from workloads.fabric.linkprobe import iperf3_mbit, rtt_us  # noqa: E402
from workloads.fabric.netns import EmuSpec, Topology, delay_us  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(rate: str | None, delay: str | None, seconds: int, tag: str) -> dict:
    with Topology(EmuSpec(rate=rate, latency=delay), tag=tag) as topo:
        out = {"rtt_us": rtt_us(topo)}
        if topo.delay_line is None:
            out["mbit"] = iperf3_mbit(topo, seconds, omit=0)[0]
            return out
        meter, pid = DelayMeter(topo.env()), topo.delay_line.pid
        c0, t0 = cpu_s(pid), time.monotonic()
        out["mbit"] = iperf3_mbit(topo, seconds, omit=0)[0]
        out["cpu"] = (cpu_s(pid) - c0) / (time.monotonic() - t0)
        time.sleep(0.6)  # the line's report is rewritten twice a second
        dirs = meter.record()["links"]["n0-n1"]["directions"].values()
        out["p50_us"] = max(d["p50_us"] for d in dirs)
        out["p99_us"] = max(d["p99_us"] for d in dirs)
        out["drops"] = sum(d["drops"] for d in dirs)
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="10mbit,100mbit,1gbit,none")
    ap.add_argument("--delays", default="500us,2ms,10ms")
    ap.add_argument("--loads", default="idle,busy")
    ap.add_argument("--seconds", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: the delay line runs in network namespaces; run as root", file=sys.stderr)
        return 2
    head = (f"{'rate':>8} {'delay':>6} {'load':>5} {'plain':>7} {'delayed':>8} {'ratio':>6} {'rtt-2d':>8} "
            f"{'p50-d':>7} {'p99-d':>8} {'drops':>6} {'cpu':>5}  ok")
    print(head)
    print("-" * len(head))
    for load in args.loads.split(","):
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if load == "busy" else 0)]
        try:
            for rate in args.rates.split(","):
                rate = None if rate == "none" else rate
                for delay in args.delays.split(","):
                    d_us = delay_us(delay)
                    plain, line = [], []
                    for k, kind in enumerate(("plain", "line", "line", "plain")):  # ABBA
                        tag = f"{os.getpid()}b{k}"
                        (plain if kind == "plain" else line).append(
                            measure(rate, None if kind == "plain" else delay, args.seconds, tag))
                    mb0 = sum(p["mbit"] for p in plain) / 2
                    mb1 = sum(p["mbit"] for p in line) / 2
                    added = sum(x["rtt_us"] for x in line) / 2 - sum(p["rtt_us"] for p in plain) / 2 - 2 * d_us
                    p50 = max(x["p50_us"] for x in line) - d_us
                    p99 = max(x["p99_us"] for x in line) - d_us
                    drops = sum(x["drops"] for x in line)
                    cpu = max(x["cpu"] for x in line)
                    ok = abs(p50) <= tolerance_us(d_us) and mb1 >= 0.98 * mb0 and drops == 0
                    print(f"{rate or 'none':>8} {delay:>6} {load:>5} {mb0:7.1f} {mb1:8.1f} {mb1 / mb0:6.3f} "
                          f"{added:8.0f} {p50:7.0f} {p99:8.0f} {drops:6d} {100 * cpu:4.0f}%  {'yes' if ok else 'NO'}",
                          flush=True)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
