"""An emulated topology built once and lent to many runs (a study's arm), each run still its own
processes, process groups, sockets and models.

A study builds one Topology per emulated fabric its arms run on (workloads/study/fabrics.py) and
names it to each run's emulator in KEPT_ENV; the emulator attaches to it instead of building and
removing namespaces, veths, qdiscs and a delay line around every run (about 1.5 s of a run's
start-up on a busy 2-core host). What a run could inherit from the one before it is reset
before each run (`fresh`): the nodes' cached TCP metrics (Linux keeps each peer's RTT and
ssthresh per destination and seeds new connections from them) and their neighbour tables, and a
namespace that still holds a process of the run before is not lent again. The delay line's and
the NICs' counters are read per point as differences, as on a topology of the run's own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from workloads.core import procstat

KEPT_ENV = "FB_EMU_KEPT"
LENT_ENV = "FB_EMU_KEPT_RUN"  # set for a run's processes only when its emulator attached: the record's fabric.kept


def _spec_key(spec) -> str:
    return json.dumps(dataclasses.asdict(spec), sort_keys=True)


def handle(topo, lent: dict[str, Any] | None = None) -> str:
    """What a run's emulator needs of a built Topology, as the value of KEPT_ENV; `lent`: what
    its record says of the loan (`fabric.kept`: the topology, the run it was built for, how many
    runs it has served, this one included)."""
    return json.dumps({"spec": _spec_key(topo.spec), "tag": topo.tag, "nodes": topo.nodes,
                       "host_addr": topo.host_addr, "env": topo.env(), "described": topo.describe(),
                       "delay_pid": topo.delay_line.pid if topo.delay_line is not None else None,
                       "delay_dir": str(topo.delay_dir) if topo.delay_dir is not None else None,
                       "lent": lent})


def lent(environ=os.environ) -> dict[str, Any] | None:
    """The record's `fabric.kept`: {topology, built_at_run, runs_on_it} when the run's emulator
    attached to a topology its study kept, else None (it built its own, or is not emulated)."""
    try:
        got = json.loads(environ.get(LENT_ENV) or "null")
    except json.JSONDecodeError:
        return None
    return got if isinstance(got, dict) else None


class Attached:
    """A Topology that someone else built and will remove: the same attributes the emulator
    reads (spec, tag, nodes, host_addr, env(), describe(), the delay line's health)."""

    def __init__(self, spec, held: dict[str, Any]):
        self.spec = spec
        self.tag = str(held["tag"])
        self.nodes = list(held["nodes"])
        self.host_addr = held.get("host_addr")
        self._env = dict(held.get("env") or {})
        self._described = str(held["described"])
        self.delay_pid = held.get("delay_pid")
        self.delay_dir = Path(held["delay_dir"]) if held.get("delay_dir") else None
        self.delay_line = self.delay_pid  # truthy when the topology has a line to watch
        self.lent = held.get("lent") if isinstance(held.get("lent"), dict) else None

    def env(self) -> dict[str, str]:
        return dict(self._env) | ({LENT_ENV: json.dumps(self.lent)} if self.lent else {})

    def describe(self) -> str:
        loan = (f"built for run {self.lent.get('built_at_run')}, run {self.lent.get('runs_on_it')} on it"
                if self.lent else "built before its first run")
        return f"{self._described} (kept for the study's arm: {loan})"

    def delay_line_problem(self) -> str | None:
        if self.delay_pid is None or procstat.living(self.delay_pid):
            return None
        err = self.delay_dir / "stderr" if self.delay_dir else None
        why = err.read_text().strip().splitlines() if err is not None and err.is_file() else []
        return (f"the delay line (pid {self.delay_pid}) died mid-run" + (f": {why[-1]}" if why else "")
                + "; the delayed links carry nothing without it")

    def __enter__(self) -> Attached:
        return self

    def __exit__(self, *exc) -> None:
        pass  # its builder removes it


def attach(spec, host_link: bool, environ=os.environ) -> Attached | None:
    """The kept topology named in KEPT_ENV when it is the one this run asks for (the same spec;
    a host link when the run serves), else None: the run builds its own."""
    raw = environ.get(KEPT_ENV)
    if not raw:
        return None
    try:
        held = json.loads(raw)
    except json.JSONDecodeError:
        return None
    if held.get("spec") != _spec_key(spec) or (host_link and not held.get("host_addr")):
        return None
    if any(not Path(f"/run/netns/{n}").exists() for n in held.get("nodes") or []):
        return None
    return Attached(spec, held)


def fresh(topo) -> bool:
    """Make a kept topology's nodes as a new build leaves them, before a run: no process in any
    of its namespaces, no cached TCP metrics, no neighbour entries. False when a process of an
    earlier run is still there (the topology should then be rebuilt, not lent)."""
    for ns in topo.nodes:
        if subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            return False
    for ns in topo.nodes:
        # seeds a new connection's RTT and ssthresh from the last one to the same peer (tcp(7)
        # tcp_no_metrics_save): one run's congestion would carry into the next
        subprocess.run(["ip", "-n", ns, "tcp_metrics", "flush", "all"], capture_output=True)
        subprocess.run(["ip", "-n", ns, "neigh", "flush", "all"], capture_output=True)
    return True
