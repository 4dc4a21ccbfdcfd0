"""W&B's public API at its boundary (`wandb.Api().runs`), fed with our own records: the
network service cannot be reached here."""

from __future__ import annotations

from workloads.core.loggers import record_to_wandb


class FakeRun:
    def __init__(self, rid, record):
        self.id, self.state = rid, "finished"
        self.config, summary = record_to_wandb(record)
        self.summary = summary | {"status": record["status"], "_runtime": 3}


class FakeApi:
    """Stands in for wandb.Api at the boundary: `runs(path, filters=...)`."""

    def __init__(self, runs):
        self._runs, self.calls = runs, []

    def runs(self, path, filters=None):
        self.calls.append((path, filters))
        return list(self._runs)
