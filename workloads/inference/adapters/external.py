"""An already running OpenAI-compatible server at `server.url`: nothing to start or stop."""

from __future__ import annotations

from workloads.core.errors import UsageError
from workloads.inference.adapters.base import Launch, ServerSpec

STARTS_PROCESS = False  # someone else's server: nothing to start, stop, or check on this host


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    if not spec.url:
        raise UsageError("server=external needs server.url=http://<host>:<port> of a running server")
    return Launch(None, {}, spec.served_model_name or str(model.get("path") or model.get("name")))
