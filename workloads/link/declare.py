"""What the link workload declares to the catalog: its typed config keys and its metrics
(docs/metrics.md)."""

from workloads.catalog import Metric
from workloads.core.schema import OPT_COUNT, SECONDS, Num

KEYS = {
    "link.port": Num(True, 1, 65535), "link.server_timeout_s": SECONDS, "link.duration_s": SECONDS,
    "link.omit_s": Num(False, 0), "link.streams": Num(True, 1, 128), "link.gid_index": Num(True, 0, optional=True),
    "link.size": OPT_COUNT, "link.iters": OPT_COUNT,
}

METRICS = (
    Metric("throughput_received(Gbit/s)", "Gbit/s", True, "faster"),
    Metric("bw_average(Gbit/s)", "Gbit/s", True, "faster"),
    Metric("lat_typical(us)", "us", False, "faster"),
    Metric("*retransmits", "segments", False, counted=True),  # TCP segments sent again, a count per run
)
