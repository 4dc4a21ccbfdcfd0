"""What a serving adapter is: the command that starts an engine, and where it answers.

An adapter is data plus one function (`command`); the orchestrator (orchestrator.py)
does everything else — environment, process group, readiness, logs, stopping — the same
way for every engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from workloads.core.errors import UsageError


@dataclass(frozen=True)
class ServerSpec:
    adapter: str
    host: str = "127.0.0.1"
    port: int = 30000
    tp: int = 1
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None   # host:port of node 0, for multi-node
    model_path: str | None = None       # null = the model config's `path`
    served_model_name: str | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str | None = None              # external: an already running server
    health_path: str = "/health"
    ready_timeout_s: float = 1800.0
    stop_timeout_s: float = 30.0
    # The program that starts the engine, where it is not fabricbench's own Python: in the
    # serving images SGLang/vLLM live in the image's interpreter, fabricbench in a venv.
    python: str | None = None           # sglang: interpreter that has SGLang (null = this one)
    executable: str | None = None       # vllm: the `vllm` CLI (null = "vllm" on PATH)
    device: str | None = None           # sglang: --device; null/auto = cpu when this host has no GPU
    # The sweep's run directory (set by the inference workload, not a config key): an engine
    # that writes files of its own (the reference engine's run folder) keeps them there.
    run_dir: str | None = None
    # The engine's own keys of its conf/server/<name>.yaml, the ones above aside (server=vllm-pd:
    # kv_connector, prefill_tp, ...): data for its adapter, which validates them.
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ServerSpec:
        known = cls.__dataclass_fields__
        kw = {k: v for k, v in cfg.items() if k in known and v is not None}
        launch = dict(cfg.get("launch") or {})  # the reference engine's own yaml keeps these here
        if "ready_timeout_s" not in kw and launch.get("ready_timeout_s"):
            kw["ready_timeout_s"] = float(launch["ready_timeout_s"])
        if launch.get("ready_path"):
            kw["health_path"] = str(launch["ready_path"])
        kw["adapter"] = str(cfg.get("adapter") or cfg.get("name"))
        kw["extra_args"] = tuple(str(a) for a in (cfg.get("extra_args") or ()))
        kw["env"] = {str(k): str(v) for k, v in dict(cfg.get("env") or {}).items()}
        kw["options"] = {str(k): v for k, v in cfg.items() if k not in known and k not in ("name", "launch")}
        for k in ("tp", "nnodes", "node_rank", "port"):
            if k in kw and kw[k] is not None:
                kw[k] = int(kw[k])
        spec = cls(**kw)
        if spec.tp <= 0:
            raise UsageError(f"server.tp={spec.tp} must be a positive tensor-parallel degree")
        if spec.nnodes <= 0 or not 0 <= spec.node_rank < spec.nnodes:
            raise UsageError(f"server.node_rank={spec.node_rank} must be in [0, server.nnodes={spec.nnodes})")
        if spec.nnodes > 1 and not spec.dist_init_addr:
            raise UsageError("server.nnodes > 1 needs server.dist_init_addr=<node-0 host>:<port> for the engine's rendezvous")
        return spec

    @property
    def base_url(self) -> str:
        if self.url:
            return self.url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def model_path(spec: ServerSpec, model: Mapping[str, Any]) -> str:
    path = spec.model_path or model.get("path")
    if not path:
        raise UsageError(f"server={spec.adapter} needs a model to load: set server.model_path=<HF id or local dir> "
                         f"or a `path:` in conf/model/{model.get('name')}.yaml")
    return str(path)


def _looks_local(path: str) -> bool:
    """A folder, not a Hugging Face id (`org/name`, or a bare `name`)."""
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or Path(path).exists()


def _hub_cached(repo: str, env: Mapping[str, str]) -> bool:
    """Whether the Hugging Face cache the engine reads (its environment's) holds a snapshot of `repo`."""
    home = env.get("HF_HUB_CACHE") or os.path.join(
        env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    snapshots = Path(home) / ("models--" + repo.replace("/", "--")) / "snapshots"
    return snapshots.is_dir() and any(snapshots.iterdir())


def _hub_reachable(env: Mapping[str, str], timeout_s: float = 3.0) -> bool:
    """Whether the Hugging Face endpoint answers a TCP connection (the engines would otherwise
    retry for a minute or more, then print their own traceback)."""
    import socket
    from urllib.parse import urlparse

    if env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(env.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=timeout_s).close()
    except OSError:
        return False
    return True


def check_weights(spec: ServerSpec, model: Mapping[str, Any]) -> None:
    """The weights an engine is to load, before it starts: a local folder that exists, or a
    Hugging Face id that this host has cached or can download."""
    path = model_path(spec, model)
    key = "server.model_path" if spec.model_path else f"conf/model/{model.get('name')}.yaml's path"
    if _looks_local(path):
        if not Path(path).expanduser().is_dir():
            raise UsageError(f"{key}={path}: no such folder; point it at a local model folder (config.json and "
                             "weights) or a Hugging Face id")
        return
    env = dict(os.environ) | dict(spec.env)  # where the engine will look: its own environment
    if not _hub_cached(path, env) and not _hub_reachable(env):
        raise UsageError(f"{key}={path} is a Hugging Face id that this host has not cached, and the hub is not "
                         "reachable from here: weights must be local. Download them where there is network "
                         f"(huggingface-cli download {path} --local-dir <folder>) and set server.model_path=<folder>")


@dataclass(frozen=True)
class Launch:
    """A server process to start: argv, extra environment, and the name requests must use."""

    argv: list[str] | None          # None: nothing to start (external)
    env: dict[str, str]
    model_name: str
    # The server listens in network namespaces of its own (launch/emulate.py): this host's
    # port table does not show it, and its port there is free by construction.
    own_network: bool = False
    # The engine's own command where argv starts a wrapper around it (vllm-pd's serve.py): the
    # record's engine versions come from this one's interpreter.
    engine_argv: list[str] | None = None


def tp_spans_nodes(server: Mapping[str, Any], nodes: int) -> None:
    """An engine whose TP ranks span the emulated nodes (the reference engine's agents, vLLM's and
    SGLang's multi-node modes): the degree splits evenly over them."""
    tp = server.get("tp")
    if tp is None or int(tp) % nodes or int(tp) < nodes:
        shown = "null" if tp is None else tp
        raise UsageError(f"server.tp={shown} cannot span {nodes} emulated nodes evenly; use "
                         f"server.tp={nodes} (or a multiple of {nodes})")


def engine_options(spec: ServerSpec, defaults: dict, server: str) -> dict:
    """The engine-only keys of conf/server/<server>.yaml (spec.options) over their defaults; a key
    the engine does not have is refused in one line that lists the ones it has."""
    unknown = sorted(set(spec.options) - set(defaults))
    if unknown:
        raise UsageError(f"server={server} has no key {unknown[0]!r}; its keys: {', '.join(sorted(defaults))} "
                         f"(conf/server/{server}.yaml)")
    return defaults | {k: v for k, v in spec.options.items() if v is not None}


def engine_source(python: str, relpath: str) -> str | None:
    """The text of a file of the package installed beside the engine's interpreter (its venv's
    site-packages), read without starting that interpreter; None where it is not there."""
    from pathlib import Path

    for f in sorted(Path(python).parent.parent.glob(f"lib/python3*/site-packages/{relpath}")):
        return f.read_text()
    return None
