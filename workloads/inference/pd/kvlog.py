"""vLLM's KV-transfer metrics, from the decode instance's own log, and the KV size they should match.

The decode (KV-reading) instance's API server logs, each VLLM_LOG_STATS_INTERVAL seconds in
which a transfer happened, one line (vLLM 0.32.0, vllm/distributed/kv_transfer/kv_connector/
v1/metrics.py KVConnectorLogging.log: `"KV Transfer metrics: %s"` with `", ".join(f"{k}={v}")`
of NixlKVConnectorStats.reduce() in .../v1/nixl/stats.py):
    KV Transfer metrics: Num successful transfers=1, Avg xfer time (ms)=0.129, P90 xfer time (ms)=0.129,
    Avg post time (ms)=..., P90 post time (ms)=..., Avg MB per transfer=0.125, Throughput (MB/s)=968.992,
    Avg number of descriptors=2.0, Num failed transfers=0, Num KV expired reqs=0, Num notifs after expiry=0
"MB" there is MiB (bytes / 2**20), every figure rounded to 3 decimals, a transfer is one
request's KV read; times are of successful transfers only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_LINE = re.compile(r"KV Transfer metrics: (?P<body>Num successful transfers=.*\S)")
_FIELD = re.compile(r"(?:^|, )(?P<key>[A-Za-z0-9 ()/]+?)=(?P<value>[-+0-9.eE]+|nan|inf)")
MIB = 2**20
# dtype names of --dtype / config.json torch_dtype -> bytes per element
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class KVInterval:
    """One logged interval (NixlKVConnectorStats.reduce())."""

    transfers: int
    avg_xfer_ms: float
    p90_xfer_ms: float
    avg_mib: float
    failed: int
    expired: int


def parse(text: str) -> list[KVInterval]:
    out = []
    for m in _LINE.finditer(text):
        f = {x["key"].strip(): float(x["value"]) for x in _FIELD.finditer(m["body"])}
        out.append(KVInterval(int(f.get("Num successful transfers", 0)), f.get("Avg xfer time (ms)", 0.0),
                              f.get("P90 xfer time (ms)", 0.0), f.get("Avg MB per transfer", 0.0),
                              int(f.get("Num failed transfers", 0)), int(f.get("Num KV expired reqs", 0))))
    return out


def summarize(intervals: list[KVInterval]) -> dict:
    """Over every logged interval: transfers, KV bytes per transfer (a transfer-weighted mean of
    the intervals' means; each mean is rounded to 0.001 MiB, so ±524 B), mean transfer time
    (weighted likewise), the worst interval's p90, failures and expiries."""
    n = sum(i.transfers for i in intervals)
    total_ms = sum(i.transfers * i.avg_xfer_ms for i in intervals)
    total_mib = sum(i.transfers * i.avg_mib for i in intervals)
    return {"transfers": n, "failed": sum(i.failed for i in intervals), "expired": sum(i.expired for i in intervals),
            "bytes_per_transfer": round(total_mib * MIB / n) if n else None,
            "xfer_ms_mean": total_ms / n if n else None,
            "xfer_ms_p90_max": max((i.p90_xfer_ms for i in intervals if i.transfers), default=None),
            "throughput_MiBps": total_mib / (total_ms / 1e3) if total_ms else None, "intervals": len(intervals)}


@dataclass(frozen=True)
class KVShape:
    """What one token's KV cache is, as the engine stores it (the model's config.json)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def from_hf_config(cls, cfg: dict, dtype: str | None = None) -> KVShape:
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        dtype = str(dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
        return cls(int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads") or heads), head_dim,
                   DTYPE_BYTES[dtype])

    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes  # K and V

    def transfer_bytes(self, prompt_tokens: int, block_size: int, tp: int = 1) -> int:
        """The bytes one logged P/D transfer moves for a prompt: vLLM allocates KV in whole blocks
        and the decode instance reads every block the prefill filled, the last one partly full.
        Under tensor parallelism each TP worker holds and moves only its own KV heads (kv_heads /
        tp, one replicated head each when tp > kv_heads) and logs that as its own transfer: vLLM's
        nixl stats.py aggregates every rank's transfers before "Avg MB per transfer", which is
        "averaged over all individual rank-level transfers" (its module docstring)."""
        per_rank = self.bytes_per_token() // self.kv_heads * self.heads_per_rank(tp)
        return per_rank * math.ceil(prompt_tokens / block_size) * block_size

    def heads_per_rank(self, tp: int) -> int:
        """KV heads one TP worker holds: an equal share, or one (replicated) when tp > kv_heads."""
        return max(1, self.kv_heads // max(1, tp))


# The link must carry at least every KV byte the point's requests moved (TCP/IP and Ethernet, or
# IB/RoCE, headers come on top); below this share, most of the KV cache went some other way
# (CMA between the two processes, never on the wire; another interface than the one read).
CROSSED_MIN = 1.0
NOT_CROSSED_BELOW = 0.5
EMULATED = ("the emulated link", "CMA between the processes?")


def link_crossing(iface: str, before: tuple[int, int], after: tuple[int, int], kv_bytes: int | None,
                  where: tuple[str, str] = EMULATED) -> dict:
    """What the prefill node's end of the link carried during a point, beside the KV bytes its
    requests should have moved across it. (tx, rx) byte counters of `iface` (several rails
    summed: their names joined by commas) in the prefill's node: tx is prefill -> decode, the KV
    cache's direction in pull and push mode alike (pull: the decode's GET is answered with the
    blocks, which an RDMA port counts in its port_xmit_data; push: the prefill PUTs them).
    `where`: the link's name in the message, and the likeliest other path."""
    tx, rx = after[0] - before[0], after[1] - before[1]
    out = {"interface": iface, "node": 0, "tx_bytes": tx, "rx_bytes": rx, "kv_bytes": kv_bytes,
           "ratio": tx / kv_bytes if kv_bytes else None}
    if not kv_bytes:
        out["verdict"], out["message"] = "unverified", "no KV bytes expected in this point (no request completed)"
    elif tx < 0:  # as nic.summarize: a counter reset, or an old HCA's 32-bit counter that wrapped
        out["verdict"], out["message"] = "unverified", f"{iface}'s tx counter went backwards during the point"
    elif out["ratio"] >= CROSSED_MIN:
        out["verdict"], out["message"] = "ok", None
    elif out["ratio"] < NOT_CROSSED_BELOW:
        out["verdict"] = "not_crossed"
        out["message"] = (f"{iface} carried {tx} B from the prefill node, far below the {kv_bytes} B of KV cache its "
                          f"requests moved: the KV cache did not cross {where[0]} ({where[1]})")
    else:
        out["verdict"] = "short"
        out["message"] = f"{iface} carried {tx} B from the prefill node, less than the {kv_bytes} B of KV cache expected"
    return out


def ucx_rails(devices: str | None) -> list[str]:
    """UCX_NET_DEVICES (UCX's device names, `mlx5_0:1,eth0`) as nic.py's rails (`rdma:mlx5_0:1`,
    `net:eth0`); none where it names no device of its own: unset, `all`, or an exclusion (`^eth0`)."""
    names = [d.strip() for d in (devices or "").split(",") if d.strip()]
    if not names or "all" in names or names[0].startswith("^"):
        return []
    return [f"rdma:{d}" if ":" in d else f"net:{d}" for d in names]


def predicted_xfer_ms(nbytes: int, rate_bits_per_s: float, payload_fraction: float, burst_bytes: int = 0) -> float:
    """The time one KV transfer needs at the link's TCP payload rate: bytes / (rate / 8 × the
    payload share of a frame, 1448/1514 at MTU 1500), with no protocol round trips. With
    `burst_bytes` (tbf's bucket, full when the link was idle) that many frame bytes pass at once:
    (bytes / payload share − burst) / (rate / 8), at least 0."""
    frames = nbytes / payload_fraction
    return max(0.0, frames - burst_bytes) / (rate_bits_per_s / 8) * 1e3


def ttft_split(legs: list[dict], ttft_s: list[float], xfer_ms_mean: float | None) -> dict | None:
    """The measured requests' mean TTFT in parts that add up (means add; medians do not): the
    prefill leg (the proxy's post to the prefill instance's answer: its queue and the prompt's
    forward pass), the decode leg to its first chunk (the KV transfer, the decode instance's queue
    and first step), and what lies outside both legs (client <-> proxy, the proxy's own work).
    With vLLM's mean KV transfer time (measured in the engine, inside the decode leg) the decode
    leg splits further into the transfer and the rest. `legs`: the proxy's rows of the measured
    requests; None when they do not pair one to one with the completed requests' TTFTs."""
    firsts = [x.get("decode_first_s") for x in legs]
    if not ttft_s or len(legs) != len(ttft_s) or any(f is None for f in firsts):
        return None
    n = len(ttft_s)
    ttft, pre, dec = (1e3 * sum(v) / n for v in (ttft_s, [x["prefill_s"] for x in legs], firsts))
    out = {"requests": n, "ttft": ttft, "prefill_leg": pre, "decode_to_first_chunk": dec,
           "outside_legs": ttft - pre - dec}
    if xfer_ms_mean is not None:
        out |= {"kv_xfer": xfer_ms_mean, "decode_first_step_and_wait": dec - xfer_ms_mean}
    return {k: v if k == "requests" else round(v, 3) for k, v in out.items()}
