"""Serving engines behind one interface: each adapter module's `command(spec, model,
fabric, overrides) -> Launch`; the orchestrator starts, watches and stops them alike."""

from __future__ import annotations

from types import ModuleType

from workloads.core.errors import UsageError
from workloads.inference.adapters import external, reference, sglang, vllm

ADAPTERS: dict[str, ModuleType] = {"sglang": sglang, "vllm": vllm, "reference": reference, "external": external}


def get_adapter(name: str) -> ModuleType:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise UsageError(f"server adapter {name!r}; use one of {', '.join(ADAPTERS)}") from None
