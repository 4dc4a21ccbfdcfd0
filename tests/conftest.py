"""Fixtures every test folder shares, and the `requires` marker (helpers.need). Tests are
CPU-only and use real processes and sockets; helpers live in tests/helpers/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, child_env, cpu_share, need


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the group marks into the groups it schedules
def pytest_collection_modifyitems(config, items):
    """Under xdist (`make test` runs three workers), a module's tests stay on one worker, so a
    module's shared launch (a server, a study) starts once. The tests marked `timing` (real A/A
    studies, verdicts, rates, TTFT ratios: they compare runs made minutes apart) share the
    `timed` worker, which runs with a larger CPU weight (helpers/cpu_share.py); a namespace test
    whose assertion depends on measured speed carries `timing` too, and so does one that shares
    a launch with such a test (emu_ab runs once per worker). The other tests that need root
    (namespaces, tc) share the `ns` group: it runs beside `timed` at the default weight, since
    two emulations at a time are safe (each host link's /30 is chosen under a lock,
    netns.HOST_LINK_LOCK; the leftover check below tells this worker's namespaces from
    another's). The Slurm tests (their private cluster) share another."""
    for item in items:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
        if "emu_ab" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(2400))  # whichever runs first pays for the study's 12 runs
    # The longest work first, so that no worker starts a long group when the others are nearly
    # done: the timed group, then the namespace and Slurm groups, then modules with slow tests,
    # then the rest. xdist's --loadscope-reorder (on by default) then sorts the groups by their
    # number of tests, keeping this order only among groups of equal size (docs/tests.md).
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    rank = {"timed": 0, "ns": 1, "slurm": 1}
    items.sort(key=lambda item: rank.get(_group(item), 2 if item.module.__name__ in slow else 3))


def _needs(item) -> set[str]:
    return {c for m in item.iter_markers("requires") for c in m.args}


def _group(item) -> str:
    needs = _needs(item)
    if "slurm" in needs:
        return "slurm"
    if item.get_closest_marker("timing"):
        return "timed"
    if "root" in needs:
        return "ns"
    return item.nodeid.split("::")[0].split("@")[0]


_NETNS_MODULES: set[str] = set()  # modules whose namespace tests ran in this process


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        need(*mark.args)
    group = _group(item)
    if "root" in _needs(item):
        _NETNS_MODULES.add(item.module.__name__)
    if _root():
        cpu_share.prefer(group == "timed")  # helpers/cpu_share.py: the rig's own load must not decide timings


def pytest_sessionfinish(session):
    cpu_share.release()


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    return tmp_path / "results"


@pytest.fixture(scope="session")
def emu_ab(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """The emulated A/B study of docs/studies.md (conf/study/emu-ab.yaml: an all_reduce and tiny training
    over an unshaped veth pair and a 100 Mbit/s one, two namespaces, ABBA) as a user runs it,
    declaring the difference it must call (50%; the shipped plan is 8 blocks for 10%), so that
    its plan chooses 3 blocks. One run, 12 cells, read by the study's, the emulator's and the
    line-rate tests: (its output root, the finished `fabricbench study`). Root only."""
    need("root")
    tmp = tmp_path_factory.mktemp("emu-ab")
    spec = tmp / "emu-ab.yaml"
    spec.write_text((REPO / "conf" / "study" / "emu-ab.yaml").read_text() + "detect: 50%\n")
    out = tmp / "results"
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "study", str(spec), "--output-root", str(out)],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return out, r


def _namespaces_and_veths() -> set[str]:
    """Our namespaces (fb-<pid>-...) and any emu0 veth left in the root namespace (ours only
    ever live inside namespaces)."""
    from workloads.fabric.netns import leftovers

    links = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    return {n for n in leftovers("fb-") if not _someone_elses(n)} | \
        {f"root-namespace veth {w.rstrip(':')}" for w in links.split() if w.startswith("emu0")}


def _someone_elses(name: str) -> bool:
    """fb-<pid>[suffix]-...: the process that made it (an emulator, or a test process that
    builds a Topology itself and tags it <its pid><suffix>) is alive and is neither this test
    process nor a descendant of it (another xdist worker, another suite, a person's run on the
    same machine). A namespace whose maker has exited is a leftover, whoever ran it."""
    import os
    import re

    def parent(pid: int) -> int | None:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    m = re.match(r"fb-(\d+)", name)
    if not m:
        return False
    pid: int | None = int(m.group(1))
    if parent(pid) is None:
        return False  # its emulator is gone
    while pid is not None and pid > 1:
        if pid == os.getpid():
            return False
        pid = parent(pid)
    return True


@pytest.fixture(scope="module", autouse=True)
def nothing_of_ours_remains(request):
    """After every module whose namespace tests ran here: each namespace and veth they made is
    gone, also when a test failed (deleting a namespace deletes its veths and their qdiscs).
    Two workers (groups `timed` and `ns`) build namespaces at once: the other's, while its
    maker lives, are someone else's (_someone_elses) on both sides of the difference, so what
    is new since before the module is this process's."""
    before = _namespaces_and_veths() if _root() else set()
    yield
    if request.module.__name__ in _NETNS_MODULES:
        left = _namespaces_and_veths() - before
        assert not left, f"left behind by {request.module.__name__}: {sorted(left)}"


def _root() -> bool:
    import os

    return os.geteuid() == 0


def pytest_configure(config):
    """FB_TEST_CPU_LOG=<file>: one line per test phase with its wall and CPU seconds (this
    process and the children it waited for): where the suite's time goes, independent of how
    busy the machine is.

    SIGINT is caught here, whatever this process inherited. A suite started as a background job
    of a non-interactive shell (`make test &`, `(... &)` in a script) inherits SIGINT ignored
    (POSIX), an exec keeps an ignored signal ignored, and the Ctrl-C tests' processes then never
    saw the SIGINT they were sent: they ran to their end, exit 0 (seen here: 3 such failures in
    one full run, none in the same tree started otherwise). Those tests play a terminal's
    Ctrl-C, which reaches a foreground process whose SIGINT is at its default; a caught signal
    is reset to that default in every child this process execs."""
    import os
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    path = os.environ.get("FB_TEST_CPU_LOG")
    if path:
        config.pluginmanager.register(_CpuLog(path), "fb-cpu-log")


class _CpuLog:
    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def _cpu() -> float:
        import resource

        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        import time

        t0, c0 = time.monotonic(), self._cpu()
        yield
        with open(self.path, "a") as f:
            f.write(f"{time.monotonic() - t0:.2f}\t{self._cpu() - c0:.2f}\t{item.nodeid}\n")
