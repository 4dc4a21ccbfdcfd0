"""Arrival processes: when each request of a load point is sent.

Open loop (the schedule does not wait for answers):
- poisson at `rate` req/s: exponential gaps with mean 1/rate;
- gamma with `burstiness` b (vLLM's meaning): gaps ~ Gamma(shape=b, scale=1/(rate·b)),
  so the mean gap stays 1/rate and the coefficient of variation is 1/sqrt(b): b < 1 is
  burstier than Poisson, b = 1 is Poisson, b > 1 is more regular;
- burst: every request at t = 0 (rate = inf).
`max_concurrency` caps requests in flight for any open-loop process; a request that
waits for a slot is queued by design, and that wait is recorded apart from send lag.

Closed loop: `concurrency` workers, each sending its next request as soon as the
previous one finished.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads.core.errors import UsageError

KINDS = ("poisson", "gamma", "burst", "closed", "mlperf")  # mlperf: LoadGen schedules (loadgen/mlperf.py)


@dataclass(frozen=True)
class Arrival:
    kind: str
    rate: float = math.inf          # req/s, open loop
    burstiness: float = 1.0         # gamma shape
    concurrency: int | None = None  # closed loop
    max_concurrency: int | None = None  # open-loop cap

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"load.arrival={self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind == "closed":
            if not self.concurrency or self.concurrency <= 0:
                raise UsageError(f"closed-loop arrival needs a positive concurrency, got {self.concurrency}")
        elif self.kind in ("poisson", "gamma") and not (self.rate > 0):
            raise UsageError(f"load.arrival={self.kind} needs a positive request rate, got {self.rate}")
        if self.burstiness <= 0:
            raise UsageError(f"load.burstiness={self.burstiness} must be > 0 (1 = Poisson)")
        if self.max_concurrency is not None and self.max_concurrency <= 0:
            raise UsageError(f"load.max_concurrency={self.max_concurrency} must be positive or null")

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"

    def offsets(self, n: int, seed: int = 0) -> np.ndarray:
        """Send times in seconds from the start of the point, shape (n,), first at 0."""
        if self.kind == "closed":
            raise ValueError("a closed loop has no schedule")
        if self.kind == "burst" or math.isinf(self.rate):
            return np.zeros(n)
        shape = 1.0 if self.kind == "poisson" else self.burstiness
        gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (self.rate * shape), size=n)
        return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else gaps

    def label(self) -> str:
        if self.kind == "mlperf":
            return f"mlperf-r{self.rate:g}"
        if self.kind == "closed":
            return f"c{self.concurrency}"
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        cap = f"-max{self.max_concurrency}" if self.max_concurrency else ""
        shape = f"-b{self.burstiness:g}" if self.kind == "gamma" else ""
        return f"{self.kind}-r{rate}{shape}{cap}"
