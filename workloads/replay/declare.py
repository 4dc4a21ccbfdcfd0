"""What the replay workload declares to the catalog: its metrics (docs/metrics.md); its
`replay:` keys are checked by its validator, which names the trace's own problems."""

from workloads.catalog import Metric

KEYS: dict = {}

METRICS = (
    Metric("comm_time_per_step(s)", "s", False, "faster"),
    Metric("original_comm_time_per_step(s)", "s", False, "faster"),
)
