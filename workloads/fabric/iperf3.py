"""iperf3's `--json` document, read once for every caller: the link workload (workloads/link/tools.py)
and the emulator's background traffic (workloads/fabric/noise.py). Keys as esnet/iperf's
src/iperf_api.c writes them; Gbit/s is 1e9 bit/s. It lives on the fabric floor so that the
emulator, which sits below the workloads, can read it too.
"""

from __future__ import annotations

import json
from typing import Any

GBIT = 1e9


class ToolFailed(Exception):
    """The tool ran and said it failed (its own words are the message)."""


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
