"""Per-iteration times of a collective across ranks: spread, stragglers, a stability verdict.

After the block timing that stays the headline (nccl-tests' semantics), each size runs
`sample_iters` more calls, each timed on its own on every rank (a CUDA event pair per call
on GPU, the clock around a blocking call on CPU): t[r][i] = rank r's time inside call i.

In a collective every rank waits for the last one to arrive, so the late rank spends the
*shortest* time inside the call. Without comparing clocks across hosts:

    T(i)       = max_r t[r][i]                the call's duration (first arrival to the end)
    late[r][i] = T(i) − t[r][i]               how much later than the first rank r arrived

Per size (pure functions; DESIGN-style definitions in docs/collectives.md, worked values in tests):
    p50/p95/p99 of T (numpy's linear interpolation), CV = std(T, ddof=1) / mean(T);
    the latest rank = the rank with the largest median lateness, with its node (rank //
    ranks per node) and how often it was the last to arrive;
    verdict: "straggler" when the latest rank's median lateness is >= 25% of median T and
             it arrived last in >= 75% of the sampled calls; else "variable" when CV > 0.10;
             else "stable".
With several communicators (patterns one_per_node, pairs) lateness is taken within each.
"""

from __future__ import annotations

import numpy as np

STRAGGLER_SHARE = 0.25   # median lateness / median T at and above which one rank is called a straggler
STRAGGLER_LAST = 0.75    # ...when it also arrived last in at least this share of the calls
VARIABLE_CV = 0.10


def lateness(t: np.ndarray) -> np.ndarray:
    """(ranks, iters) in-call times -> (ranks, iters) lateness: max over ranks minus own time."""
    return t.max(axis=0, keepdims=True) - t


def size_stats(times: dict[int, list[float]], groups: list[list[int]], ranks_per_node: int) -> dict:
    """`times[world rank]` = that rank's in-call seconds for each sampled call; `groups` the
    communicators (world ranks). Returns the per-size figures described in the module doc."""
    durations, late_by_rank, last_count, calls = [], {}, {}, 0
    for g in groups:
        t = np.array([times[r] for r in g], dtype=float)  # (ranks in g, iters)
        if t.size == 0:
            continue
        durations.append(t.max(axis=0))
        late = lateness(t)
        last = late.argmax(axis=0)
        for j, r in enumerate(g):
            late_by_rank[r] = late[j]
            last_count[r] = int((last == j).sum()) if len(g) > 1 else 0
        calls = max(calls, t.shape[1])
    T = np.concatenate(durations) if durations else np.array([])
    if T.size == 0:
        return {"samples": 0}
    p50, p95, p99 = (float(x) for x in np.percentile(T, [50, 95, 99]))
    cv = float(T.std(ddof=1) / T.mean()) if T.size > 1 and T.mean() > 0 else 0.0
    med_late = {r: float(np.median(v)) for r, v in late_by_rank.items()}
    worst = max(med_late, key=lambda r: (med_late[r], -r))
    share = med_late[worst] / p50 if p50 > 0 else 0.0
    last_share = last_count[worst] / calls if calls else 0.0
    if share >= STRAGGLER_SHARE and last_share >= STRAGGLER_LAST:
        verdict = "straggler"
    elif cv > VARIABLE_CV:
        verdict = "variable"
    else:
        verdict = "stable"
    return {
        "samples": int(T.size), "p50(us)": p50 * 1e6, "p95(us)": p95 * 1e6, "p99(us)": p99 * 1e6, "cv": cv,
        "latest_rank": worst, "latest_node": worst // max(1, ranks_per_node),
        "latest_median_lateness(us)": med_late[worst] * 1e6, "latest_share_of_p50": share,
        "latest_arrived_last": last_share, "verdict": verdict,
        "median_lateness_us_by_rank": {str(r): v * 1e6 for r, v in sorted(med_late.items())},
        "times_us_by_rank": {str(r): [x * 1e6 for x in times[r]] for r in sorted(times)},
    }


def verdict_line(st: dict) -> str:
    """'straggler: rank 1 (node 1) arrives 5012 us late (98% of p50), last in 10/10 calls'."""
    if not st.get("samples"):
        return "not sampled"
    who = f"rank {st['latest_rank']} (node {st['latest_node']})"
    if st["verdict"] == "straggler":
        return (f"straggler: {who} arrives {st['latest_median_lateness(us)']:.0f} us late "
                f"({st['latest_share_of_p50']:.0%} of p50), last in {st['latest_arrived_last']:.0%} of calls")
    return f"{st['verdict']} (latest {who}, {st['latest_median_lateness(us)']:.0f} us)"
