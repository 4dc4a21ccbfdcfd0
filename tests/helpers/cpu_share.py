"""A larger CPU share for the worker that runs the timed group (the tests marked `timing`, among
them every namespace test whose assertion depends on measured speed; tests/conftest.py), so
that the other xdist workers' launches do not decide what they measure.

The namespace tests time work on shaped links and compare it with unshaped runs: a study that
must call a 100 Mbit/s link slower, a percent-of-line-rate bound, TTFT added by the link. Their
unshaped arms are CPU-bound, so on a 2-core machine their speed halves whenever the other worker
starts a 2-rank job or a server, and a verdict's interval then spans that, not the link (CI: a
training A/B measured +99% [-10%, +342%] over 3 blocks; one all_reduce trial 77% of the line
rate where its siblings reached 95%). That load is the test rig's own, not the subject, so the
worker joins a cgroup with 8x the default CPU weight while it runs a test of the timed group,
and leaves it for every other test. The price is paid by the other worker, whose share now
swings between ~20% and all of it: a real A/A study there saw its control 179% "faster" (both
blocks), so the A/A studies whose tests judge their verdicts are in the timed group too.
Children inherit the cgroup, also the
emulator's new sessions (a nice value would not reach those: each session is its own
autogroup).

cgroup v1's `cpu` controller (this machine, CI) or a cgroup v2 root that delegates `cpu`;
elsewhere nothing changes, and `state()`, which the timed tests' failure messages carry,
says why.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARES_V1, WEIGHT_V2 = 8192, 800  # 8x the defaults (1024, 100)
RT_RUNTIME_US = 500_000  # of each 1 s period, for SCHED_FIFO tasks in the group (the root keeps 950,000)
_V1, _V2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
_state = {"group": None, "home": None, "why": "not tried", "in": None}  # "in": the cgroup this process is in


def _home() -> Path | None:
    """This process's cpu cgroup directory (v1), or its v2 cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return _V1 / path.lstrip("/")
        if controllers == "" and not (_V1 / "cpu.shares").exists():
            return _V2 / path.lstrip("/")
    return None


def _sweep(parent: Path) -> None:
    """Remove the groups of sessions that were killed before release(): empty, their pid gone.
    rmdir refuses a group that still holds a process, so a live one is never touched."""
    for group in parent.glob("fabricbench-tests-*"):
        pid = group.name.rsplit("-", 1)[1]
        if pid.isdigit() and not Path("/proc", pid).exists():
            try:
                group.rmdir()
            except OSError:
                pass


def _make() -> Path | None:
    name = f"fabricbench-tests-{os.getpid()}"
    _sweep(_V1 if (_V1 / "cpu.shares").exists() else _V2)
    try:
        if (_V1 / "cpu.shares").exists():
            group = _V1 / name
            group.mkdir(exist_ok=True)
            (group / "cpu.shares").write_text(str(SHARES_V1))
            # A new group gets no real-time budget (cpu.rt_runtime_us 0), and the emulator's delay
            # line (workloads/fabric/delayline.py) asks for SCHED_FIFO to keep its holds exact on a
            # busy host: without a budget here it would run at the normal policy, as it may in a
            # user's job, and the timed tests would measure that fallback.
            # The kernel refuses a budget that, with the sibling groups' (a session killed before
            # release() may leave one holding its share), exceeds the parent's: ask less then.
            rt = group / "cpu.rt_runtime_us"
            for budget in (RT_RUNTIME_US, RT_RUNTIME_US // 2, RT_RUNTIME_US // 5, RT_RUNTIME_US // 10):
                try:
                    rt.write_text(str(budget))
                    break
                except OSError:
                    continue
        elif "cpu" in (_V2 / "cgroup.subtree_control").read_text().split():
            group = _V2 / name
            group.mkdir(exist_ok=True)
            (group / "cpu.weight").write_text(str(WEIGHT_V2))
        else:
            _state["why"] = "no cgroup cpu controller to use"
            return None
    except OSError as e:
        _state["why"] = f"cannot make a cpu cgroup ({e.strerror})"
        return None
    _state["why"] = f"{group} ({'cpu.shares' if group.parent == _V1 else 'cpu.weight'} 8x)"
    return group


def prefer(on: bool) -> None:
    """Move this process into the weighted cgroup (on) or back to where it started (off)."""
    if on and _state["group"] is None and _state["why"] == "not tried":
        _state["home"], _state["group"] = _home(), _make()
    target = _state["group"] if on else _state["home"] if _state["group"] is not None else None
    if target is not None and target != _state["in"]:  # most tests stay where the last one was
        try:
            (target / "cgroup.procs").write_text(str(os.getpid()))
            _state["in"] = target
        except OSError as e:
            _state["why"] = f"cannot join {target} ({e.strerror})"


def release() -> None:
    """Back home, and the group removed (if a server it started still runs there, it stays)."""
    group = _state["group"]
    if group is not None:
        prefer(False)
        try:
            group.rmdir()
        except OSError:
            pass


def state() -> str:
    return _state["why"]
