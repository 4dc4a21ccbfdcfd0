"""What the inference workload declares to the catalog: its typed config keys (load generator
and server) and its metrics (docs/metrics.md)."""

from workloads.catalog import Metric
from workloads.core.schema import COUNT, INDEX, OPT_COUNT, SECONDS, Many, Num

KEYS = {
    "load.points": Many(Num(False, 0, lo_open=True, finite=False)), "load.num_requests": OPT_COUNT,
    "load.duration_s": Num(False, 0, lo_open=True, optional=True), "load.warmup_requests": INDEX,
    "load.request_timeout_s": SECONDS, "load.seed": Num(True), "load.burstiness": Num(False, 0, lo_open=True),
    "load.rate": Num(False, 0, lo_open=True, finite=False), "load.lag_warn_ms": Num(False, 0), "load.max_concurrency": OPT_COUNT,
    "load.max_failed_fraction": Num(False, 0, 1),
    "load.dataset.input_len": COUNT, "load.dataset.output_len": COUNT, "load.dataset.range_ratio": Num(False, 0, 1),
    "server.port": Num(True, 0, 65535), "server.tp": OPT_COUNT, "server.nnodes": COUNT, "server.node_rank": INDEX,
    "server.max_batch_size": COUNT, "server.max_kv_tokens": COUNT, "server.kv_block_size": COUNT,
    "server.max_queue": COUNT, "server.heartbeat_s": SECONDS, "server.shutdown_grace_s": Num(False, 0),
    "server.ready_timeout_s": SECONDS, "server.stop_timeout_s": SECONDS,
    "server.eos_token_id": Num(True, 0, optional=True),
}

METRICS = (
    Metric("*send_lag_ms", "ms", False),          # the client's own lateness, not the fabric's speed
    Metric("request_throughput", "requests/s", True, "faster"),
    Metric("request_goodput", "requests/s", True, "faster"),
    Metric("duration", "s", False, "faster"),      # seconds a load point took
    Metric("completed", "requests", True),
    Metric("failed", "requests", False, counted=True), Metric("warmup_failed", "requests", False, counted=True),
    Metric("kv_xfer_ms_*", "ms", False, "faster"),  # server=vllm-pd: NIXL's KV transfer time (mean, worst p90)
    Metric("kv_ttft_share", "fraction", False),     # server=vllm-pd: the KV transfer's part of TTFT
)
