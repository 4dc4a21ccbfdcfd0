"""Local ranks forked from their launcher, not started as fresh interpreters.

torchrun's agent starts each local rank as `python -u script args`: a new interpreter that
imports torch and the workload again, 2-4 s of CPU per rank on a CPU node and more from a
shared filesystem, in every run of a study. The agent process (our self-launch, an emulated
node's agent) has torch imported already, so a rank can start as a fork of it instead, with the
workload's heavy imports done once before the fork (`warm`). What a trial must repeat stays
per rank: the child builds its own process group, its own communicator, its own model and
data, and our own modules are imported afresh in it, so no state of ours crosses the fork.

Only the process start changes: torchrun's agent still spawns, watches, signals and reaps the
ranks (its SubprocessHandler, with a forked child in place of Popen's exec); a rank still ends
through its own exit path, with its exit code. Not done when the launcher has touched CUDA (a
forked child cannot use a CUDA context its parent made) or when FB_RANK_START=exec asks for
torchrun's own fresh interpreters.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from workloads.core import signals

FORKED_AT_ENV = "FB_FORKED_AT"
MODE_ENV = "FB_RANK_START"  # fork (default) | exec: torchrun's own `python -u script`
# Our own packages: imported afresh in each rank, so no module state of the launcher's is inherited.
OWN = ("workloads", "analysis", "launch", "__main__")
# The dispositions a fresh interpreter starts with (Python's own: Ctrl-C raises KeyboardInterrupt,
# SIGPIPE and SIGXFSZ ignored so that writes fail with an error), not the agent's handlers.
_FRESH = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN,
          **{s: signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                                         signal.SIGCHLD, signal.SIGALRM)}}

# What torch's elastic agent turns into SignalException (torch.distributed.elastic.multiprocessing.api).
_HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

# What every rank imports on its way to its first step (warm): DDP's constructor imports
# torch._dynamo (sympy, triton's probe), the process group torch.distributed's tensor and FSDP
# modules; 1.3-2 s of CPU per rank here, once in the launcher instead.
RANK_IMPORTS = ("torch", "torch.distributed.run", "torch._dynamo", "torch.nn.parallel", "torch.distributed.fsdp",
                "torch.distributed.tensor", "torch.distributed.algorithms.join")


def mode() -> str:
    m = os.environ.get(MODE_ENV, "fork").strip().lower() or "fork"
    if m not in ("fork", "exec"):
        from workloads.core.errors import UsageError

        raise UsageError(f"{MODE_ENV}={m!r}: choose fork (ranks forked from the launcher) or exec "
                         "(a fresh interpreter per rank, as torchrun starts them)")
    return m


def warm(modules: Sequence[str]) -> None:
    """Import what every rank imports anyway, once, in the launcher (before any fork)."""
    import importlib

    for name in modules:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class _Forked(subprocess.Popen):
    """A Popen for a child that already exists: poll, wait and signals work from its pid as
    Popen's own do (subprocess's POSIX implementation reads nothing else)."""

    def __init__(self, pid: int, args: Sequence[str]):  # no super().__init__: there is nothing to exec
        self.args, self.pid, self.returncode = list(args), pid, None
        self.stdin = self.stdout = self.stderr = None
        self.text_mode, self.encoding, self.errors = False, None, None
        self._waitpid_lock = threading.Lock()
        self._child_created = True
        self._sigint_wait_secs = 0.25
        self._communication_started = False
        self._input = None
        self._closed_child_pipe_fds = True


def watch(pid: int, args: Sequence[str]) -> subprocess.Popen:
    """A Popen for `pid`, a child of this process forked to become `args`."""
    return _Forked(pid, args)


def _script(args: Sequence[str]) -> tuple[str, list[str]] | None:
    """(script, argv) when torchrun's command is `<this python> -u script args...`, else None."""
    if len(args) < 3 or args[1] != "-u" or args[2].startswith("-"):
        return None
    if os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    return args[2], [str(a) for a in args[3:]]


def can_fork() -> bool:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return not (cuda is not None and cuda.is_initialized())


def start(args: Sequence[str], env: dict[str, str], stdout, stderr) -> subprocess.Popen | None:
    """Fork the rank `args` would exec (None: this command is not one to fork; exec it)."""
    parsed = _script(args)
    if parsed is None:
        return None
    return script(*parsed, env, f"fb-rank{env.get('RANK', '')}", stdout, stderr)


def script(path: str, argv: Sequence[str], env: dict[str, str], name: str, stdout=None, stderr=None,
           prepare: Callable[[], None] | None = None) -> subprocess.Popen:
    """Fork `python path argv...` as a fresh interpreter would run it; `prepare` runs first in
    the child, once its environment is its own (e.g. its working directory)."""
    def body() -> int:
        if prepare is not None:
            prepare()
        sys.argv = [path, *argv]
        sys.path[0] = os.path.dirname(os.path.abspath(path))
        return _run(lambda: runpy.run_path(path, run_name="__main__"))

    return fork([sys.executable, path, *argv], body, env, name, stdout, stderr)


def module(args: Sequence[str], env: dict[str, str], name: str, enter: Callable[[], None] | None = None,
           stdout=None, stderr=None, prepare: Callable[[], None] | None = None, session: bool = True
           ) -> subprocess.Popen | None:
    """Fork `python -m <module> args...` (None: `args` is not such a command of this interpreter),
    in a session of its own (`session=False`: in the caller's process group, as a plain Popen)
    with the caller's stdout and stderr unless given; `enter` runs first in the child (e.g. moving
    it into a network namespace, as `ip netns exec` would), `prepare` once its environment is its
    own (its working directory, its stdin)."""
    if len(args) < 3 or args[1] != "-m" or os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    mod, argv = args[2], [str(a) for a in args[3:]]

    def body() -> int:
        if prepare is not None:
            prepare()
        sys.argv = [mod, *argv]  # runpy puts the module's file in argv[0], as `python -m` does
        sys.path[0] = os.getcwd()
        return _run(lambda: runpy.run_module(mod, run_name="__main__", alter_sys=True))

    return fork(args, body, env, name, stdout, stderr, enter=enter, session=session)


def fork(args: Sequence[str], body: Callable[[], int], env: dict[str, str], name: str, stdout=None, stderr=None,
         enter: Callable[[], None] | None = None, session: bool = True) -> subprocess.Popen:
    """A child that runs `body` as a fresh process would (_child), watched through a Popen."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    # A stop signal taken during the fork ran the agent's handler (torch's SignalException) inside
    # logging's after-fork hook, where Python only prints it ("Exception ignored in: _releaseLock"
    # and a traceback, an emulated --timeout in CI) and the agent carried on as if not signalled;
    # the child, where only the launcher was signalled, sets its own handlers (_child).
    held = signals.hold(_HELD) if threading.current_thread() is threading.main_thread() else ({}, [])
    before = len(held[1])
    pid = os.fork()
    if pid:
        proc = _Forked(pid, args)
        signals.release(*held)  # the agent now takes its signal, with this child known to it
        return proc
    code = 1
    try:
        if enter is not None:
            enter()
        code = _child(body, env, name, stdout, stderr, session, held[1][before:])
    except BaseException:  # noqa: BLE001 - the child must never return into the launcher's code
        with contextlib.suppress(Exception):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _child(body: Callable[[], int], env: dict[str, str], name: str, stdout, stderr, session: bool = True,
           noted: Sequence[int] = ()) -> int:
    if session:
        os.setsid()  # as Popen(start_new_session=True): torchrun's agent signals the rank's group
    for sig, how in _FRESH.items():  # the agent's handlers (SignalException) are not the rank's
        signal.signal(sig, how)
    if noted:  # sent to this child before its own handlers were set (still live in `noted`)
        signal.raise_signal(noted[0])
    os.environ.clear()
    os.environ.update(env)
    os.environ[FORKED_AT_ENV] = f"{time.time():.3f}"  # the rank's start (core/timeline.py): /proc says the launcher's
    _threads(env)
    _name(name)
    for fd, f in ((1, stdout), (2, stderr)):
        if f is not None:
            os.dup2(f.fileno(), fd)
    for stream in (sys.stdout, sys.stderr):  # python -u
        with contextlib.suppress(Exception):
            stream.reconfigure(line_buffering=True, write_through=True)
    atexit._clear()  # the launcher's exit functions are not the rank's
    for mod in [n for n in sys.modules if n.split(".")[0] in OWN]:
        del sys.modules[mod]
    return body()


def _threads(env: dict[str, str]) -> None:
    """The child's intra-op threads from its own OMP_NUM_THREADS, as a fresh interpreter would take
    them: OpenMP read the launcher's environment once, when torch loaded there, and a fork keeps
    that. An emulator without OMP_NUM_THREADS gave each forked rank both cores' threads, and a
    2-node training step took 10-30x as long as with the ranks torchrun would have started
    (torchrun sets OMP_NUM_THREADS=1 for each rank it starts)."""
    torch = sys.modules.get("torch")
    n = env.get("OMP_NUM_THREADS", "").strip()
    if torch is not None and n.isdigit() and int(n) > 0:
        torch.set_num_threads(int(n))


def _name(name: str) -> None:
    """The rank's name in ps/top (/proc/<pid>/comm): a fork shares its launcher's command line, and
    /proc/<pid>/environ keeps the environment the launcher was exec'd with, not the rank's RANK."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def _own_name() -> bool:
    """Whether this process carries a name _name gave it (fb-...)."""
    try:
        return Path("/proc/self/comm").read_text().startswith("fb-")
    except OSError:
        return False


def run_main(main: Callable[[], object]) -> int:
    """`main` as a forked child's program (_run)."""
    return _run(main)


def _run(main: Callable[[], object]) -> int:
    """The child's program as the interpreter runs one, ending as it would (the exit functions,
    non-daemon threads joined) but without its teardown."""
    try:
        main()
        code = 0
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - as the interpreter prints an uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    return code


@contextlib.contextmanager
def forking(warm_modules: Sequence[str] = ()) -> Iterator[None]:
    """Inside this block, torchrun's agent (torch.distributed.run in this process) forks its
    local ranks from this process (see the module docstring); outside it, nothing changes."""
    if mode() != "fork" or not can_fork():
        yield
        return
    from torch.distributed.elastic.multiprocessing import api
    from torch.distributed.elastic.multiprocessing.subprocess_handler import handlers
    from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

    class _Handler(SubprocessHandler):
        def _popen(self, args, env):
            return start(args, env, self._stdout, self._stderr) or super()._popen(args, env)

    def get(entrypoint, args, env, stdout, stderr, local_rank_id, numa_options=None):
        return _Handler(entrypoint=entrypoint, args=args, env=env, stdout=stdout, stderr=stderr,
                        local_rank_id=local_rank_id, numa_options=numa_options)

    import torch.multiprocessing as tmp

    warm(warm_modules)
    before, named = api.get_subprocess_handler, tmp._set_thread_name
    api.get_subprocess_handler = get
    # torch.distributed.run names its calling thread "pt_elastic", which for a forked agent is its
    # process name: node 1's agent, forked as fb-agent1, was fb-agent1 in ps for a moment and then
    # pt_elastic like every other agent (a test that looked for it by name saw it only at times)
    if _own_name():
        tmp._set_thread_name = lambda name: None
    try:
        yield
    finally:
        api.get_subprocess_handler, tmp._set_thread_name = before, named
        del handlers  # imported only to fail early where torch moved it
