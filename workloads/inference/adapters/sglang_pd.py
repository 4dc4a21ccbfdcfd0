"""SGLang with disaggregated prefill and decode (P/D): `server=sglang-pd`.

Two SGLang instances, each started by the sglang adapter's rule (sglang.py: its interpreter, its
CPU recipe where there is no GPU), the prefill with `--disaggregation-mode prefill
--disaggregation-bootstrap-port <free>` and the decode with `--disaggregation-mode decode`, both
with `--disaggregation-transfer-backend <server.transfer_backend>` (and
`--disaggregation-ib-device` where given), and the proxy (workloads/inference/pd/proxy.py, in
SGLang's router protocol: each request to both instances at once with the prefill's bootstrap
host and port and one bootstrap room). What the orchestrator starts is workloads/inference/pd/
serve.py, as for server=vllm-pd: both instances in its process group, one warm-up request, then
the proxy. UCX prints its chosen transports in each instance's log (UCX_PROTO_INFO=y,
UCX_LOG_LEVEL=info) for the KV-path verdict, when the backend is NIXL over UCX.

One node for now (server.nnodes=1): two nodes and the emulator's namespaces are server=vllm-pd's.
GPUs only: on this CPU SGLang 0.5.23's P/D cannot start (check_available says why, in one line),
so the command lines are checked by SGLang's own parser and the proxy against HTTP stand-ins.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from workloads.core.errors import UsageError
from workloads.core.ports import quiet_ports
from workloads.inference.adapters import placement, sglang, vllm_pd
from workloads.inference.adapters.base import Launch, ServerSpec, engine_options, engine_source, model_path

LOADS_WEIGHTS = True  # server.model_path: checked before the engine starts (base.check_weights)

ROLES = vllm_pd.ROLES
CHOICES = "sglang/srt/arg_groups/choices.py"
DEFAULTS = {"transfer_backend": "nixl", "ib_device": None, "warmup_timeout_s": 120}


def options(spec: ServerSpec) -> dict:
    return engine_options(spec, DEFAULTS, "sglang-pd")


def known_backends(spec: ServerSpec) -> list[str] | None:
    """The transfer backends the engine's SGLang offers (its choices.py), or None where that
    SGLang is not readable here (then SGLang itself refuses)."""
    python = sglang.interpreter(spec)
    if not python:
        return None
    m = re.search(r"DISAGG_TRANSFER_BACKEND_CHOICES\s*=\s*\[([^\]]*)\]", engine_source(python, CHOICES) or "")
    return re.findall(r'"(\w+)"', m.group(1)) if m else None


def check_available(spec: ServerSpec, server: dict) -> None:
    o = options(spec)
    sglang.check_available(spec, server)
    if spec.nnodes != 1:
        raise UsageError(f"server=sglang-pd runs its prefill and decode instances on one node (server.nnodes=1, not "
                         f"{spec.nnodes}); across nodes use server=vllm-pd")
    names = known_backends(spec)
    if names is not None and o["transfer_backend"] not in names:
        raise UsageError(f"server.transfer_backend={o['transfer_backend']!r}: this SGLang has no such "
                         f"disaggregation transfer backend; it has {', '.join(names)}")
    if sglang.on_cpu(spec):
        raise UsageError("server=sglang-pd needs GPUs: SGLang's P/D registers its KV cache with the transfer backend "
                         "as GPU memory (NIXL over a UCX without CUDA refuses it: \"VRAM memory is detected as host "
                         "by UCX\", NIXL_ERR_BACKEND) and its decode instance pins host memory through CUDA; on a "
                         "CPU use server=vllm-pd (docs/engines.md)")
    placement.gpu_split(spec)


def instance_logs(spec: ServerSpec) -> dict[str, Path]:
    return {role: Path(spec.run_dir or ".") / "server" / f"sglang-pd-{role}.log" for role in ROLES}


def _cpu_env(spec: ServerSpec, i: int) -> dict[str, str]:
    """The CPU recipe's environment for instance i: this host's cores split between the two
    instances' ranks as among one TP group of twice the size."""
    return {"SGLANG_NCCL_SO_PATH": sglang.NO_NCCL,
            "SGLANG_CPU_OMP_THREADS_BIND": sglang._cpu_binding(2 * spec.tp, i * spec.tp, spec.tp)}


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    o = options(spec)
    sglang.check_model(spec, model)
    path = model_path(spec, model)
    python = sglang.interpreter(spec) or sys.executable
    cpu = sglang.on_cpu(spec)
    name = spec.served_model_name or path
    host = "127.0.0.1" if spec.host in ("0.0.0.0", "::", "localhost") else spec.host
    logs = instance_logs(spec)
    *http, boot = quiet_ports(len(ROLES) + 1, who="server=sglang-pd")  # one call: distinct ports
    devices = {} if cpu else placement.gpu_split(spec)
    plan: dict = {"name": "sglang-pd", "host": spec.host, "port": spec.port, "model_name": name,
                  "ready_timeout_s": spec.ready_timeout_s * 0.95, "warmup_timeout_s": float(o["warmup_timeout_s"]),
                  "warmup_path": str(logs["prefill"].parent / "sglang-pd-warmup.json"),
                  "timings_path": str(logs["prefill"].parent / "sglang-pd-legs.jsonl"),
                  "bootstrap": [host, boot]}
    for i, role in enumerate(ROLES):
        argv = sglang._node_argv(replace(spec, host=host, port=http[i], served_model_name=name, extra_args=()),
                                 python, path, cpu)
        argv += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", str(o["transfer_backend"])]
        if role == "prefill":
            argv += ["--disaggregation-bootstrap-port", str(boot)]
        if o["ib_device"]:
            argv += ["--disaggregation-ib-device", str(o["ib_device"])]
        argv += list(spec.extra_args)
        env = {"SPT_NOENV": "1", "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info"} | (_cpu_env(spec, i) if cpu else {}) \
            | dict(spec.env) | devices.get(role, {})
        plan[role] = {"host": host, "port": http[i], "argv": argv, "env": env, "log": str(logs[role])}
    serve = [sys.executable, "-m", "workloads.inference.pd.serve", json.dumps(plan)]
    return Launch(serve, {"SPT_NOENV": "1"}, name, engine_argv=plan["decode"]["argv"])


class PDObserver:
    """The KV-path verdict from the prefill instance's log: SGLang's NIXL backend WRITEs each
    request's KV cache from the prefill instance into the decode instance's (nixl/conn.py), so
    UCX's `remote memory write by ucp_put*` table there names what carried it. SGLang logs no
    per-transfer KV metrics for the record's `kv` block; the proxy's two legs are kept in
    sglang-pd-legs.jsonl (timed from one start: SGLang asks both instances at once)."""

    def __init__(self, spec: ServerSpec, model: dict):
        self.logs = instance_logs(spec)
        self.backend = options(spec)["transfer_backend"]

    def verify(self, fabric) -> dict:
        from workloads.fabric.verify_kv import kv_verdict

        out = kv_verdict(fabric, self.logs["prefill"].read_text(errors="replace") if self.logs["prefill"].exists()
                         else "", {r: str(p) for r, p in self.logs.items()}, "put")
        out["backend"] = self.backend  # UCX's table is NIXL's evidence; mooncake's transfers are not UCX's
        warm = vllm_pd._read_json(self.logs["prefill"].parent / "sglang-pd-warmup.json")
        out["warmup"] = warm
        return {"kv_path": out}

    def begin(self) -> tuple:
        return ()

    def end(self, mark: tuple, results, warmup) -> dict:
        return {}


def observer(spec: ServerSpec, model: dict) -> PDObserver:
    return PDObserver(spec, model)
