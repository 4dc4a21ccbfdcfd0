"""The raw-link tools, one small object each: how to start its server and its client, and how to
read what the client printed. The harness (workloads/link/run.py) owns placement, readiness,
timeouts and the record; a tool only knows its own command line and output.

    iperf3       TCP throughput (esnet/iperf); `--json` output, keys as src/iperf_api.c writes them
    ib_write_bw  RDMA write bandwidth (linux-rdma/perftest); the text table of perftest_parameters.h
    ib_read_lat  RDMA read latency (perftest); likewise

Units: Gbit/s is 1e9 bit/s (iperf3's bits_per_second / 1e9; perftest's --report_gbits "Gb/sec",
whose format_factor is 125000000 bytes); perftest's default "MiB/sec" is 2^20 bytes/s.
The formulas are in docs/metrics.md ("Raw link").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.fabric.iperf3 import GBIT, ToolFailed, load_iperf3, parse_iperf3

IDLE_S = 60                     # iperf3 server: exit when no client connected for this long
MIB_BITS = 8 * 2**20            # one MiB/sec in bit/s


@dataclass(frozen=True)
class Options:
    """What a link test is asked to do (conf/workload/link.yaml, `link:`)."""

    tool: str = "iperf3"
    duration_s: float = 5.0
    omit_s: float = 1.0
    streams: int = 1
    window: str | None = None      # iperf3 -w: socket buffer, e.g. 4M
    direction: str = "forward"     # forward: client (rank 1) sends; reverse: server sends; bidir: both
    port: int = 5201
    device: str | None = None      # perftest -d
    gid_index: int | None = None   # perftest -x (RoCE)
    size: int | None = None        # perftest -s; None: perftest's default
    iters: int | None = None       # perftest -n; None: perftest's default


# ---------------------------------------------------------------------------------------
# perftest

_TITLE = re.compile(r"^\s+(?P<verb>[A-Za-z_]+) (?:\w+ )*?(?P<kind>BW|Latency) Test\s*$")
_FIELD = re.compile(r"(Device|Link type|Transport type|Mtu)\s*:\s*(\S+)")
_NUM = r"[-+]?\d+(?:\.\d+)?"


def parse_perftest(text: str) -> dict[str, Any]:
    """perftest's text report (ib_write_bw, ib_read_lat, ...) -> its figures, read by the header
    line that precedes the row (RESULT_FMT*, perftest_parameters.h), so the unit is the one
    the header names."""
    info: dict[str, Any] = {}
    lines = text.splitlines()
    for ln in lines:
        if _TITLE.match(ln) and "test" not in info:
            info["test"] = ln.strip()
        for key, value in _FIELD.findall(ln):
            info.setdefault(key.lower().replace(" ", "_"), value)
    for i, ln in enumerate(lines):
        if "#bytes" not in ln:
            continue
        row = next((r for r in lines[i + 1:] if r.strip()), "")
        nums = re.findall(_NUM, row)
        if "BW average[" in ln and len(nums) >= 5:
            factor = GBIT if "BW average[Gb/sec]" in ln else MIB_BITS if "BW average[MiB/sec]" in ln else None
            if factor is None:
                raise ToolFailed(f"perftest's header names a unit this parser does not know: {ln.strip()}")
            size, iters, peak, avg, rate = (float(x) for x in nums[:5])
            return info | {"size(B)": int(size), "iterations": int(iters), "bw_peak(Gbit/s)": peak * factor / GBIT,
                           "bw_average(Gbit/s)": avg * factor / GBIT, "msg_rate(Mpps)": rate}
        if "t_typical[usec]" in ln and len(nums) >= 9:
            v = [float(x) for x in nums[:9]]
            return info | {"size(B)": int(v[0]), "iterations": int(v[1]), "lat_min(us)": v[2], "lat_max(us)": v[3],
                           "lat_typical(us)": v[4], "lat_avg(us)": v[5], "lat_stdev(us)": v[6],
                           "lat_p99(us)": v[7], "lat_p99.9(us)": v[8]}
    raise ToolFailed("perftest printed no result table (no '#bytes' header followed by a row)")


# ---------------------------------------------------------------------------------------
# the plugins


@dataclass(frozen=True)
class Tool:
    name: str
    package: str                  # what to install where it is missing (Debian/Ubuntu)
    rdma: bool                    # needs an RDMA device (/sys/class/infiniband)

    def server_argv(self, o: Options, bind: str) -> list[str]:
        raise NotImplementedError

    def client_argv(self, o: Options, server: str) -> list[str]:
        raise NotImplementedError

    def parse(self, stdout: str) -> dict[str, Any]:
        raise NotImplementedError

    def run_s(self, o: Options) -> float:
        """How long the client should take, for its timeout (the harness adds a margin)."""
        return o.duration_s + o.omit_s


class Iperf3(Tool):
    def server_argv(self, o: Options, bind: str) -> list[str]:
        # -1: serve one test, then exit, so the server's end is the test's end. --idle-timeout: a
        # one-off server that no client reaches exits by itself (iperf3's main.c), so a rank killed
        # before it could stop its server (SIGKILL) leaves no listener behind for long.
        return ["iperf3", "-s", "-1", "-B", bind, "-p", str(o.port), "--json", "--idle-timeout", str(IDLE_S)]

    def client_argv(self, o: Options, server: str) -> list[str]:
        argv = ["iperf3", "-c", server, "-p", str(o.port), "-t", f"{o.duration_s:g}", "-O", f"{o.omit_s:g}",
                "-P", str(o.streams), "--json", "--connect-timeout", "5000"]
        if o.window:
            argv += ["-w", str(o.window)]
        argv += {"forward": [], "reverse": ["-R"], "bidir": ["--bidir"]}[o.direction]
        return argv

    def parse(self, stdout: str) -> dict[str, Any]:
        return parse_iperf3(load_iperf3(stdout))


class Perftest(Tool):
    def _common(self, o: Options) -> list[str]:
        argv = [self.name, "-p", str(o.port), "--report_gbits"]
        if o.device:
            argv += ["-d", o.device]
        if o.gid_index is not None:
            argv += ["-x", str(o.gid_index)]
        if o.size is not None:
            argv += ["-s", str(o.size)]
        if o.iters is not None:
            argv += ["-n", str(o.iters)]
        return argv

    def server_argv(self, o: Options, bind: str) -> list[str]:
        return self._common(o)  # perftest's server listens on every address of the port

    def client_argv(self, o: Options, server: str) -> list[str]:
        return self._common(o) + [server]

    def parse(self, stdout: str) -> dict[str, Any]:
        return parse_perftest(stdout)

    def run_s(self, o: Options) -> float:
        return 60.0  # perftest runs a number of iterations, not a duration: a minute is far above them


TOOLS: dict[str, Tool] = {t.name: t for t in (
    Iperf3("iperf3", "iperf3", rdma=False),
    Perftest("ib_write_bw", "perftest", rdma=True),
    Perftest("ib_read_lat", "perftest", rdma=True),
)}


def rdma_devices(root: str | Path | None = None) -> list[str]:
    """RDMA devices this host has (what perftest's -d takes); the sysfs root as preflight reads it."""
    from workloads.fabric.preflight import sysfs_root

    d = sysfs_root(root) / "class" / "infiniband"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []
