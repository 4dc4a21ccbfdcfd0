"""The emulated topologies a study keeps for its arms: built at an arm's first run of a block, lent
to each of its runs in that block (workloads/fabric/kept.py), removed when the arm's next block
begins or the study ends, however it ends.

What a kept topology shares between runs is the namespaces, veths, qdiscs and the delay line
process, none of which an arm changes between its trials; never a process, a process group, a
socket or a model. Before every run its nodes are reset (fabric/kept.py: fresh) and checked empty;
a topology that still holds a process of an earlier run is removed and built again. Arms never
share one: each arm's fabric is built for it, so a difference between arms cannot come from a
topology one of them inherited. FB_STUDY_KEEP_FABRIC=0 builds one per run instead (the
benchmark's baseline, benchmarks/kept_fabric.py).

Each run's emulator (on a local arm, its launcher) is also forked from the study (`fork_run`),
which imports torch and what every rank imports once, instead of starting as a fresh interpreter
that imports them again (core/forkrank.py: the child purges and re-imports our own modules, runs
launch/<script>.py as `python launch/<script>.py` would, in a session of its own, dying with the
study). The study
touches no torch state between forks, so every run of either arm starts from the same parent.
FB_RANK_START=exec, or FB_STUDY_KEEP_FABRIC=0, starts fresh interpreters instead.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from workloads import CONF_DIR, REPO_ROOT
from workloads.core import celllock, forkrank, procstat
from workloads.fabric.kept import KEPT_ENV, fresh, handle
from workloads.fabric.netns import NETNS_ETC, PREFIX, leftovers

KEEP_ENV = "FB_STUDY_KEEP_FABRIC"
KEPT_NAME = re.compile(rf"^{PREFIX}(\d+)k\d+-")  # fb-<study pid>k<n>-<node>: KeptFabrics._build names them so


def keeping(environ=os.environ) -> bool:
    """FB_STUDY_KEEP_FABRIC: 1 (the default) keeps each arm's topology and forks each run's
    emulator or launcher; 0 builds one per run, each run in a fresh interpreter. Anything else is refused, not read as on."""
    v = environ.get(KEEP_ENV, "1").strip() or "1"
    if v not in ("0", "1"):
        from workloads.core.errors import UsageError

        raise UsageError(f"{KEEP_ENV}={v!r}: use 1 (keep each emulated arm's topology for the study, the "
                         "default) or 0 (build one per run)")
    return v == "1"


# names each topology a study process builds (fb-<study pid>k<n>-<node>): one count for the whole
# process, as a sequential study makes a KeptFabrics per look and a per-instance count gave two
# arms' topologies of different looks one name, which the records could not tell apart
_BUILT = itertools.count(1)


class KeptFabrics:
    """Per (arm, emulated spec, block): one Topology. A context manager that removes them all.

    Per block, not per study: a topology is one instance (its delay line process, its veths), and
    an instance has its own small offsets. Kept for a whole study, each arm ran every block on its
    one instance, the blocks could not see that offset, and the pairs charged it to the arm: an A/A
    study at the same 0.5 ms called "near is faster than near-again by 1.2% [0.7, 1.8]" (CI, 3
    blocks, p = 0.011). Built anew each block, an instance's offset varies from block to block as any
    other noise does, and the verdict's interval carries it."""

    def __init__(self, jobs, environ=os.environ, run_id=lambda job: "", say: Callable[[str], None] | None = None):
        self.on = keeping(environ)
        self.say = say  # where the line about an earlier study's leftovers goes
        self.built: dict[tuple, Any] = {}
        self.run_id = run_id  # a job's run id: what its records say the topology was built for
        self._lent: dict[tuple, dict[str, Any]] = {}  # per topology: the record's fabric.kept
        self._specs: dict[tuple[str, str], Any] = {}
        # a served workload's runs need the host's link into node 0; one topology serves the arm's
        # other workloads too (they do not use that link)
        self._served = {j.arm.label for j in jobs if j.arm.emulated and j.workload.kind.served}
        self._jobs = list(jobs)

    def __enter__(self) -> KeptFabrics:
        if self.say is not None and any(j.arm.emulated for j in self._jobs):
            if (line := remove_orphans()) is not None:
                self.say(line)
        return self

    def __exit__(self, *exc) -> None:
        while self.built:
            _, topo = self.built.popitem()
            topo.teardown()

    def env(self, job) -> dict[str, str]:
        """KEPT_ENV for the job's run, or nothing: the run builds its own topology (the arm is not
        emulated, keeping is off, or the topology could not be built here; the run then says why)."""
        if not (self.on and job.arm.emulated):
            return {}
        try:
            spec = self._spec(job)
        except Exception:  # noqa: BLE001 - the run composes the same config and says what is wrong in one line
            return {}
        key = (job.arm.label, spec, job.cell.block)
        for old in [k for k in self.built if k[:2] == key[:2] and k[2] != key[2]]:
            self.built.pop(old).teardown()  # the arm's topology of its last block
        topo = self.built.get(key)
        if topo is not None and not fresh(topo):
            self.built.pop(key).teardown()
            topo = None
        if topo is None:
            topo = self._build(spec, job.arm.label in self._served)
            if topo is None:
                return {}
            self.built[key] = topo
            self._lent[key] = {"topology": f"{PREFIX}{topo.tag}", "built_at_run": self.run_id(job), "runs_on_it": 0}
        self._lent[key]["runs_on_it"] += 1
        return {KEPT_ENV: handle(topo, dict(self._lent[key]))}

    def _spec(self, job):
        key = (job.arm.label, job.workload.name)
        if key not in self._specs:
            from workloads.core.config import compose
            from workloads.fabric.emuplan import _spec_of

            cfg = compose(CONF_DIR, [*job.workload.argv, *job.arm.overrides, f"fabric={job.arm.fabric}"])
            self._specs[key] = _spec_of(cfg, {})[0]
        return self._specs[key]

    def _build(self, spec, host_link: bool):
        from workloads.fabric.netns import Topology

        topo = Topology(spec, tag=f"{os.getpid()}k{next(_BUILT)}", host_link=host_link)
        try:
            topo.__enter__()
        except Exception:  # noqa: BLE001 - TopologyError, OSError, UsageError: said by the run that builds its own
            return None  # __enter__ removed what it built
        return topo


def remove_orphans() -> str | None:
    """Remove the namespaces of topologies kept by a study that no longer lives (killed with -9,
    it could not remove them; its delay lines ended with it) and say so in one line; None when
    there were none. The pid in the name is the study's in this host's pid namespace; a group of
    which a namespace still holds a process is left alone (its runs are still ending)."""
    orphans: dict[int, list[str]] = {}
    for name in leftovers():
        m = KEPT_NAME.match(name)
        if m and not procstat.living(m.group(1)):
            orphans.setdefault(int(m.group(1)), []).append(name)
    tried = []
    for names in orphans.values():
        if any(subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split() for n in names):
            continue
        for n in names:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
            shutil.rmtree(NETNS_ETC / n, ignore_errors=True)
        tried += names
    left = set(leftovers()) if tried else set()  # said only of what is gone (without root nothing is)
    names = [n for n in tried if n not in left]
    if not names:
        return None
    pids = sorted({int(KEPT_NAME.match(n).group(1)) for n in names})
    return (f"study: removed {len(names)} namespace(s) kept by a study that ended without removing them (pid "
            f"{', '.join(map(str, pids))} gone, killed with -9?): {', '.join(names)}")


def fork_run(argv: Sequence[str], env: dict[str, str], out: IO) -> subprocess.Popen | None:
    """The run `argv` (`<python> launch/<script>.py ...`: an emulated run's emulator, or a local
    run's launcher) forked from this warm study process, its output to `out`; None when it is not
    such a run (an srun step) or forking is off (then it is exec'd)."""
    if not keeping(env) or len(argv) < 2 or argv[0] != sys.executable \
            or Path(argv[1]).resolve().parent != REPO_ROOT / "launch" or forkrank.mode() != "fork" \
            or not forkrank.can_fork():
        return None
    forkrank.warm(forkrank.RANK_IMPORTS)

    def prepare() -> None:  # what Popen(cwd=REPO_ROOT, preexec_fn=die_with_parent) did
        os.chdir(REPO_ROOT)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        celllock.die_with_parent()

    return forkrank.script(argv[1], argv[2:], env, f"fb-{Path(argv[1]).stem}", out, out, prepare=prepare)
