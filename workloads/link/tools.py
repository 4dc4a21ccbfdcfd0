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

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GBIT = 1e9
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


class ToolFailed(Exception):
    """The tool ran and said it failed (its own words are the message)."""


# ---------------------------------------------------------------------------------------
# iperf3


def _sum(end: dict, key: str) -> dict | None:
    s = end.get(key)
    return s if isinstance(s, dict) and "bits_per_second" in s else None


def parse_iperf3(doc: dict[str, Any]) -> dict[str, Any]:
    """One iperf3 `--json` document (client or server side) -> its figures.

    iperf3 reports a failure as a top-level "error" string, with exit status 0 in 3.12 (seen:
    "unable to connect to server: Connection refused"), so the document, not the exit status,
    says whether it measured. `sum_sent` is the sending side's total and `sum_received` the
    receiving side's, whichever end started the test; with --bidir the reverse direction has
    its own pair (`*_bidir_reverse`)."""
    if doc.get("error"):
        raise ToolFailed(f"iperf3: {doc['error']}")
    end = doc.get("end") or {}
    sent, received = _sum(end, "sum_sent"), _sum(end, "sum_received")
    if sent is None or received is None:
        raise ToolFailed("iperf3's JSON has no end.sum_sent/sum_received (a UDP test, or a test that never ran)")
    test = (doc.get("start") or {}).get("test_start") or {}
    out = _direction(sent, received)
    out |= {"protocol": test.get("protocol"), "streams": test.get("num_streams"), "omit_s": test.get("omit"),
            "reverse": bool(test.get("reverse"))}
    rs, rr = _sum(end, "sum_sent_bidir_reverse"), _sum(end, "sum_received_bidir_reverse")
    out["bidir_reverse"] = _direction(rs, rr) if rs and rr else None
    cpu = end.get("cpu_utilization_percent") or {}
    out["cpu_host_total(%)"], out["cpu_remote_total(%)"] = cpu.get("host_total"), cpu.get("remote_total")
    return out


def _direction(sent: dict, received: dict) -> dict[str, Any]:
    return {"sent(Gbit/s)": sent["bits_per_second"] / GBIT, "received(Gbit/s)": received["bits_per_second"] / GBIT,
            "bytes_sent": int(sent["bytes"]), "bytes_received": int(received["bytes"]),
            "seconds": float(received["seconds"]),
            # TCP retransmits, counted by the sender on Linux (absent elsewhere, and for UDP)
            "retransmits": sent.get("retransmits")}


def load_iperf3(text: str) -> dict[str, Any]:
    """iperf3's stdout -> the JSON document; a ToolFailed naming what came instead."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "no output")
        raise ToolFailed(f"iperf3 printed no JSON ({first[:200]})") from None
    if not isinstance(doc, dict):
        raise ToolFailed("iperf3's JSON is not an object")
    return doc


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
