"""The KV-path verdict: which UCX transports carried a disaggregated server's KV cache, against
the fabric profile's expectations, beside the NCCL/Gloo transport verdict (verify.py).

`expect:` keys (conf/fabric/*.yaml):
  kv_transports         [tl, ...]   every transport of the KV read must be one of these
                                    (UCX names: cma, tcp, rc_verbs, rc_mlx5, dc_mlx5, cuda_ipc, ...)
  forbid_kv_transports  [tl, ...]   none of these may carry it (tcp on an RDMA fabric)

Evidence: the reading instance's UCX log (ucx_log.py): the transports of its `remote memory
read by ucp_get*` protocol rows. No such row is `unverified` (UCX_PROTO_INFO was off, or no
KV was read); a transport outside kv_transports or inside forbid_kv_transports is a `mismatch`.
"""

from __future__ import annotations

from typing import Any, Mapping

from workloads.fabric import ucx_log
from workloads.fabric.verify import Problem, mismatch, unverified, verdict

KEYS = ("kv_transports", "forbid_kv_transports")


def kv_problems(expect: Mapping[str, Any], log: ucx_log.UcxLog) -> list[Problem]:
    used = log.get_transports()
    if not used:
        return [unverified("the KV-reading instance's UCX log has no `remote memory read by ucp_get*` protocol "
                           "table (UCX_PROTO_INFO=y not in effect, or no KV transfer happened)")]
    out = []
    allowed = expect.get("kv_transports")
    if allowed:
        bad = [t for t in used if t not in allowed]
        if bad:
            out.append(mismatch(f"the KV cache was read over {', '.join(bad)} (UCX), not one of kv_transports="
                                f"{list(allowed)}"))
    forbidden = [t for t in used if t in (expect.get("forbid_kv_transports") or ())]
    if forbidden:
        out.append(mismatch(f"the KV cache was read over {', '.join(forbidden)} (UCX), which this fabric forbids"))
    return out


def kv_verdict(profile, reader_log: str, logs: Mapping[str, str] | None = None) -> dict:
    """The verdict record from the KV reader's log text; `logs` (role -> path) are named in it."""
    log = ucx_log.parse(reader_log)
    rows = log.get_rows()
    summary = {"kv_transports": log.get_transports(),
               "get_protocols": [{"scope": r.scope, "range": r.range, "description": r.description,
                                  "transports": r.transports} for r in rows],
               "endpoints": [{"scope": e.scope, "cfg": e.cfg, "features": e.features} for e in log.endpoints],
               "how": "UCX's own protocol table (UCX_PROTO_INFO=y) in the decode instance's log", "logs": dict(logs or {})}
    out = verdict(profile, kv_problems(profile.expect or {}, log), [], summary)
    out["expect"] = {k: v for k, v in (profile.expect or {}).items() if k in KEYS}
    return out
