"""Sets NIXL's progress-thread poll timeout in a vLLM instance: server.nixl_pthr_delay_us.

NIXL's UCX backend runs one progress thread per agent that poll()s its UCX workers with a
timeout of the agent's `pthrDelay`; NIXL's Python API (nixl_agent.__init__) fixes it at 0, so
that thread spins a whole core for as long as the instance lives, idle or not. On a host whose
cores the engines share (vLLM-CPU, the emulator's nodes on one machine), that core is taken
from the prefill and decode compute being measured. With a timeout the thread sleeps in poll()
until UCX signals an event on a worker's event fd, so a transfer still wakes it at once.

The vllm_pd adapter puts this directory first on the instance's PYTHONPATH with
FB_NIXL_PTHR_DELAY_US set; Python imports this module at start-up (site.py). It wraps the
config class of NIXL's bindings (nixl_cu12/nixl_cu13/nixl_rocm `._bindings`) when they are
imported, so the one assignment nixl_agent makes is replaced by ours, says so on stderr (the
instance's log, which the record's kv_path reads back), and then runs the sitecustomize it
shadows, if any.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

MARK = "fabricbench nixl_shim: NIXL progress thread poll timeout (pthrDelay)"


def _delay_us() -> int | None:
    raw = os.environ.get("FB_NIXL_PTHR_DELAY_US", "")
    return int(raw) if raw.strip().isdigit() else None


def _patch(bindings, delay_us: int) -> None:
    base = bindings.nixlAgentConfig

    class AgentConfig(base):
        def __setattr__(self, name, value):
            if name == "pthrDelay":
                print(f"{MARK} {delay_us} us, not {value} us (server.nixl_pthr_delay_us)", file=sys.stderr, flush=True)
                value = delay_us
            super().__setattr__(name, value)

    AgentConfig.__name__ = AgentConfig.__qualname__ = base.__name__
    bindings.nixlAgentConfig = AgentConfig


class _BindingsFinder(importlib.abc.MetaPathFinder):
    def __init__(self, delay_us: int):
        self.delay_us = delay_us

    def find_spec(self, name, path, target=None):
        if not (name.startswith("nixl_") and name.endswith("._bindings")):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run, delay = spec.loader.exec_module, self.delay_us

        def exec_module(module):
            run(module)
            _patch(module, delay)

        spec.loader.exec_module = exec_module
        return spec


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if __name__ == "sitecustomize":  # at an instance's start-up; not when fabricbench reads MARK
    _delay = _delay_us()
    if _delay is not None:
        sys.meta_path.insert(0, _BindingsFinder(_delay))
    _run_shadowed()
