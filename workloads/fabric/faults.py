"""A fault schedule on an emulated fabric: a link down for t seconds, or its rate dropped for t
seconds, mid-run, and what the job saw.

    emulate: {..., faults: [{link: n1, at: 2, down: 2}]}                  # node 1's link down 2 s
    emulate: {..., faults: [{link: l0-s1, at: 1, rate: 25%, for: 3}]}     # leaf 0's uplink to s1 at 25% for 3 s

`link` names one link as the delay line's records do: `n<i>` node i's own link (its emu0 and the
switch's or peer's end), `l<j>-s<k>` leaf j's uplink to spine k on a leaf-spine. `at` counts
seconds from the job's first timed step (rank 0 marks it in the schedule's folder; start-up, which
varies run to run, is not part of it), so "2 s into the measured steps" means the same in every
trial. `down: t` sets both ends of the link down (`ip link set ... down`) and up again t seconds
later (one end: the switch's port of a host link, the leaf's end of an uplink; the other end
loses its carrier, as when a cable is pulled); `rate: x%` (of the link's shaped rate) or `rate: 10mbit` with `for: t` changes its tbf or
htb rate (`tc qdisc change` / `tc class change`) and puts it back.

The emulator applies the schedule from a thread (`Injector`) and writes what it did, with the
times on the run's clock (FB_T0), to `events.json` in the schedule's folder (FAULTS_ENV); the
writing rank's record gets a `fault` block from it (`stamp`, at the record's close, whatever its
status): the events, and for training the step-clock figures of `summarize`. On leaving, every
link the schedule touched is put back where its namespace still exists; the namespaces go with the
topology's teardown, Ctrl-C included.

On a real fabric the same schedule drives a command of the user's (`fabric.faults_hook`, one argv
per event with {action} = down | up | rate | restore, {link} and {rate} filled in): the fabric's
own switch CLI or a PDU, which this code cannot reach.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from workloads.core.errors import UsageError

FAULTS_ENV = "FABRICBENCH_FAULTS"   # the schedule's folder: events.json (the emulator), window (rank 0)
RECOVERED = 0.05                   # recovered: a step within 5% of the steady state before the fault
_LINK = re.compile(r"^(n(?P<node>\d+)|l(?P<leaf>\d+)-s(?P<spine>\d+))$")


@dataclass(frozen=True)
class Fault:
    link: str
    at: float                      # seconds after the first timed step
    down: float | None = None      # the link is down this long
    rate: str | None = None        # "25%" of its shaped rate, or a tc rate ("10mbit")
    for_s: float | None = None     # the rate holds this long

    @property
    def seconds(self) -> float:  # how long it holds
        return float(self.down if self.down is not None else self.for_s)

    @property
    def kind(self) -> str:
        return "down" if self.down is not None else "rate"

    def describe(self) -> str:
        what = f"down {self.down:g} s" if self.down is not None else f"at {self.rate} for {self.for_s:g} s"
        return f"{self.link} {what}, {self.at:g} s into the timed steps"


def parse(raw: Any) -> tuple[Fault, ...]:
    """fabric.emulate.faults (a list of mappings) checked on its own: one line per mistake."""
    if raw in (None, [], ()):
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise UsageError(f"emulate.faults={raw!r}: give a list, e.g. [{{link: n1, at: 2, down: 2}}]")
    out = []
    for item in raw:
        if not isinstance(item, Mapping) or "link" not in item or "at" not in item:
            raise UsageError(f"emulate.faults item {item!r}: give link, at and one of down: <s> or rate: <x%> with "
                             "for: <s>, e.g. {link: n1, at: 2, down: 2}")
        extra = set(item) - {"link", "at", "down", "rate", "for"}
        if extra:
            raise UsageError(f"emulate.faults item {dict(item)}: unknown keys {sorted(extra)}; known: link, at, down, rate, for")
        try:
            at = float(item["at"])
            down = None if item.get("down") is None else float(item["down"])
            for_s = None if item.get("for") is None else float(item["for"])
        except (TypeError, ValueError):
            raise UsageError(f"emulate.faults item {dict(item)}: at, down and for are seconds (numbers)") from None
        rate = None if item.get("rate") is None else str(item["rate"])
        if (down is None) == (rate is None) or (rate is not None and for_s is None) or (down is not None and for_s is not None):
            raise UsageError(f"emulate.faults item {dict(item)}: give either down: <s>, or rate: <x%> with for: <s>")
        if at < 0 or (down is not None and down <= 0) or (for_s is not None and for_s <= 0):
            raise UsageError(f"emulate.faults item {dict(item)}: at must be >= 0 and the duration > 0")
        if rate is not None:
            _rate_bits(rate, 1e9)  # the form, checked now; its base comes with the topology
        out.append(Fault(str(item["link"]), at, down, rate, for_s))
    return tuple(out)


def _rate_bits(rate: str, base_bits: float | None) -> float:
    from workloads.fabric.netns import rate_bits_per_s

    if rate.endswith("%"):
        try:
            share = float(rate[:-1]) / 100
        except ValueError:
            share = -1.0
        if not 0 < share < 1:
            raise UsageError(f"emulate.faults rate {rate!r}: give a share between 0% and 100% of the link's rate, or a "
                             "tc rate such as 10mbit")
        if base_bits is None:
            raise UsageError(f"emulate.faults rate {rate!r}: the link is unshaped, so it has no rate to take a share "
                             "of; give a tc rate (10mbit) or shape the fabric (emulate.rate)")
        return share * base_bits
    return rate_bits_per_s(rate)


def ends(spec, link: str, tag: str) -> list[tuple[str, str, str | None]]:
    """(namespace, interface, its tc rate) of both ends of `link` in the topology `spec` builds,
    or UsageError naming the links it has."""
    m = _LINK.match(link)
    names = _links(spec)
    if not m or link not in names:
        raise UsageError(f"emulate.faults names link {link!r}, which this topology does not have; its links: "
                         f"{', '.join(names)}")
    p = f"fb-{tag}"
    if m["node"] is not None:
        i = int(m["node"])
        if spec.leaf_spine:
            j = i // (spec.nodes // spec.leaves)
            return [(f"{p}-{i}", "emu0", spec.rate), (f"{p}-l{j}", f"h{i}", spec.rate)]
        if spec.topology == "star" or (spec.topology is None and spec.nodes > 2):
            return [(f"{p}-{i}", "emu0", spec.rate), (f"{p}-br", f"p{i}", spec.rate)]
        return [(f"{p}-{i}", "emu0", spec.rate), (f"{p}-{1 - i}", "emu0", spec.rate)]
    j, k = int(m["leaf"]), int(m["spine"])
    return [(f"{p}-l{j}", f"u{k}", spec.spine_uplink(k)), (f"{p}-s{k}", f"d{j}", spec.spine_uplink(k))]


def _links(spec) -> list[str]:
    out = [f"n{i}" for i in range(spec.nodes)]
    if spec.leaf_spine:
        out += [f"l{j}-s{k}" for j in range(spec.leaves) for k in range(spec.spines)]
    return out


def check(faults: Sequence[Fault], spec, timeout_s: float | None) -> None:
    """Before any namespace exists: every link is the topology's, every rate has a base, and no
    fault outlasts the run's own limit."""
    from workloads.fabric.netns import rate_bits_per_s

    if faults and spec.delays():
        raise UsageError("emulate.faults on a fabric with a delay line: the line's links are spliced through its own "
                         "namespace, which a fault does not reach yet; drop latency/uplink_latency or the faults")
    for f in faults:
        for _, _, rate in ends(spec, f.link, "x"):
            if f.rate is not None:
                _rate_bits(f.rate, None if rate is None else rate_bits_per_s(rate))
        if timeout_s is not None and f.at + f.seconds >= timeout_s:
            raise UsageError(f"emulate.faults: {f.describe()} ends after the run's limit of {timeout_s:g} s "
                             f"(--timeout): a flap longer than the run; give a shorter or earlier fault")


def _tc_rate(spec, ns: str, dev: str, bits: float) -> list[list[str]]:
    rate = f"{int(bits)}bit"
    burst = str(spec.burst_bytes(rate))
    if spec.qdisc == "tbf":
        return [["tc", "-n", ns, "qdisc", "change", "dev", dev, "root", "handle", "1:", "tbf", "rate", rate,
                 "burst", burst, "latency", "100ms"]]
    return [["tc", "-n", ns, "class", "change", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", rate,
             "ceil", rate, "burst", burst, "cburst", burst]]


def _commands(spec, f: Fault, tag: str, apply: bool) -> list[list[str]]:
    from workloads.fabric.netns import rate_bits_per_s

    out = []
    both = ends(spec, f.link, tag)
    if f.down is not None:
        # one end only, the one that holds no route of its own: a host's link goes down at its
        # switch port (the host sees its carrier go, as when a cable is pulled, and keeps its
        # default route, which an administrative down of its own emu0 deletes for good), an
        # uplink at its leaf (the leaf's ECMP route marks that next hop dead and revives it on up)
        ns, dev, _ = both[1] if _LINK.match(f.link)["node"] is not None else both[0]
        return [["ip", "-n", ns, "link", "set", "dev", dev, "down" if apply else "up"]]
    for ns, dev, rate in both:  # a rate drop holds both ways: both ends' egress
        base = rate_bits_per_s(rate) if rate is not None else None
        out += _tc_rate(spec, ns, dev, _rate_bits(f.rate, base) if apply else base)
    return out


def _run(argv: Sequence[str]) -> str | None:
    p = subprocess.run(list(argv), capture_output=True, text=True)
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]


class Injector:
    """Applies a schedule from a thread once rank 0 marks its first timed step; a context manager
    that always restores what it changed. `events` says what happened, on the run's clock."""

    def __init__(self, spec, faults: Sequence[Fault], tag: str, folder: Path,
                 run: Callable[[Sequence[str]], str | None] = _run, poll_s: float = 0.02):
        self.spec, self.faults, self.tag, self.folder, self.run, self.poll_s = spec, tuple(faults), tag, folder, run, poll_s
        self.events: list[dict] = [{"fault": asdict(f), "describe": f.describe(), "applied_s": None, "restored_s": None,
                                    "problem": None} for f in self.faults]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def env(self) -> dict[str, str]:
        return {FAULTS_ENV: str(self.folder)} if self.faults else {}

    def __enter__(self) -> Injector:
        if self.faults:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._write()
            self._thread = threading.Thread(target=self._main, name="fault-injector", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            for f, e in zip(self.faults, self.events):
                if e["applied_s"] is not None and e["restored_s"] is None:
                    self._apply(f, e, apply=False, late=True)
            if self.faults:  # no schedule: no folder was made, nothing to record
                self._write()

    def outlasted(self) -> list[str]:
        """Faults the run did not see whole: it ended before one was applied or restored."""
        out = []
        for e in self.events:
            if e["applied_s"] is None:
                out.append(f"{e['describe']}: the run ended before it began")
            elif e.get("restored_late"):
                out.append(f"{e['describe']}: the run ended while it lasted")
        return out

    def _clock(self) -> float:
        try:
            return time.time() - float(os.environ["FB_T0"])
        except (KeyError, ValueError):
            return time.time()

    def _main(self) -> None:
        mark = self.folder / "window"
        while not mark.exists():
            if self._stop.wait(self.poll_s):
                return
        try:
            t0 = float(mark.read_text().strip())
        except (OSError, ValueError):
            t0 = self._clock()
        todo = sorted([(f.at, 1, i) for i, f in enumerate(self.faults)] +
                      [(f.at + f.seconds, 0, i) for i, f in enumerate(self.faults)])
        for when, start, i in todo:
            while self._clock() < t0 + when:
                if self._stop.wait(min(self.poll_s, max(0.0, t0 + when - self._clock()))):
                    return
            with self._lock:
                if self._stop.is_set():
                    return
                self._apply(self.faults[i], self.events[i], apply=bool(start))
                self._write()

    def _apply(self, f: Fault, e: dict, apply: bool, late: bool = False) -> None:
        problems = [p for argv in _commands(self.spec, f, self.tag, apply) if (p := self.run(argv)) is not None]
        e["applied_s" if apply else "restored_s"] = round(self._clock(), 3)
        if late:
            e["restored_late"] = True
        if problems and not late:  # after the run the namespaces may be gone: nothing left to restore
            e["problem"] = "; ".join(problems)

    def _write(self) -> None:
        tmp = self.folder / "events.json.tmp"
        tmp.write_text(json.dumps(self.events))
        tmp.replace(self.folder / "events.json")


# -- the ranks' side -------------------------------------------------------------------------

def window_started(t_epoch: float) -> None:
    """Rank 0, at its first timed step: the schedule's clock starts now (seconds on FB_T0's clock)."""
    folder = os.environ.get(FAULTS_ENV)
    if not folder:
        return
    try:
        t0 = float(os.environ.get("FB_T0", "0"))
        (Path(folder) / "window").write_text(f"{t_epoch - t0:.3f}")
    except (OSError, ValueError):
        pass


def summarize(events: list[dict], starts: Sequence[float], times: Sequence[float]) -> dict:
    """Step-clock figures of one fault window [a, b] (the first applied to the last restored,
    seconds on the run's clock): `starts`/`times` every timed step's start and duration.

    baseline = the median step before a; stall_s = Σ over the steps that overlap [a, b] and after
    it until recovery of (step - baseline); degraded_throughput = baseline / mean of the steps
    overlapping [a, b] (1: no loss); recovery_s = from b to the end of the first step that starts
    at or after b and takes <= (1 + 5%) x baseline (None: it never did)."""
    import numpy as np

    applied = [e["applied_s"] for e in events if e.get("applied_s") is not None]
    restored = [e["restored_s"] for e in events if e.get("restored_s") is not None]
    if not applied or not restored or not starts:
        return {"stall_s": None, "why": "the fault was not applied within the timed steps"}
    a, b = min(applied), max(restored)
    ends = [s + t for s, t in zip(starts, times)]
    before = [t for s, t, e in zip(starts, times, ends) if e <= a]
    if not before:
        return {"stall_s": None, "why": "no timed step finished before the fault: nothing to compare with"}
    base = float(np.median(before))
    during = [t for s, t, e in zip(starts, times, ends) if e > a and s < b]
    rec_end = next((e for s, t, e in zip(starts, times, ends) if s >= b and t <= (1 + RECOVERED) * base), None)
    horizon = rec_end if rec_end is not None else math.inf
    stall = sum(t - base for s, t, e in zip(starts, times, ends) if e > a and s < horizon)
    return {
        "window_s": [a, b], "baseline_step_s": base, "steps_before": len(before), "steps_during": len(during),
        "stall_s": max(0.0, stall),
        "degraded_throughput": (base / float(np.mean(during))) if during else None,
        "recovery_s": None if rec_end is None else max(0.0, rec_end - b),
        "recovered": rec_end is not None,
        # §11.3 of the BMWG draft: zero-impact when the step that saw the failure lies within the
        # steady state's p99
        "zero_impact": bool(during) and max(during) <= float(np.percentile(before, 99)),
    }


def stamp(rec: dict) -> None:
    """The record's `fault` block, where the run had a schedule: what was applied when, the
    job's figures (training: its step clock) and its outcome (the record's status and error)."""
    folder = os.environ.get(FAULTS_ENV)
    if not folder:
        return
    try:
        events = json.loads((Path(folder) / "events.json").read_text())
    except (OSError, ValueError):
        events = []
    samples = rec.get("samples") or {}
    warm = int(samples.get("warmup_steps") or 0)
    starts, times = (samples.get("step_start_s") or [])[warm:], (samples.get("step_time_s") or [])[warm:]
    out = {"events": events, **(summarize(events, starts, times) if starts else
                                {"stall_s": None, "why": "this workload keeps no step clock; see its own metrics"})}
    status = rec.get("status")
    out["outcome"] = "completed" if status == "ok" else f"{status}: {rec.get('error') or 'no message'}"
    rec["fault"] = out
