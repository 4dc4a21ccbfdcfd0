"""What UCX says it chose, from its own log (UCX_LOG_LEVEL=info, UCX_PROTO_INFO=y): the KV path
of a NIXL/UCX transfer (server=vllm-pd), read as nccl_log.py reads NCCL's.

Two kinds of output, both from openucx/ucx (commit 9466d104a317c8ffddd9734e72055d8bbda021b3;
the bundled UCX 1.23.0 of nixl-cu13 1.5.1 prints the same):

1. The lanes of an endpoint configuration, one ucs_info line each
   (src/ucp/core/ucp_worker.c ucp_worker_print_used_tls, name from src/ucp/core/ucp_ep.c
   ucp_ep_config_name): "[<context name> ]{self|intra-node|inter-node} cfg#<n>", then per
   feature " <feature>(" + "<tl>/<device> " per lane + ")", features tag, rma or rma_am (RMA
   emulated over active messages), amo or amo_am, device, am, stream, ka.
       ... intra-node cfg#1 rma_am(tcp/lo)  amo_am(tcp/lo)  am(tcp/lo cma/memory)  ka(tcp/lo)
2. The protocol selection table of an operation (src/ucp/proto/proto_debug.c
   ucp_proto_select_elem_info, printed by ucs_log_print_compact): two full-width title rows
   (the endpoint config name; the operation, src/ucp/proto/proto.c ucp_operation_descs, e.g.
   "remote memory read by ucp_get*(multi) into host memory from host"), a separator, the
   header row "Range | Description | Config", a separator, then one row per message-size range
   whose Config cell names the transports ("cma/memory", "tcp/lo", "rc_mlx5/mlx5_0:1").
   That is the layout of UCX >= 1.22.0 (its table builder, ucs_table, first ships there).
   UCX 1.18.0-1.21.0 (bundled by NIXL wheels before 1.4.0) print the same function's older
   layout: one two-cell title row "| <endpoint config> | <operation> |", a separator, then the
   body rows "| <count> <range> | <description> | <config> |" with no header row (v1.21.0
   src/ucp/proto/proto_debug.c "| %*s | %-*s |" and "| %s%*s | %-*s | %-*s |", the count only
   under UCX_PROTO_INFO=used). Both are read.

The KV read of vLLM's pull-mode NixlConnector is a ucp_get by the decode instance (push mode:
a ucp_put by the prefill instance), so the transports of those rows carried the KV cache.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_CFG = re.compile(r"(?P<scope>self|intra-node|inter-node) cfg#(?P<cfg>\d+)(?P<features>(?:\s+\w+\([^)]*\))+)\s*$")
_FEATURE = re.compile(r"(\w+)\(([^)]*)\)")
# The operations (src/ucp/proto/proto.c ucp_operation_descs) that move a KV cache: the decode
# instance reads it (vLLM's pull mode) or the prefill instance writes it (push mode).
KV_OPS = {"get": "remote memory read by ucp_get", "put": "remote memory write by ucp_put"}
# UCX's log prefix (src/ucs/debug/log.c): "[<time>] [<host>:<pid>:<thread>] "; lines of
# different threads interleave, so each thread's table is assembled apart.
_PREFIX = re.compile(r"^\[[^\]]*\]\s+\[(?P<tag>[^\]]*)\]\s+")


def _tls(resources: str) -> list[str]:
    """'tcp/lo cma/memory' -> ['tcp', 'cma']: the transport of each <tl>/<device>."""
    return [r.split("/", 1)[0] for r in resources.split() if "/" in r]


def _devices(resources: str) -> list[str]:
    """'tcp/emu0 cma/memory' -> ['emu0', 'memory']: the device of each <tl>/<device>."""
    return [r.split("/", 1)[1] for r in resources.split() if "/" in r]


@dataclass(frozen=True)
class EndpointConfig:
    scope: str                         # self | intra-node | inter-node
    cfg: int
    features: dict[str, list[str]]     # feature -> transports of its lanes (rma_am: RMA emulated over AM)


@dataclass(frozen=True)
class ProtoRow:
    scope: str          # of the table's endpoint config
    operation: str      # the title row naming the operation
    range: str          # message sizes, e.g. "0..inf"
    description: str    # zero-copy | software emulation | ...
    transports: list[str]
    devices: list[str] = field(default_factory=list)  # the <device> of each <tl>/<device>: lo, emu0, memory, mlx5_0:1


@dataclass
class UcxLog:
    endpoints: list[EndpointConfig] = field(default_factory=list)
    rows: list[ProtoRow] = field(default_factory=list)

    def op_rows(self, op: str = "get") -> list[ProtoRow]:
        """The rows of one operation (KV_OPS) between processes: a `self` endpoint (a process
        to itself, e.g. NIXL's loopback notifications) carries no KV cache between instances."""
        return [r for r in self.rows if KV_OPS[op] in r.operation and r.scope != "self"]

    def transports(self, op: str = "get") -> list[str]:
        return sorted({t for r in self.op_rows(op) for t in r.transports})

    def devices(self, op: str = "get") -> list[str]:
        return sorted({d for r in self.op_rows(op) for d in r.devices})


def parse(text: str) -> UcxLog:
    out = UcxLog()
    tables: dict[str, tuple[list[str], bool]] = {}  # per thread: the table's title rows, past its header
    for raw in text.splitlines():
        m = _PREFIX.match(raw)
        tag, line = (m["tag"], raw[m.end():].strip()) if m else ("", raw.strip())
        titles, body = tables.get(tag, ([], False))
        titles, body = _line(out, line, list(titles), body)
        tables[tag] = (titles, body)
    return out


def _line(out: UcxLog, line: str, titles: list[str], body: bool) -> tuple[list[str], bool]:
    """One line (its UCX prefix removed) into `out`; returns the thread's new table state."""
    if not line.startswith("|"):
        m = _CFG.search(line)
        if m:
            feats = {f: _tls(res) for f, res in _FEATURE.findall(m["features"])}
            out.endpoints.append(EndpointConfig(m["scope"], int(m["cfg"]), feats))
        if line.startswith("+"):  # a separator keeps the table going; anything else ends it
            return titles, body
        return [], False
    cells = [c.strip() for c in line.strip("|").split("|")]
    if len(cells) == 1:             # a full-width title row starts (or continues) a table
        return (([] if body else titles) + [cells[0]]), False
    if len(cells) == 2 and "cfg#" in cells[0]:  # UCX <= 1.21: both titles in one row, no header
        return cells, True
    if cells[-1] == "Config" and "Range" in cells:
        return titles, True
    if body and len(titles) >= 2 and len(cells) >= 3:
        scope = next((s for s in ("self", "intra-node", "inter-node") if s in titles[0]), "?")
        # UCX <= 1.21 puts the selection count (=used) in the range's cell: "3  0..inf"
        rng = (cells[-3].split() or [""])[-1]
        out.rows.append(ProtoRow(scope, titles[1], rng, cells[-2], _tls(cells[-1]), _devices(cells[-1])))
    return titles, body
