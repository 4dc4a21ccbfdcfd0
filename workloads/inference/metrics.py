"""Serving metrics as pure functions (docs/metrics.md "Inference metrics"), with vLLM's field names.

Per request (completed ones only):
- TTFT (s): first content event − send time (first token event for a request whose tokens
  all decode to empty text: loadgen/client.py);
- TPOT (s): (latency − TTFT) / (output tokens − 1), only for requests with > 1 token;
- ITL (s): every gap between content events, pooled over all requests;
- E2EL (s): latency.
Each is reported in ms as mean_/median_/std_ (population std, numpy's) and p90/p95/p99
(numpy's linear-interpolation percentile). Throughputs divide by the point's wall time:
request_throughput = completed / duration, output_throughput = Σ output tokens /
duration, input_throughput likewise, total_token_throughput = (input + output) /
duration. request_goodput = completed requests meeting every given SLO / duration.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from workloads.core.errors import UsageError

PERCENTILES = (90, 95, 99)
SLO_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el", "e2el": "e2el"}


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft:500 tpot:50 e2e:2000' (ms) -> {'ttft': 500.0, 'tpot': 50.0, 'e2el': 2000.0}."""
    if not text:
        return {}
    out = {}
    for item in str(text).replace(",", " ").split():
        key, sep, val = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise UsageError(f"load.slo item {item!r}: write 'ttft:MS tpot:MS e2e:MS' (any subset)")
        try:
            out[SLO_KEYS[key]] = float(val)
        except ValueError:
            raise UsageError(f"load.slo item {item!r}: {val!r} is not a number of milliseconds") from None
        if out[SLO_KEYS[key]] <= 0:
            raise UsageError(f"load.slo item {item!r} must be positive")
    return out


def tpot(latency: float, ttft: float, output_tokens: int) -> float | None:
    return (latency - ttft) / (output_tokens - 1) if output_tokens > 1 else None


def stats_ms(name: str, values_s: Sequence[float], percentiles: Iterable[int] = PERCENTILES) -> dict[str, float | None]:
    a = np.asarray(values_s, dtype=float) * 1e3
    out: dict[str, float | None] = {}
    empty = a.size == 0
    out[f"mean_{name}_ms"] = None if empty else float(a.mean())
    out[f"median_{name}_ms"] = None if empty else float(np.median(a))
    out[f"std_{name}_ms"] = None if empty else float(a.std())
    for p in percentiles:
        out[f"p{p}_{name}_ms"] = None if empty else float(np.percentile(a, p))
    return out


def series(ok: Sequence) -> dict[str, list[float]]:
    """Seconds of each latency over ok requests (anything with ttft, latency, itl and
    output_tokens): TTFT and E2EL one per request, TPOT one per request of 2 or more tokens, ITL
    every gap of every request, pooled."""
    return {"ttft": [r.ttft for r in ok],
            "tpot": [t for r in ok if (t := tpot(r.latency, r.ttft, r.output_tokens)) is not None],
            "itl": [g for r in ok for g in r.itl],
            "e2el": [r.latency for r in ok]}


def summarize(results: Sequence, duration_s: float, slo: dict[str, float] | None = None,
              max_errors: int = 20) -> dict:
    """`results` are client.RequestResult (measured requests only, warm-up excluded)."""
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    n_in = sum(r.prompt_len for r in ok)
    n_out = sum(r.output_tokens for r in ok)
    good = 0
    if slo:
        for r in ok:
            # vLLM's rule: a 1-token answer has TPOT 0 for goodput.
            got = {"ttft": r.ttft, "tpot": tpot(r.latency, r.ttft, r.output_tokens) or 0.0, "e2el": r.latency}
            good += all(got[k] * 1e3 <= limit for k, limit in slo.items())
    errors: dict[str, int] = {}
    for r in bad:
        errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    m = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(bad),
        "total_input_tokens": n_in,
        "total_output_tokens": n_out,
        "request_throughput": len(ok) / duration_s,
        "request_goodput": (good / duration_s) if slo else None,
        "input_throughput": n_in / duration_s,
        "output_throughput": n_out / duration_s,
        "total_token_throughput": (n_in + n_out) / duration_s,
    }
    for name, vals in series(ok).items():
        m |= stats_ms(name, vals)
    # The distinct messages with their counts; the first few verbatim, per vLLM's "errors".
    m["errors"] = [f"{n}x {msg}" for msg, n in sorted(errors.items(), key=lambda kv: -kv[1])][:max_errors]
    return m


def send_lag_stats(lags_s: Sequence[float]) -> dict[str, float | None]:
    """How late the client sent requests versus their schedule (its own honesty)."""
    a = np.asarray(lags_s, dtype=float) * 1e3
    if a.size == 0:
        return {"mean_send_lag_ms": None, "p99_send_lag_ms": None, "max_send_lag_ms": None}
    return {"mean_send_lag_ms": float(a.mean()), "p99_send_lag_ms": float(np.percentile(a, 99)),
            "max_send_lag_ms": float(a.max())}
