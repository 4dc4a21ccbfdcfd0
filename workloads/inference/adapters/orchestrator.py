"""Start a serving engine, wait until it answers, always stop all of it.

The engine runs in its own session (so its own process group: torchrun, its ranks,
SGLang's scheduler and detokenizer processes, vLLM's workers), with the fabric's
environment and the NCCL log in the run directory. Stopping sends SIGTERM to the whole
group, waits `stop_timeout_s`, then SIGKILLs whatever is left — on success, on a failed
sweep point, on Ctrl-C, and on SIGTERM (which the entry point turns into an exception).
Its stdout and stderr go to <run_dir>/server/<adapter>.log, kept for the transport verifier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from workloads.core.errors import UsageError
from workloads import REPO_ROOT
from workloads.inference.adapters.base import Launch, ServerSpec


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


class ManagedServer:
    """`with ManagedServer(spec, launch, run_dir, env) as srv:` srv.base_url answers /health."""

    def __init__(self, spec: ServerSpec, launch: Launch, run_dir: str | os.PathLike | None, env: dict[str, str]):
        self.spec, self.launch, self.env = spec, launch, env
        self.log_path = Path(run_dir) / "server" / f"{spec.adapter}.log" if run_dir else None
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def __enter__(self) -> ManagedServer:
        try:
            if self.launch.argv is not None:
                self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(self.env) | self.launch.env
        log = open(self.log_path, "ab")
        log.write(f"# {' '.join(self.launch.argv)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(self.launch.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, cwd=str(REPO_ROOT), start_new_session=True)
        except FileNotFoundError:
            raise UsageError(f"cannot start server={self.spec.adapter}: {self.launch.argv[0]!r} is not installed "
                             "on this machine (SGLang needs its GPU container, see Dockerfile; vLLM: that or `make engines`)") from None
        finally:
            log.close()

    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def wait_ready(self) -> None:
        url = self.base_url + self.spec.health_path
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while True:
            if probe(url) == 200:
                return
            if not self.alive():
                raise UsageError(f"server={self.spec.adapter} exited with code {self.proc.returncode} before it was "
                                 f"ready; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}")
            if time.monotonic() > deadline:
                where = f"; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}" if self.proc else \
                    " (server=external: is it running, and is server.url right?)"
                raise UsageError(f"server={self.spec.adapter} did not answer 200 at {url} within "
                                 f"server.ready_timeout_s={self.spec.ready_timeout_s:g} s{where}")
            time.sleep(0.25)

    def stop(self) -> None:
        """TERM the whole process group, then KILL it after stop_timeout_s. Idempotent."""
        p = self.proc
        if p is None:
            return
        try:
            pgid = os.getpgid(p.pid)
        except ProcessLookupError:
            pgid = p.pid  # the leader is gone (maybe reaped); its group may still hold children
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
