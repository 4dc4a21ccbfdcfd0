"""Run many short command lines as real processes without paying Python's and torch's start-up
for each: one server process imports what the entry points import, then forks a child per
command. The child is a real process: its own exit code, stdout and stderr (files), address-
space limit, working directory and environment, and it runs the entry point exactly as
`python <script> args` or `python -m <module> args` would (runpy, __name__ == "__main__").

What this does not re-check per command is interpreter start-up itself; the CLI tests that
spawn `python` as a user does (tests/e2e/test_torchrun_bad_input.py and the workloads' own
end-to-end tests) still do.

    results = run_many([Command(argv=["launch/train.py", "train.steps=0"], env={...})])

As a script (the server): reads a JSON list of commands on stdin, writes a JSON list of
{code, out, err} on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]

# What the entry points import before their first validation: importing it once in the server
# is the whole saving (torch alone is ~4 s of CPU per process on this machine).
PRELOAD = ("torch", "hydra", "omegaconf", "workloads.core.config", "workloads.commands.entry", "workloads.commands.cli", "workloads.session",
           "workloads.training.run", "workloads.collectives.run", "workloads.inference.run", "workloads.commands.emulate",
           "workloads.commands.doctor", "workloads.commands.compare", "workloads.commands.report", "analysis.report",
           "analysis.compare", "transformers", "tokenizers")


@dataclass
class Command:
    argv: list[str]                      # after `python`: ["launch/train.py", ...] or ["-m", "pkg.mod", ...]
    env: dict[str, str] = field(default_factory=dict)   # the whole environment of the child
    cwd: str = str(REPO)
    as_limit: int | None = None          # RLIMIT_AS in bytes, as `ulimit -v`
    timeout_s: int = 180


def run_many(commands: list[Command], python: str = sys.executable, timeout_s: float = 1800) -> list[dict]:
    """Each command's {code, out, err}, in order. The server itself runs with the first
    command's environment (so it imports what a child of that environment would)."""
    if not commands:
        return []
    r = subprocess.run([python, str(HERE)], input=json.dumps([asdict(c) for c in commands]), capture_output=True,
                       text=True, timeout=timeout_s, cwd=str(REPO), env=commands[0].env or None)
    if r.returncode != 0:
        raise RuntimeError(f"the fork server failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def _child(cmd: dict, out: Path, err: Path) -> None:
    """In the forked child: become `python <argv>` and never return."""
    import resource
    import runpy
    import signal
    import traceback

    code = 1
    try:
        fd_out, fd_err = os.open(out, os.O_WRONLY | os.O_CREAT), os.open(err, os.O_WRONLY | os.O_CREAT)
        os.dup2(fd_out, 1)
        os.dup2(fd_err, 2)
        os.environ.clear()
        os.environ.update(cmd["env"])
        os.chdir(cmd["cwd"])
        if cmd["as_limit"]:
            resource.setrlimit(resource.RLIMIT_AS, (cmd["as_limit"], cmd["as_limit"]))
        signal.alarm(cmd["timeout_s"])  # SIGALRM's default action ends a hung command
        argv = cmd["argv"]
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()  # as `python -m` sets it
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = str(Path(argv[0]).resolve().parent)  # as `python script.py` sets it
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()  # as the interpreter would print it
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve() -> None:
    import importlib
    import shutil
    import tempfile
    import time

    commands = json.loads(sys.stdin.read())
    sys.path[0] = str(REPO)  # not tests/helpers: the children see the path a user's python would
    t0 = time.monotonic()
    for mod in PRELOAD:
        importlib.import_module(mod)
    from workloads.core import forkrank

    forkrank.warm(forkrank.RANK_IMPORTS)  # what a self-launch warms before it forks its ranks: once here, not per command
    print(f"preloaded in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    results = []
    # mkdtemp, not TemporaryDirectory: the latter's finalizer is an atexit hook every child
    # inherits, and a command whose own children exit through Python's exit path (ranks forked
    # by a self-launch, core/forkrank.py) would remove the folder under the server
    tmp = tempfile.mkdtemp(prefix="fb-forkrun-")
    try:
        for i, cmd in enumerate(commands):
            out, err = Path(tmp, f"{i}.out"), Path(tmp, f"{i}.err")
            sys.stdout.flush()
            sys.stderr.flush()
            t0 = time.monotonic()
            pid = os.fork()
            if pid == 0:
                _child(cmd, out, err)
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
            results.append({"pid": pid, "code": code, "wall_s": round(time.monotonic() - t0, 3), "out": out.read_text(errors="replace"),
                            "err": err.read_text(errors="replace")})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    _serve()
