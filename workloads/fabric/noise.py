"""Background traffic on an emulated fabric: noisy neighbours on the shared link.

The fabric profile's `emulate:` block may name the load that runs beside the workload:

    emulate: {nodes: 2, rate: 100mbit, ..., noise: {kind: iperf3, streams: 4, direction: forward, rate: null}}

launch/emulate.py builds the namespaces, then (`running`, below) starts one iperf3 server per
flow pair in the receiving node and its client in the sending node, waits until the noise
flows, runs the workload's agents, and stops the noise afterwards. Directions are named
after the workload's own traffic from node 0 to node 1: `forward` sends node 0 -> node 1
(the same egress queue as node 0's share of the collective), `reverse` node 1 -> node 0,
`both` one pair each way. `rate` is iperf3's `-b`, per stream (null: as fast as TCP goes).

Bytes are counted by the kernel, not estimated: iperf3 reads its data with read(2), so the
server's `rchar` (/proc/<pid>/io) grows by what it received. Each record written under
noise carries `fabric.noise`: the description and the bytes the noise moved while that
point was measured (session.Recorded reads the counters as it enters and leaves, through
workloads/fabric/noisemeter.py). iperf3's
own JSON (client and server side) is kept in `<run dir>/noise/`; stopped with SIGINT,
iperf3 3.12 writes its summary with an "error" naming the interrupt, whose figures are the
test's up to that moment.

`kind: cpu` is the other neighbour: `threads` single-threaded GEMM loops (workloads/fabric/hog.py)
started in node `node`'s namespace, as a training job's compute beside the measured one. On one
machine every emulated node shares the host's cores, so the hog slows every node's ranks, not
only its own: the record says so in its description. Its evidence is the kernel's CPU time for
the hog processes (utime + stime of /proc/<pid>/stat) and each hog's own count of GEMMs, kept
as hog-<n>.json.

A noise that moved no bytes (or used no CPU) while the workload ran fails the run (exit 1, one
line): a "noisy" arm that was quiet would be compared as if it were loaded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from workloads import REPO_ROOT
from workloads.core.errors import Fault, UsageError
from workloads.core.signals import stop_group
from workloads.fabric import procnet
from workloads.fabric.iperf3 import ToolFailed, load_iperf3, parse_iperf3
from workloads.fabric.noisemeter import NOISE_ENV, busy_figures, cpu_seconds, rate_figures, received_bytes

KINDS = ("iperf3", "cpu")
DIRECTIONS = ("forward", "reverse", "both", "incast")
PORT = 5299              # not iperf3's default 5201: the link workload may run under this noise
FLOWING_S = 15.0         # the noise must be seen moving bytes within this long
FLOWING_BYTES = 256 * 1024  # ~20 ms of a 100 Mbit/s link: more than the handshake, less than a second of any link
BUSY_CPU_S = 0.2         # a hog is running once it has spent this much CPU past its start-up
MAX_THREADS = 64
STOP_S = 10.0            # how long iperf3 may take to write its summary after SIGINT
# Set for the workload's ranks: the noise's state file (the pids to count, its description).
# What iperf3 3.12 puts in "error" when the test was stopped by a signal (src/iperf_api.c):
# the figures beside it are those of the seconds it ran.
_STOPPED = ("interrupt - the client has terminated", "the client has terminated", "interrupt - the server has terminated")


class NoiseFailed(Fault):
    """The noise did not run as asked (no bytes moved, iperf3 exited): the run is not what its
    record would claim. Exit 1, as a measurement that failed."""


@dataclass(frozen=True)
class NoiseSpec:
    kind: str = "iperf3"
    streams: int = 1                 # iperf3 -P: parallel TCP streams per pair
    direction: str = "forward"       # forward: node 0 -> node 1; reverse; both; incast: every other node -> node 0
    rate: str | None = None          # iperf3 -b per stream, e.g. 50M; None: unlimited
    port: int = PORT
    threads: int = 1                 # kind cpu: GEMM loops (one core each)
    node: int = 0                    # kind cpu: the namespace they run in

    # The keys each kind reads; a key of the other kind is a mistake worth one line, not silence.
    FIELDS = {"iperf3": ("kind", "streams", "direction", "rate", "port"), "cpu": ("kind", "threads", "node")}

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> NoiseSpec | None:
        """The `emulate.noise` block -> a checked spec; None when there is no noise."""
        if block is None or block in ("none", "null", ""):
            return None
        if not isinstance(block, Mapping):
            raise UsageError(f"fabric.emulate.noise={block!r}; give a block, e.g. {{kind: iperf3, streams: 4, "
                             "direction: forward}} (or null for none)")
        b = {k: v for k, v in dict(block).items() if v is not None}
        unknown = set(b) - set(cls.__dataclass_fields__)
        if unknown:
            raise UsageError(f"fabric.emulate.noise has unknown keys {sorted(unknown)}; known: "
                             f"{sorted(cls.__dataclass_fields__)}")
        kind = str(b.get("kind", "iperf3"))
        if kind not in KINDS:
            raise UsageError(f"fabric.emulate.noise.kind={kind!r}; use {' or '.join(KINDS)}")
        foreign = sorted(set(b) - set(cls.FIELDS[kind]))
        if foreign:
            raise UsageError(f"fabric.emulate.noise: kind {kind} does not take {foreign}; it takes "
                             f"{list(cls.FIELDS[kind][1:])}")
        if kind == "cpu":
            try:
                threads, node = int(b.get("threads", 1)), int(b.get("node", 0))
            except (TypeError, ValueError):
                raise UsageError("fabric.emulate.noise.threads and .node must be integers") from None
            if not 1 <= threads <= MAX_THREADS or node < 0:
                raise UsageError(f"fabric.emulate.noise: threads={threads}, node={node}; use threads 1 to "
                                 f"{MAX_THREADS} and a node >= 0")
            return cls(kind, threads=threads, node=node)
        direction = str(b.get("direction", "forward"))
        if direction not in DIRECTIONS:
            raise UsageError(f"fabric.emulate.noise.direction={direction!r}; use one of {', '.join(DIRECTIONS)}")
        try:
            streams, port = int(b.get("streams", 1)), int(b.get("port", PORT))
        except (TypeError, ValueError):
            raise UsageError("fabric.emulate.noise.streams and .port must be integers") from None
        if not 1 <= streams <= 128:  # iperf3's own limit is 128 (MAX_STREAMS)
            raise UsageError(f"fabric.emulate.noise.streams={streams}; use 1 to 128")
        if not 1024 <= port <= 65535 - 64:  # an incast's pairs take port, port + 1, ... (up to 63 senders)
            raise UsageError(f"fabric.emulate.noise.port={port}; use 1024..{65535 - 64}")
        rate = b.get("rate")
        if rate is not None and not str(rate).rstrip("KMGkmg").replace(".", "", 1).isdigit():
            raise UsageError(f"fabric.emulate.noise.rate={rate!r}; use iperf3's -b form, e.g. 50M (bit/s per stream), "
                             "or null for unlimited")
        return cls(kind, streams, direction, None if rate is None else str(rate), port)

    def fields(self) -> dict[str, Any]:
        """The spec as records carry it: only the keys of its kind."""
        return {k: getattr(self, k) for k in self.FIELDS[self.kind]}

    def require(self, nodes: int) -> None:
        if self.kind == "cpu":
            if self.node >= nodes:
                raise UsageError(f"fabric.emulate.noise.node={self.node}, but the emulated fabric has {nodes} "
                                 f"node(s) (0 to {nodes - 1})")
            return
        if shutil.which("iperf3") is None:
            raise UsageError("fabric.emulate.noise needs iperf3, which is not installed (or not on PATH); "
                             "apt-get install iperf3, or drop the noise: block")

    def pairs(self, nodes: int = 2) -> list[tuple[int, int]]:
        """(sending node, receiving node) per iperf3 client/server pair. incast: N-1 senders into
        node 0, whose host link (and, on a leaf-spine, its leaf's uplinks) they share."""
        if self.direction == "incast":
            return [(i, 0) for i in range(1, nodes)]
        return {"forward": [(0, 1)], "reverse": [(1, 0)], "both": [(0, 1), (1, 0)]}[self.direction]

    def port_of(self, pair: int) -> int:
        """Pair n's server port: one per pair, since an incast's servers all listen on node 0."""
        return self.port + pair

    def describe(self) -> str:
        if self.kind == "cpu":
            return (f"CPU hog: {self.threads} GEMM loop(s) in node {self.node} (on one host: every node's cores)")
        rate = f" at {self.rate}bit/s each" if self.rate else ""
        ways = {"forward": "node 0 -> node 1", "reverse": "node 1 -> node 0", "both": "both ways",
                "incast": "incast: every other node -> node 0"}[self.direction]
        return f"iperf3 TCP, {self.streams} stream(s){rate}, {ways}"


def client_argv(spec: NoiseSpec, server: str, seconds: int, pair: int = 0) -> list[str]:
    # -t: long enough to outlast the run, short enough that a client whose launcher was
    # SIGKILLed ends by itself; --json: the summary written on SIGINT (see the docstring)
    argv = ["iperf3", "-c", server, "-p", str(spec.port_of(pair)), "-t", str(seconds), "-P", str(spec.streams),
            "--json", "--connect-timeout", "5000"]
    return argv + (["-b", spec.rate] if spec.rate else [])


def server_argv(spec: NoiseSpec, bind: str, pair: int = 0) -> list[str]:
    # -1: one test, then exit (it ends when its client does); --idle-timeout as the link
    # workload's server: one that no client reaches exits by itself
    return ["iperf3", "-s", "-1", "-B", bind, "-p", str(spec.port_of(pair)), "--json", "--idle-timeout", "60"]


def _listening(pid: int, port: int) -> bool:
    """Process `pid` listens on `port` in its own network namespace (/proc/<pid>/net is that namespace's)."""
    proc = f"/proc/{pid}"
    mine = procnet.socket_inodes(proc)
    return any(state == procnet.TCP_LISTEN and local[1] == port and inode in mine
               for local, _, state, inode in procnet.tcp_sockets(proc))


def _wait(ready: Callable[[], bool], procs: Sequence[subprocess.Popen], failure: Callable[[], str]) -> None:
    """Poll until `ready()`; NoiseFailed(failure()) once one of `procs` has ended or FLOWING_S passed."""
    deadline = time.monotonic() + FLOWING_S
    while not ready():
        if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
            raise NoiseFailed(failure())
        time.sleep(0.05)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(p: subprocess.Popen) -> None:
    """SIGINT first (iperf3 then writes its JSON), SIGKILL if it does not end."""
    stop_group(p, signal.SIGINT, STOP_S)


def figures(path: Path) -> dict[str, Any]:
    """One kept iperf3 JSON -> its figures (the reader the link workload uses), an interrupt's
    "error" accepted: that is how the noise is stopped."""
    doc = load_iperf3(path.read_text())
    if doc.get("error") in _STOPPED:
        doc = {k: v for k, v in doc.items() if k != "error"}
    try:
        return parse_iperf3(doc)
    except ToolFailed as e:
        raise NoiseFailed(f"noise: {path.name}: {e}") from None


@contextmanager
def running(spec: NoiseSpec | None, nodes: Sequence[str], addrs: Sequence[str], out_dir: Path,
            run_s: float) -> Iterator[dict[str, str]]:
    """Start the noise in the namespaces, wait until it runs, yield the environment the
    workload's ranks need (NOISE_ENV), then stop it, keep its own output in `out_dir` and check
    it ran while the workload did. Every noise process is stopped on the way out, whatever happened."""
    if spec is None:
        yield {}
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    with (_hogs if spec.kind == "cpu" else _iperf3)(spec, nodes, addrs, out_dir, run_s) as env:
        yield env


def _write_state(out_dir: Path, spec: NoiseSpec, pids: Sequence[int]) -> dict[str, str]:
    state = out_dir / "state.json"
    state.write_text(json.dumps({"spec": spec.fields(), "description": spec.describe(), "pids": list(pids),
                                 "counter": "cpu" if spec.kind == "cpu" else "rchar"}))
    return {NOISE_ENV: str(state)}


def _stop_iperf3(clients: Sequence[subprocess.Popen], servers: Sequence[subprocess.Popen], files: Sequence[Any]) -> None:
    """Clients stopped, servers let end (-1: each ends after its client; SIGINT if it does not),
    their output files closed, an empty stderr file removed."""
    for p in clients:
        _stop(p)
    for p in servers:
        try:
            p.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            _stop(p)
    for f in files:
        f.close()
        if f.name.endswith(".stderr") and Path(f.name).stat().st_size == 0:
            Path(f.name).unlink()  # kept only when iperf3 said something there


@contextmanager
def _iperf3(spec: NoiseSpec, nodes: Sequence[str], addrs: Sequence[str], out_dir: Path,
            run_s: float) -> Iterator[dict[str, str]]:
    servers: list[subprocess.Popen] = []
    clients: list[subprocess.Popen] = []
    files: list[Any] = []

    def start(ns: str, argv: list[str], path: Path) -> subprocess.Popen:
        f, err = path.open("w"), path.with_suffix(".stderr").open("w")  # stderr apart: the JSON stays JSON
        files.extend((f, err))
        # `ip netns exec` execs iperf3 in place: the pid is iperf3's (its /proc/<pid>/io is read).
        # SIGINT back to its default: an emulator started in the background (`&`, nohup) inherits
        # it ignored, and so would iperf3, which then neither stops on it nor writes its JSON.
        return subprocess.Popen(["ip", "netns", "exec", ns, *argv], stdout=f, stderr=err,
                                start_new_session=True, preexec_fn=_default_sigint)

    try:
        for n, (src, dst) in enumerate(spec.pairs(len(nodes))):
            s = start(nodes[dst], server_argv(spec, addrs[dst], n), out_dir / f"iperf3-{n}-server.json")
            servers.append(s)
            _wait(lambda: _listening(s.pid, spec.port_of(n)), [s],
                  lambda: f"noise: the iperf3 server in {nodes[dst]} did not listen on {addrs[dst]}:"
                          f"{spec.port_of(n)} (see {out_dir / f'iperf3-{n}-server.json'})")
            clients.append(start(nodes[src], client_argv(spec, addrs[dst], int(run_s) + 60, n),
                                 out_dir / f"iperf3-{n}.json"))
        pids = [s.pid for s in servers]
        before = [received_bytes([pid]) for pid in pids]
        moved = [0]

        def flowing() -> bool:  # every server (each direction) has its client and has received data
            moved[:] = [(received_bytes([pid]) or 0) - (b or 0) for pid, b in zip(pids, before)]
            return None not in before and min(moved) >= FLOWING_BYTES

        _wait(flowing, servers + clients,
              lambda: f"noise: iperf3 moved {min(moved)} bytes in its first {FLOWING_S:g} s (an iperf3 exited or "
                      f"the link carries nothing); its output is in {out_dir}")
        env = _write_state(out_dir, spec, pids)
        start_bytes, t0 = received_bytes(pids), time.monotonic()
        print(f"emulate: noise flowing: {spec.describe()}", flush=True)
        yield env
        moved, seconds = (received_bytes(pids) or 0) - (start_bytes or 0), time.monotonic() - t0
        if any(p.poll() is not None for p in servers + clients):
            raise NoiseFailed(f"noise: an iperf3 ended while the workload ran; its output is in {out_dir}")
    finally:
        _stop_iperf3(clients, servers, files)
    if moved <= 0:
        raise NoiseFailed(f"noise: iperf3 moved no bytes during the workload's {seconds:.1f} s; the run was not noisy")
    summary = {"spec": spec.fields(), "description": spec.describe(), "during_workload": rate_figures(moved, seconds),
               "iperf3": [figures(out_dir / f"iperf3-{n}-server.json") for n in range(len(servers))]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"emulate: noise moved {moved} B in {seconds:.1f} s during the workload "
          f"({summary['during_workload']['throughput(Mbit/s)']:.1f} Mbit/s); iperf3's JSON is in {out_dir}",
          flush=True)


@contextmanager
def _hogs(spec: NoiseSpec, nodes: Sequence[str], addrs: Sequence[str], out_dir: Path,
          run_s: float) -> Iterator[dict[str, str]]:
    """`threads` GEMM loops in node `node`: started, seen busy, stopped with SIGINT (each then
    writes hog-<n>.json), and their CPU time during the workload checked to be more than none."""
    hogs: list[subprocess.Popen] = []
    # one BLAS thread per loop: `threads` is then the cores the hog asks for
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    try:
        for n in range(spec.threads):
            argv = [sys.executable, "-m", "workloads.fabric.hog", "--out", str(out_dir / f"hog-{n}.json"),
                    "--seconds", str(int(run_s) + 60)]
            hogs.append(subprocess.Popen(["ip", "netns", "exec", nodes[spec.node], *argv], env=env,
                                         cwd=REPO_ROOT, start_new_session=True,
                                         preexec_fn=_default_sigint))
        pids = [p.pid for p in hogs]
        def busy() -> bool:  # each loop past its import, spending CPU
            used = [cpu_seconds([pid]) for pid in pids]
            return None not in used and min(used) >= BUSY_CPU_S

        _wait(busy, hogs, lambda: f"noise: a CPU hog did not start in {FLOWING_S:g} s (it exited or got no CPU)")
        env_out = _write_state(out_dir, spec, pids)
        start_cpu, t0 = cpu_seconds(pids), time.monotonic()
        print(f"emulate: noise running: {spec.describe()}", flush=True)
        yield env_out
        used_cpu, seconds = (cpu_seconds(pids) or 0.0) - (start_cpu or 0.0), time.monotonic() - t0
        if any(p.poll() is not None for p in hogs):
            raise NoiseFailed(f"noise: a CPU hog ended while the workload ran; see {out_dir}")
    finally:
        for p in hogs:
            _stop(p)
    if used_cpu <= 0:
        raise NoiseFailed(f"noise: the CPU hog used no CPU during the workload's {seconds:.1f} s; the run was not noisy")
    summary = {"spec": spec.fields(), "description": spec.describe(), "during_workload": busy_figures(used_cpu, seconds),
               "hogs": [json.loads((out_dir / f"hog-{n}.json").read_text()) for n in range(len(hogs))]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"emulate: noise used {used_cpu:.1f} CPU-s in {seconds:.1f} s during the workload "
          f"({summary['during_workload']['cores_busy']:.2f} cores); its output is in {out_dir}", flush=True)


def from_overrides(conf_dir: str, overrides: Sequence[str]) -> tuple[NoiseSpec | None, Path, str]:
    """The noise the run's config asks for, and where its files go: (spec, <run dir>/noise,
    run id). The first point of a sweep decides (one emulate run builds one topology and
    one noise); its run id is the config's, else FABRICBENCH_RUN_ID's, else a new one that
    the caller must hand to the ranks."""
    from omegaconf import OmegaConf

    from workloads.core.config import compose, expand_sweep
    from workloads.core.rundir import derive_run_id

    plain = [o for o in overrides if o not in ("-m", "--multirun")]
    point = expand_sweep(plain)[0] if len(plain) < len(overrides) else plain
    cfg = compose(conf_dir, point)
    block = (OmegaConf.to_container(cfg.fabric, resolve=True).get("emulate") or {}).get("noise")
    spec = NoiseSpec.from_config(block)
    given = cfg.get("run_id") or os.environ.get("FABRICBENCH_RUN_ID")
    run_id = derive_run_id(given, os.environ) if given else f"emu-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return spec, Path(str(cfg.output_root)) / str(run_id) / "noise", str(run_id)
