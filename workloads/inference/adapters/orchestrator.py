"""Start a serving engine, wait until it answers, always stop all of it.

The engine runs in its own session (so its own process group: torchrun, its ranks,
SGLang's scheduler and detokenizer processes, vLLM's workers), with the fabric's
environment and the NCCL log in the run directory. Stopping sends SIGTERM to the whole
group, waits `stop_timeout_s`, then SIGKILLs whatever is left — on success, on a failed
sweep point, on Ctrl-C, and on SIGTERM (which the entry point turns into an exception).
Its stdout and stderr go to <run_dir>/server/<adapter>.log, kept for the transport verifier.

The server measured must be the one started: a port that something else already listens on
is refused before starting (naming the process when /proc tells), and after readiness the
listening socket must belong to our child or one of its descendants; the reference engine
also echoes a per-run token in /v1/models. A watchdog (watchdog.py) between us and the
engine takes the group down if this process dies without stopping it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import deque
from pathlib import Path

from workloads import REPO_ROOT
from workloads.core import procstat, signals
from workloads.core.errors import Fault, UsageError
from workloads.core.redact import redact_argv
from workloads.fabric.procnet import listeners, process_cmdline
from workloads.inference.adapters import forkstart
from workloads.inference.adapters.base import Launch, ServerSpec
from workloads.inference.adapters.watchdog import family, signal_all
from workloads.inference.protocol import IDENTITY_ENV


def log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not Path(path).exists():
        return "(no server log)"
    with open(path, errors="replace") as f:
        tail = deque(f, maxlen=lines)
    return "".join(tail).rstrip() or "(server log is empty)"


def probe(url: str, timeout_s: float = 2.0) -> int | None:
    """HTTP status of GET url, or None if nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


class HeadWatch:
    """Node 0's server as a worker node watches it: `gone()` probes once and says whether the
    server, once seen up, has now missed `misses` probes in a row (its sweep is over). Before it
    was ever seen up it is never gone: node 0 may still be starting."""

    def __init__(self, url: str, misses: int = 5):
        self.url, self.misses, self.seen, self.missed = url, misses, False, 0

    def gone(self) -> bool:
        if probe(self.url) == 200:
            self.seen, self.missed = True, 0
        elif self.seen:
            self.missed += 1
        return self.seen and self.missed >= self.misses


class ManagedServer:
    """`with ManagedServer(spec, launch, run_dir, env) as srv:` srv.base_url answers /health."""

    def __init__(self, spec: ServerSpec, launch: Launch, run_dir: str | os.PathLike | None, env: dict[str, str]):
        self.spec, self.launch, self.env = spec, launch, env
        self.log_path = Path(run_dir) / "server" / f"{spec.adapter}.log" if run_dir else None
        self.proc: subprocess.Popen | None = None
        self.token = uuid.uuid4().hex

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def __enter__(self) -> ManagedServer:
        self._held = contextlib.ExitStack()
        # No SIGTERM grace timer while the server is ours: its stop (stop_timeout_s) may take
        # longer, and the timer's os._exit would orphan it. Stopped first, then the timer is back.
        self._held.enter_context(signals.grace(None))
        self._held.callback(self.stop)
        try:
            if self.launch.argv is not None:
                self.start()
            self.wait_ready()
            if self.proc is not None:
                self.check_identity()
        except BaseException:
            self._held.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._held.close()

    def start(self) -> None:
        if not self.launch.own_network:
            refuse_taken_port(self.spec)
        exe = self.launch.argv[0]
        if shutil.which(exe) is None:
            raise UsageError(f"cannot start server={self.spec.adapter}: {exe!r} is not installed "
                             "on this machine (SGLang and vLLM need their GPU container; see Dockerfile)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = forkstart.without(dict(self.env) | self.launch.env | {IDENTITY_ENV: self.token})
        argv = [sys.executable, "-m", "workloads.inference.adapters.watchdog", str(os.getpid()),
                str(self.spec.stop_timeout_s), "--", *self.launch.argv]
        with open(self.log_path, "ab") as log:
            log.write(f"# {redact_argv(self.launch.argv)}\n".encode())  # the log is shared; its secrets are not
            log.flush()
            # the reference engine on a study's kept topology: no fresh interpreter (forkstart.py)
            forked = forkstart.watchdog(argv, env, str(self.log_path), str(REPO_ROOT)) \
                if forkstart.wanted(self.launch.argv) else None
            self.proc = forked or subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, env=env, cwd=str(REPO_ROOT),
                                                   start_new_session=True)

    def check_identity(self) -> None:
        """The answer must come from our child: its session listens on the port, and the
        reference engine knows this run's token. Anything else is refused, not measured."""
        owners = listeners(self.spec.port)
        ours = set(owners) & family(self.proc.pid)
        if owners and not ours:
            raise UsageError(f"server.port={self.spec.port} is answered by another process ({describe(owners)}), "
                             f"not by the server={self.spec.adapter} started here; stop it or choose another server.port")
        if self.spec.adapter == "reference":
            token = _models_token(self.base_url)
            if token != self.token:
                raise UsageError(f"the server answering at {self.base_url} is not the reference engine started by "
                                 "this run (its /v1/models lacks this run's token); stop whatever listens on "
                                 f"server.port={self.spec.port} or choose another port")

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def pids(self) -> list[int]:
        """Every living process of the server: its group and everything below it (engines'
        workers, torchrun's ranks in sessions of their own)."""
        return sorted(family(self.proc.pid)) if self.proc else []

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def died(self, within_s: float = 0.0) -> bool:
        """Whether the server we started has exited (waiting up to within_s: failed requests
        may be the first sign of a death the watchdog has not yet reported)."""
        if self.proc is None:
            return False
        try:
            self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def wait_ready(self) -> None:
        url = self.base_url + self.spec.health_path
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            if probe(url) == 200:
                return
            if not self.alive():
                raise Fault(f"server={self.spec.adapter} exited with code {self.proc.returncode} before it was "
                            f"ready; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                where = f"; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}" if self.proc else \
                    " (server=external: is it running, and is server.url right?)"
                # a server started here that never answered is a fault; server=external's URL is the input
                kind = Fault if self.proc else UsageError
                raise kind(f"server={self.spec.adapter} did not answer 200 at {url} within "
                           f"server.ready_timeout_s={self.spec.ready_timeout_s:g} s{where}")
            time.sleep(0.25)

    def stop(self) -> None:
        """TERM the whole process group, then KILL it (and any descendant outside it) after
        stop_timeout_s. Idempotent."""
        p = self.proc
        if p is None:
            return
        try:
            pgid = os.getpgid(p.pid)
        except ProcessLookupError:
            pgid = p.pid  # the leader is gone (maybe reaped); its group may still hold children
        # torchrun's ranks live in sessions of their own: signal them by name, not only by group
        others = family(p.pid) - {p.pid}
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.spec.stop_timeout_s
        while time.monotonic() < deadline and (p.poll() is None or _group_alive(pgid)):
            time.sleep(0.05)
        if p.poll() is None or _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
            end = time.monotonic() + 5
            while _group_alive(pgid) and time.monotonic() < end:
                time.sleep(0.05)
        signal_all([x for x in others if procstat.living(x)], signal.SIGKILL)
        self.proc = None if p.poll() is not None else p


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies still count for killpg; only living members matter.
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def describe(pids: list[int]) -> str:
    out = []
    for pid in pids[:3]:
        argv = process_cmdline(pid)
        cmd = "?" if argv is None else " ".join(argv).strip()
        out.append(f"pid {pid}: {cmd[:120]}")
    return "; ".join(out) or "a process this user cannot see"


def refuse_taken_port(spec: ServerSpec) -> None:
    """Binding (as servers do, SO_REUSEADDR) fails while anything listens on the port."""
    fam = socket.AF_INET6 if ":" in spec.host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((spec.host, spec.port))
            return
        except OSError as e:
            why = e.strerror
    pids = listeners(spec.port)
    who = f"it is taken by {describe(pids)}" if pids else why
    raise UsageError(f"server.port={spec.port} on {spec.host} cannot be used for server={spec.adapter} ({who}); "
                     "stop that process or choose another server.port")


def _models_token(base_url: str) -> str | None:
    try:
        with urllib.request.urlopen(base_url + "/v1/models", timeout=10) as r:
            return (json.loads(r.read()) or {}).get("fabricbench_token")
    except (OSError, ValueError, AttributeError):
        return None
