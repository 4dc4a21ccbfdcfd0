"""What the collectives workload declares to the catalog: its typed config keys and the
metrics its records carry beside the bandwidths (docs/metrics.md)."""

from workloads.catalog import Metric
from workloads.core.schema import COUNT, INDEX, OPT_COUNT, SECONDS, Flag, Num

KEYS = {
    "collectives.iters": COUNT, "collectives.warmup_iters": INDEX, "collectives.root": INDEX,
    "collectives.stepfactor": Num(True, 1, lo_open=True, optional=True), "collectives.ranks_per_node": OPT_COUNT,
    "collectives.p2p_iters": COUNT, "collectives.p2p_warmup": INDEX, "collectives.p2p_window": COUNT,
    "collectives.sample_iters": INDEX,
    "collectives.min_busbw": Num(False, 0, optional=True), "collectives.external_timeout_s": SECONDS,
    "collectives.check": Flag(), "collectives.in_place": Flag(), "collectives.out_of_place": Flag(),
}

METRICS = (
    Metric("*busbw*(GB/s)", "GB/s", True, "faster"),
    Metric("*algbw*(GB/s)", "GB/s", True, "faster"),
    # collectives.check: elements and measurements that came back wrong, counts per run
    Metric("wrong_elements", "elements", False, counted=True),
    Metric("rows_with_wrong", "measurements", False, counted=True),
)
