"""What the delay line did around one point, as the record's `fabric.delay` block, and whether
the point ran at the delay its label asks for.

The delay line (fabric/delayline.py) keeps cumulative counts per link and direction and a
histogram of each frame's achieved one-way delay, in a JSON file the emulator names in
DELAY_ENV. The writing rank reads it when a point starts and when it ends (session.Recorded);
the difference is what this point's traffic saw (each read asks the line for a report of that
moment: `fresh`): per link, frames, bytes, drops and the achieved
delay's p50 and p99. A point whose median achieved delay is off the asked delay by more than
the tolerance ran on another link than the one its record names: it fails, as a run whose
traffic took the wrong transport fails, and no study counts it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Mapping

DELAY_ENV = "FABRICBENCH_DELAY_STATS"
TOLERANCE_US = 150.0      # the absolute floor of the tolerance: the line's own error on a loaded 2-core host
TOLERANCE_REL = 0.05      # and 5% of the asked delay, whichever is larger
MIN_FRAMES = 50           # a direction that carried fewer frames in the point is not judged


def tolerance_us(delay_us: float) -> float:
    return max(TOLERANCE_US, TOLERANCE_REL * delay_us)


def _read(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError):
        return None


FRESH_WAIT_S = 2.0        # how long a meter waits for the report it asked for (the line writes one every 0.5 s anyway)


def fresh(path: str) -> dict[str, Any] | None:
    """The line's report as of now. The line rewrites it only every 0.5 s, so a read at a point's
    edge could miss the point's frames (a 20-call 1 KiB all_reduce at 0.5 ms, ~0.1 s long, was
    recorded with 0 frames, and the next run's point with both: 42, 0, 740 over one arm's three
    runs): the meter asks the line for a report (SIGUSR1) and waits for one written after it asked."""
    since = time.time_ns()
    report = _read(path)
    if report is None or report.get("state") != "running" or "time_ns" not in report:
        return report
    pid = int(report.get("pid") or 0)
    try:  # only a delay line: a report left by a line killed with -9 names a pid that may be anyone's now
        if pid > 0 and b"workloads.fabric.delayline" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGUSR1)
    except OSError:
        pass  # gone, or not ours to signal: its next periodic report, or none
    deadline = time.monotonic() + FRESH_WAIT_S
    while report.get("state") == "running" and report["time_ns"] < since and time.monotonic() < deadline:
        time.sleep(0.005)
        report = _read(path) or report
    return report


def quantile_us(hist: Mapping[str, int], bucket_us: float, q: float) -> float | None:
    """The q-quantile of a histogram of {bucket index: count}, at the bucket's middle."""
    total = sum(hist.values())
    if total <= 0:
        return None
    need, seen = q * total, 0
    for k in sorted(hist, key=int):
        seen += hist[k]
        if seen >= need:
            return (int(k) + 0.5) * bucket_us
    return None


def window(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per link direction, what happened between two reads of the stats file."""
    out = {}
    bucket = float(after.get("bucket_us", 10))
    for name, b in after["directions"].items():
        a = before["directions"].get(name, {})
        hist = {k: n - a.get("hist", {}).get(k, 0) for k, n in b["hist"].items()}
        hist = {k: n for k, n in hist.items() if n > 0}
        out[name] = {"frames": b["frames"] - a.get("frames", 0), "bytes": b["bytes"] - a.get("bytes", 0),
                     "drops": (b["queue_drops"] + b["socket_drops"]) - (a.get("queue_drops", 0) + a.get("socket_drops", 0)),
                     "p50_us": quantile_us(hist, bucket, 0.5), "p99_us": quantile_us(hist, bucket, 0.99)}
    return out


def judge(links: dict[str, dict[str, Any]]) -> str | None:
    """The one line that says this point did not run at its asked delay, or None."""
    bad = []
    for label, link in links.items():
        asked, tol = link["asked_us"], tolerance_us(link["asked_us"])
        for name, d in link["directions"].items():
            if d.get("frames", MIN_FRAMES) < MIN_FRAMES:
                continue  # a handful of frames (ARP, a keep-alive) is no median to judge a point by
            if d["p50_us"] is not None and abs(d["p50_us"] - asked) > tol:
                bad.append(f"{label} {name} held frames {d['p50_us'] / 1e3:.3f} ms (median), asked "
                           f"{asked / 1e3:.3f} ms ± {tol:.0f} µs")
    if not bad:
        return None
    return ("the emulated delay was not what the fabric asks: " + "; ".join(bad) +
            ". The host was too busy for the delay line; give it a core (fewer ranks or hogs) or a larger delay")


def check_delay_applied(emulate: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> None:
    """UsageError when the config asks for a delay that no delay line applies: only the emulator
    builds one (and names it in DELAY_ENV), and a record must not claim a delay its run never had."""
    asked = {k: v for k, v in dict(emulate or {}).items() if k in ("latency", "uplink_latency") and v is not None}
    if asked and not (os.environ if environ is None else environ).get(DELAY_ENV):
        from workloads.core.errors import UsageError

        said = ", ".join(f"fabric.emulate.{k}={v}" for k, v in asked.items())
        raise UsageError(f"{said} asks for a delay line, which only the emulator builds; run through "
                         "launch/emulate.py (root) with an emulated fabric, e.g. sudo .venv/bin/python launch/emulate.py "
                         "launch/train.py fabric=emu-100m fabric.emulate.latency=2ms, or set it to null")


@contextlib.contextmanager
def promised():
    """While the emulator checks a job before its namespaces exist: the delay line is not built
    yet, but will be, so check_delay_applied must not refuse it."""
    had = os.environ.get(DELAY_ENV)
    os.environ[DELAY_ENV] = had or "(built with the emulated fabric)"
    try:
        yield
    finally:
        if had is None:
            del os.environ[DELAY_ENV]


class DelayMeter:
    """Reads the delay lines' stats when a point starts and ends; inactive without DELAY_ENV."""

    def __init__(self, environ: Mapping[str, str] | None = None):
        self.paths = [p for p in (os.environ if environ is None else environ).get(DELAY_ENV, "").split(",") if p]
        self.start = [fresh(p) for p in self.paths]

    def record(self) -> dict[str, Any] | None:
        """`fabric.delay` of the record: per link, the asked delay and what each direction achieved."""
        if not self.paths:
            return None
        links, unmeasured, policy = {}, [], None
        for path, before in zip(self.paths, self.start):
            after = fresh(path)
            if before is None or after is None:
                unmeasured.append(f"could not read {path} (the delay line ended, or not root)")
                continue
            policy = after.get("policy")
            if after.get("state") != "running":
                unmeasured.append(f"the delay line (pid {after.get('pid')}) had stopped before the point ended")
            for label, link in after["links"].items():
                old = before["links"].get(label, {}).get("directions", {})
                links[label] = {"asked_us": link["delay_us"],
                                "directions": window({"directions": old}, {"directions": link["directions"],
                                                                          "bucket_us": after.get("bucket_us", 10)})}
        # policy: fifo when the line got a real-time priority, other when the host refused it
        # (a cgroup without a real-time budget): then a busy host delays its holds more
        out: dict[str, Any] = {"via": "delay line (userspace, AF_PACKET)", "policy": policy, "links": links,
                               "tolerance": f"max({TOLERANCE_US:g} µs, {100 * TOLERANCE_REL:g}%) on the median"}
        if unmeasured:
            out["unmeasured"] = "; ".join(unmeasured)
        out["problem"] = out.get("unmeasured") or judge(links)
        return out

    def stamp(self, rec: dict[str, Any]) -> None:
        """Put `fabric.delay` in the record; an ok point whose delay was off becomes failed."""
        if (d := self.record()) is None or not isinstance(rec.get("fabric"), dict):
            return
        rec["fabric"]["delay"] = d
        if d["problem"] and rec.get("status") in ("running", "ok"):
            rec["status"], rec["error"] = "failed", d["problem"]
