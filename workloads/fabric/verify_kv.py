"""The KV-path verdict: which UCX transports carried a disaggregated server's KV cache, against
the fabric profile's expectations, beside the NCCL/Gloo transport verdict (verify.py).

`expect:` keys (conf/fabric/*.yaml):
  kv_transports         [tl, ...]   every transport of the KV read must be one of these
                                    (UCX names: cma, tcp, rc_verbs, rc_mlx5, dc_mlx5, cuda_ipc, ...)
  forbid_kv_transports  [tl, ...]   none of these may carry it (tcp on an RDMA fabric)
  kv_devices            [dev, ...]  every device of those transports must be one of these (emu0 on
                                    emu-*: tcp over lo or eth0 would not cross the emulated link)

Evidence: the moving instance's UCX log (ucx_log.py): the transports of its `remote memory
read by ucp_get*` protocol rows (pull mode: the decode instance reads), or `remote memory write
by ucp_put*` (push mode: the prefill instance writes). No such row is `unverified`
(UCX_PROTO_INFO was off, or no KV moved); a transport outside kv_transports or inside
forbid_kv_transports is a `mismatch`.
"""

from __future__ import annotations

from typing import Any, Mapping

from workloads.fabric import ucx_log
from workloads.fabric.verify import Problem, mismatch, unverified, verdict

KEYS = ("kv_transports", "forbid_kv_transports", "kv_devices")


def kv_problems(expect: Mapping[str, Any], log: ucx_log.UcxLog, op: str = "get") -> list[Problem]:
    used = log.transports(op)
    if not used:
        return [unverified(f"the KV-moving instance's UCX log has no `{ucx_log.KV_OPS[op]}*` protocol table between "
                           "processes (UCX_PROTO_INFO=y not in effect, or no KV transfer happened)")]
    out = []
    allowed = expect.get("kv_transports")
    if allowed:
        bad = [t for t in used if t not in allowed]
        if bad:
            out.append(mismatch(f"the KV cache was {_moved(op)} over {', '.join(bad)} (UCX), not one of kv_transports="
                                f"{list(allowed)}"))
    devices = expect.get("kv_devices")
    if devices:
        off = [d for d in log.devices(op) if d not in devices]
        if off:
            out.append(mismatch(f"the KV cache was {_moved(op)} through {', '.join(off)} (UCX), not one of kv_devices="
                                f"{list(devices)}"))
    forbidden = [t for t in used if t in (expect.get("forbid_kv_transports") or ())]
    if forbidden:
        out.append(mismatch(f"the KV cache was {_moved(op)} over {', '.join(forbidden)} (UCX), which this fabric "
                            "forbids"))
    return out


def _moved(op: str) -> str:
    return "read" if op == "get" else "written"


def kv_verdict(profile, mover_log: str, logs: Mapping[str, str] | None = None, op: str = "get") -> dict:
    """The verdict record from the log text of the instance that moves the KV cache (op "get":
    the decode instance, "put": the prefill); `logs` (role -> path) are named in it."""
    log = ucx_log.parse(mover_log)
    rows = log.op_rows(op)
    summary = {"kv_transports": log.transports(op), "kv_devices": log.devices(op), "op": ucx_log.KV_OPS[op] + "*",
               "kv_protocols": [{"scope": r.scope, "range": r.range, "description": r.description,
                                 "transports": r.transports, "devices": r.devices} for r in rows],
               "endpoints": [{"scope": e.scope, "cfg": e.cfg, "features": e.features} for e in log.endpoints],
               "how": "UCX's own protocol table (UCX_PROTO_INFO=y) in the KV-moving instance's log", "logs": dict(logs or {})}
    out = verdict(profile, kv_problems(profile.expect or {}, log, op), [], summary)
    out["expect"] = {k: v for k, v in (profile.expect or {}).items() if k in KEYS}
    return out
