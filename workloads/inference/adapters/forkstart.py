"""The reference engine on a study's kept topology, started without a fresh interpreter.

A served TP=2 run of a study is a chain of processes: the study (torch and what every rank
imports loaded once) forks the run's emulator, the emulator forks the load generator
(workloads/commands/emulate.py), the load generator starts its engine through the watchdog
(watchdog.py), the watchdog starts `python -m workloads.commands.emulate --serve`, and that
process forks one torchrun agent into each node's namespaces (netns.enter), each of which forks
its rank. Exec'd, the watchdog and the `--serve` process are fresh interpreters, and the
`--serve` process imports torch and the ranks' imports again before it forks the agents: the one
torch import of a served run that the study had not paid already.

Where the study keeps the topology (fabric/kept.py: KEPT_ENV names it to the run) and the
emulator forked the load generator warm, both start as forks instead. Not of the load generator
as it is when it starts its server: by then it has run its own entry point (Hydra's global
state, its logging, its validation), and a rank forked from that inherited Hydra's initialised
singleton and could not compose its own config. The load generator forks, first thing, before
its script runs, an idle copy of itself (`prefork`: the emulator's state, our own modules
purged), which waits on a pipe; the orchestrator hands it the watchdog's command, environment,
log and working directory (`watchdog`), and it becomes the watchdog as Popen would have started
it (a session of its own, the server log as its stdout and stderr, /dev/null as stdin), still the
load generator's child. The watchdog then forks the `--serve` process into its own process
group, as its Popen child was (`engine`), so the orchestrator's group-wide SIGTERM still reaches
it and the watchdog still relays and redacts its output through a pipe, mirrors its exit code
and reaps what it leaves. Readiness (the HTTP health check), the watchdog, a node agent's death
(one line from the `--serve` process, the orchestrator's own line for the point) and the
teardown are the exec'd path's code, unchanged. An unused copy ends when the load generator
does (its pipe's end closes).

Why this keeps runs independent: what a fork inherits that an exec would not is imported code
(torch's modules, loaded by the study before its first run and untouched since) and memory
that the child never reads. Our own modules are purged and imported afresh in every child
(core/forkrank.py); every agent is still a process of its own in its node's namespaces with
its own process group, its ranks their own process groups, sockets and model, built after the
fork; no process in the chain has touched CUDA (forkrank.can_fork, else exec); and every run's
chain starts from a new fork of the same study, so no run starts from another run's state.
FB_RANK_START=exec, FB_STUDY_KEEP_FABRIC=0 (no KEPT_ENV) or a run outside a study keep the exec'd
watchdog and `--serve` interpreter.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
from typing import Mapping, Sequence

from workloads.core import forkrank
from workloads.fabric.kept import KEPT_ENV

SERVE = ("-m", "workloads.commands.emulate", "--serve")  # the reference engine's node agents (reference.py)
WATCHDOG = ("-m", "workloads.inference.adapters.watchdog")
ZYGOTE_ENV = "FB_ENGINE_ZYGOTE"  # "<pid>:<fd>": the load generator's idle copy (prefork) and its pipe


def _warm() -> bool:
    return "torch" in sys.modules and forkrank.mode() == "fork" and forkrank.can_fork()


def wanted(engine_argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the load generator's idle copy becomes its engine's watchdog (and the watchdog forks
    the engine): the reference engine's `--serve` across the nodes of a topology the study keeps."""
    return (len(engine_argv) > 3 and engine_argv[0] == sys.executable and tuple(engine_argv[1:4]) == SERVE
            and bool(environ.get(KEPT_ENV)) and bool(environ.get(ZYGOTE_ENV)) and _warm())


def prefork(environ=os.environ) -> None:
    """In the load generator, before its script runs (emulate.py's fork of it): an idle copy of
    this process that `watchdog` can turn into the engine's watchdog; ZYGOTE_ENV names it."""
    if environ.get(ZYGOTE_ENV) or not environ.get(KEPT_ENV) or not _warm():
        return
    r, w = os.pipe()  # neither end survives an exec of anything the load generator starts

    def body() -> int:
        os.close(w)
        chunks = []
        while chunk := os.read(r, 65536):
            chunks.append(chunk)
        os.close(r)
        if not chunks:  # the load generator ended without starting the reference engine
            return 0
        req = json.loads(b"".join(chunks))
        os.chdir(req["cwd"])
        log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [WATCHDOG[1], *req["argv"][3:]]
        sys.path[0] = req["cwd"]
        return forkrank.run_main(lambda: runpy.run_module(WATCHDOG[1], run_name="__main__", alter_sys=True))

    child = forkrank.fork([sys.executable, *WATCHDOG], body, dict(environ), "fb-watchdog")
    os.close(r)
    environ[ZYGOTE_ENV] = f"{child.pid}:{w}"


def watchdog(argv: Sequence[str], env: dict[str, str], log: str, cwd: str) -> subprocess.Popen | None:
    """`python -m workloads.inference.adapters.watchdog ...` as the load generator's idle copy
    (prefork), which becomes it; None when there is none (then it is exec'd)."""
    held = os.environ.pop(ZYGOTE_ENV, "")
    if not held or tuple(argv[1:3]) != WATCHDOG:
        return None
    pid, fd = (int(x) for x in held.split(":"))
    with os.fdopen(fd, "wb") as w:
        w.write(json.dumps({"argv": list(argv), "env": without(env), "log": str(log), "cwd": cwd}).encode())
    return forkrank.watch(pid, argv)


def without(env: Mapping[str, str]) -> dict[str, str]:
    """`env` less the idle copy's name, which only the load generator may use."""
    return {k: v for k, v in env.items() if k != ZYGOTE_ENV}


def engine(argv: Sequence[str]) -> subprocess.Popen | None:
    """In the watchdog: the engine `argv` forked into our process group, its stdout and stderr
    one pipe (the Popen's `.stdout`, as Popen(stdout=PIPE, stderr=STDOUT) gives); None when the
    watchdog was exec'd (nothing warm to fork from) or `argv` is not the `--serve` command."""
    if len(argv) < 4 or tuple(argv[1:4]) != SERVE or not _warm():
        return None
    r, w = os.pipe()

    def prepare() -> None:
        os.close(r)  # the watchdog's end: an engine holding it would block on a full pipe, not fail, without a reader
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the watchdog's SIG_IGN is inherited across an exec

    with os.fdopen(w, "wb") as out:
        child = forkrank.module(argv, dict(os.environ), "fb-serve", stdout=out, stderr=out, session=False,
                                prepare=prepare)
    if child is None:
        os.close(r)
        return None
    child.stdout = os.fdopen(r, "rb")
    return child
