"""Serving engines behind one interface. An engine is one adapter module plus one
conf/server/<name>.yaml whose `adapter:` names it: a module of this package by its short
name (`vllm`), or any importable module by its dotted path (`mypkg.myengine`).

A module provides `command(spec, model, fabric, overrides) -> Launch` and, where the
default does not fit:
- `STARTS_PROCESS = False`: nothing is started here (an external server), so this host's
  fabric, TP degree and model limits are not checked;
- `check_available(spec, server)`: raise UsageError when the engine cannot start from here
  (`server`: its conf/server section as a dict, for engine-only keys);
- `forwarded_overrides(overrides)`: command-line overrides the engine must see too;
- `observer(spec, model)`: an object that reads what the engine says about itself beyond the
  load generator's view (server=vllm-pd: its KV transfers): `.verify(fabric) -> dict | None`,
  a verdict recorded beside the transport's (a `mismatch` stops the sweep as the transport's
  does), `.begin() -> mark` before a point and `.end(mark, results, warmup) -> dict` of record fields;
- `spans_emulated_nodes(server, nodes)`: the engine can run across launch/emulate.py's nodes;
  raise UsageError when not with this many (absent: it does not run across emulated nodes);
- `LOADS_WEIGHTS = True`: the engine loads server.model_path (or the model's `path`), a local
  folder or a Hugging Face id, checked before it starts (base.check_weights).
The orchestrator (orchestrator.py) starts, watches and stops every engine alike.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from workloads.core.errors import UsageError
from workloads.inference.adapters.base import Launch, ServerSpec

# The machinery beside the adapters: what they build on, and what starts and watches them.
_NOT_ADAPTERS = {"base", "orchestrator", "watchdog", "forkstart", "placement"}


def _nothing(*_args) -> None:
    return None


def _no_overrides(_overrides: list[str]) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class Adapter:
    name: str
    command: Callable[..., Launch]
    starts_process: bool = True
    check_available: Callable[[ServerSpec, dict], None] = _nothing
    forwarded_overrides: Callable[[list[str]], tuple[str, ...]] = _no_overrides
    observer: Callable[..., Any] | None = None
    spans_emulated_nodes: Callable[[dict, int], None] | None = None
    loads_weights: bool = False


def builtin() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_ADAPTERS)


def get_adapter(name: str) -> Adapter:
    module = name if "." in name else f"{__name__}.{name}"
    if name in _NOT_ADAPTERS:
        module = ""
    try:
        mod = importlib.import_module(module) if module else None
    except ModuleNotFoundError as e:
        if not module.startswith(str(e.name)):
            raise  # the adapter exists but one of its own imports is missing
        mod = None
    if mod is None or not callable(getattr(mod, "command", None)):
        raise UsageError(f"server adapter {name!r} is not a module with a command() function; use one of "
                         f"{', '.join(builtin())}, or a dotted module path (see workloads/inference/adapters/__init__.py)")
    return Adapter(name, mod.command, bool(getattr(mod, "STARTS_PROCESS", True)),
                   getattr(mod, "check_available", _nothing), getattr(mod, "forwarded_overrides", _no_overrides),
                   getattr(mod, "observer", None), getattr(mod, "spans_emulated_nodes", None),
                   bool(getattr(mod, "LOADS_WEIGHTS", False)))


def check_emulated(server: Mapping[str, Any], nodes: int) -> None:
    """The served engine of `server` (a conf/server section) can run across `nodes` emulated nodes."""
    name = str(server.get("adapter") or server.get("name"))
    spans = get_adapter(name).spans_emulated_nodes
    if spans is None:
        able = [a.replace("_", "-") for a in builtin() if get_adapter(a).spans_emulated_nodes is not None]
        raise UsageError(f"server={name} does not run across emulated nodes here; use "
                         f"{' or '.join(f'server={a}' for a in able)}")
    spans(dict(server), nodes)
