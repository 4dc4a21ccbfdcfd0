"""What an earlier inference sweep says of its measured window, for `window: auto` (window.py).

A sweep run (launch/infer.py) starts its server once, then measures each load point of
`load.points` in turn, every one `load.num_requests` requests after its own
`load.warmup_requests`, one record per point. One more request per point adds to the run

    t        = Σ over the run's points of duration / num_requests   (one request at every point)
    window   = num_requests · t                                      (the points' durations)

and O is the rest of the run's wall time: the server's start and model load, its transport
check, each point's warm-up, the records.

σ_w comes from the primary point's per-request samples (`samples.requests`, in send order, the
ok ones): the statistic the primary metric takes over the whole point is taken over each of
five batches of consecutive requests (window.batch_var), by the function that computes the
metric (workloads/inference/metrics.py): a latency metric's mean, median, sd or percentile of
the batch's TTFT, TPOT, ITL (the batch's gaps pooled) or E2EL; a closed loop's throughput its
Σ (1, or the output, input or all tokens) / Σ latency, since c workers kept busy serve c·n
requests in Σ latency, and c cancels in the log. An open loop's throughput is its arrival
schedule's (load.seed fixes it), not an average of its requests, and goodput counts an SLO:
no window is sized from either. A percentile of a small batch (the p99 of 20 requests is
nearly their largest) varies more than 1/size says, so a window sized on a tail errs long.
"""

from __future__ import annotations

import re
from typing import Callable

from workloads.study.window import Measured, batch_var

KEY = "load.num_requests"
_LATENCY = re.compile(r"^(mean|median|std|p(\d+))_(ttft|tpot|itl|e2el)_ms$")
# a closed loop's throughput metric -> what one request adds to its numerator
_THROUGHPUT = {"request_throughput": lambda r: 1, "output_throughput": lambda r: r.get("output_tokens") or 0,
               "input_throughput": lambda r: r.get("prompt_len") or 0,
               "total_token_throughput": lambda r: (r.get("prompt_len") or 0) + (r.get("output_tokens") or 0)}


def _values(kind: str, rows: list[dict]) -> list[float]:
    """Seconds of `kind` over the batch's requests, gathered as the point's metrics were
    (metrics.series), from the record's samples."""
    from types import SimpleNamespace

    from workloads.inference.metrics import series

    return series([SimpleNamespace(ttft=r["ttft_s"], latency=r["latency_s"], itl=r.get("itl_s") or [],
                                   output_tokens=int(r.get("output_tokens") or 0)) for r in rows])[kind]


def statistic(metric: str | None, arrival: str | None) -> Callable[[list[dict]], float | None] | None:
    """A batch of request rows -> the primary metric's statistic over them; None where the
    requests' samples do not make the metric (module docstring)."""
    if metric in _THROUGHPUT:
        if arrival != "closed":
            return None
        count = _THROUGHPUT[metric]
        return lambda rows: sum(count(r) for r in rows) / sum(r["latency_s"] for r in rows)
    got = _LATENCY.match(metric or "")
    if got is None:
        return None
    from workloads.inference.metrics import stats_ms

    kind, pct = got.group(3), (int(got.group(2)),) if got.group(2) else ()
    return lambda rows: stats_ms(kind, _values(kind, rows), pct).get(metric)


def requests_of(rec: dict, run: list[dict], metric: str | None) -> Measured | None:
    """The window of the sweep run whose records are `run`, `rec` its primary point's (module
    docstring); None without a fixed load.num_requests, a point's duration, or samples enough."""
    n = int((((rec.get("config") or {}).get("load") or {}).get("num_requests")) or 0)
    durations = [(r.get("metrics") or {}).get("duration") for r in run]
    stat = statistic(metric, (rec.get("arrival") or {}).get("kind"))
    if n <= 0 or stat is None or not all(isinstance(d, (int, float)) and d > 0 for d in durations):
        return None
    rows = [r for r in (rec.get("samples") or {}).get("requests") or [] if r.get("ok")]
    var = batch_var(rows, stat)
    if var is None:
        return None
    step = sum(durations) / n
    return Measured(var, step, n * step, n)


def _run(rec: dict) -> tuple:
    """The sweep run a point's record belongs to: its study cell and run directory."""
    st = rec.get("study") or {}
    return st.get("id"), st.get("arm"), st.get("block"), rec.get("run_id"), (rec.get("config") or {}).get("trial")


def reader(records: list[dict], metric: Callable[[dict], str | None],
           rank: Callable[[dict], float | None]) -> Callable[[dict], Measured | None]:
    """What one record of a sweep says of its run's window: the run's primary point's record
    (the highest `rank`, None: not the primary point) says it, its other points' say nothing, so
    window.summarize counts each run once."""
    runs: dict[tuple, list[dict]] = {}
    for rec in records:
        runs.setdefault(_run(rec), []).append(rec)

    def read(rec: dict) -> Measured | None:
        mine = runs.get(_run(rec), [rec])
        ranked = [(level, i) for i, r in enumerate(mine) if (level := rank(r)) is not None]
        if not ranked or mine[max(ranked)[1]] is not rec:
            return None
        return requests_of(rec, mine, metric(rec))
    return read
