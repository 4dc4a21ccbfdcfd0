"""The replay workload: a captured run's sequence of collectives, run alone on any fabric."""
