"""Inference windows (`window: auto` for an `inference` workload: load.num_requests, the requests per
load point; workloads/study/served.py): what a sweep's records say of its window, with worked
values; the planner's choice (O, t, sigma_b, sigma_w -> requests, blocks); that the batch
estimate of a median's noise is the noise of the median over n requests, and the power the plan
prints is the power it gets; and the plan with earlier sweeps, pinned, and guessing."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from analysis import stats
from workloads.study.served import reader, requests_of, statistic
from workloads.study.window import Costs, choose, costs_from

ALPHA = 0.05
L2 = math.log(2)


def _row(lat, ttft=None, out=5, prompt=16, ok=True):
    ttft = lat / 4 if ttft is None else ttft
    gap = (lat - ttft) / (out - 1)
    return {"ok": ok, "ttft_s": ttft, "latency_s": lat, "itl_s": [gap] * (out - 1), "output_tokens": out, "prompt_len": prompt}


def _point(conc, rows, duration, n=10, arm="a", block=0, run_id="r0", kind="closed", study="old"):
    arrival = {"kind": kind, "concurrency": conc if kind == "closed" else None,
               "rate": None if kind == "closed" else float(conc)}
    return {"workload": "inference", "status": "ok", "run_id": run_id, "point": f"c{conc}" if kind == "closed" else f"poisson-r{conc}",
            "arrival": arrival, "config": {"load": {"num_requests": n}, "trial": 0}, "fabric": {"name": "loopback"},
            "study": {"id": study, "arm": arm, "block": block, "workload": "s", "design": "abba"},
            "metrics": {"duration": duration, "request_throughput": n / duration, "median_ttft_ms": 1.0},
            "samples": {"requests": rows}}


# four requests of 40 ms, then six of 80 ms: batches of two give log statistics a, a, b, b, b
# (b - a = ln 2 either way up), about their mean (2a + 3b)/5: ss = 2(3d/5)^2 + 3(2d/5)^2 = 6d^2/5,
# var = ss / 4, x 2 (the batch size) = 3d^2/5 per request
ROWS = [_row(0.04) for _ in range(4)] + [_row(0.08) for _ in range(6)]


def test_requests_worked_values():
    """t = the points' durations / num_requests (one more request at every point: 1.0/10 +
    0.5/10), the window their sum; sigma_w^2 from the primary point's samples: request
    throughput (n / sum of latencies), median TTFT and mean TPOT all move by a factor 2 between
    the batches, so each gives 3 (ln 2)^2 / 5 per request."""
    c1, c4 = _point(1, [_row(0.02)] * 10, 1.0), _point(4, ROWS, 0.5)
    for metric in ("request_throughput", "median_ttft_ms", "mean_tpot_ms", "p90_e2el_ms", "output_throughput"):
        m = requests_of(c4, [c1, c4], metric)
        assert m.within2 == pytest.approx(3 * L2 ** 2 / 5), metric
        assert (m.step_s, m.window_s, m.steps) == (pytest.approx(0.15), pytest.approx(1.5), 10)
    # the statistic is the metric's own definition over the batch (metrics.stats_ms: ms, linear percentiles)
    assert statistic("p90_itl_ms", "closed")([_row(0.05, ttft=0.01), _row(0.09, ttft=0.01)]) == pytest.approx(
        float(np.percentile([10.0] * 4 + [20.0] * 4, 90)))
    # the run's primary point is its heaviest (c4); its other points say nothing of the window
    read = reader([c1, c4], lambda rec: "request_throughput", lambda rec: rec["arrival"]["concurrency"])
    assert read(c1) is None and read(c4).within2 == pytest.approx(3 * L2 ** 2 / 5)
    # ... or the declared one; another run's records are not this run's points
    declared = reader([c1, c4], lambda rec: "request_throughput", lambda rec: 1.0 if rec["point"] == "c1" else None)
    assert declared(c4) is None and declared(c1).within2 == pytest.approx(0.0)
    other = _point(1, ROWS, 1.0, run_id="r1")
    assert reader([c1, c4, other], lambda rec: "request_throughput", lambda rec: 1.0)(other).step_s == pytest.approx(0.1)
    # costs: O the median run less the median window, sigma_b the block CV less what 10 requests add
    c = costs_from([c1, c4], [21.5, 22.5], block_cv=0.2, read=read)
    assert c.overhead_s == pytest.approx(22.0 - 1.5) and c.step_s == pytest.approx(0.15) and c.steps_before == 10
    assert c.within == pytest.approx(math.sqrt(3 / 5) * L2)
    assert c.between == pytest.approx(math.sqrt(0.04 - 3 * L2 ** 2 / 5 / 10))


def test_requests_that_cannot_size_a_window():
    """No window from: an open loop's throughput (its schedule's), goodput (an SLO count), a
    sweep run for a time (no load.num_requests), fewer than 10 ok requests, a point without its
    duration; failed requests are left out of the batches."""
    c4 = _point(4, ROWS, 0.5)
    assert requests_of(_point(50, ROWS, 0.5, kind="poisson"), [c4], "request_throughput") is None
    assert requests_of(_point(50, ROWS, 0.5, kind="poisson"), [c4], "median_ttft_ms") is not None
    assert requests_of(c4, [c4], "request_goodput") is None and requests_of(c4, [c4], "failed") is None
    timed = json.loads(json.dumps(c4))
    timed["config"]["load"]["num_requests"] = None
    assert requests_of(timed, [timed], "request_throughput") is None
    few = _point(4, ROWS[:9] + [_row(0.04, ok=False)], 0.5)
    assert requests_of(few, [few], "request_throughput") is None
    assert requests_of(c4, [c4, {**c4, "metrics": {}}], "request_throughput") is None


@pytest.mark.parametrize("costs,detect,tests,requests,blocks,wall,at256", [
    # a served model: 20 s of server start, load and warm-up per run; 0.15 s per request over the
    # sweep's points; median TTFT 40% apart between requests, 3% between runs.
    # n* = sqrt(0.16 x 20 / (0.0009 x 0.15)) = 154; the integer blocks pick 87 requests, 7 blocks
    # (earlier runs measured a short window, 5 requests a point: the plan may lengthen it)
    (Costs(20.0, 0.15, 0.03, 0.40, 5), 0.10, 1, 87, 7, 462.7, (5, 584.0)),
    (Costs(20.0, 0.15, 0.03, 0.40, 5), 0.05, 3, 140, 21, 1722.0, (17, 1985.6)),
    # the same measured at 256: never fewer requests than measured (window.floor), 5 blocks of 256
    (Costs(20.0, 0.15, 0.03, 0.40, 256), 0.10, 1, 256, 5, 584.0, (5, 584.0)),
    # a cheap server (3 s) with quiet requests (10%) and noisy runs (5%): the fewest requests, more runs
    (Costs(3.0, 0.15, 0.05, 0.10, 5), 0.10, 1, 7, 9, 72.9, (7, 579.6)),
    # a tail metric (a p99, 100% apart between requests) on 20 ms requests: a long window
    (Costs(20.0, 0.02, 0.02, 1.0, 256), 0.10, 1, 850, 5, 370.0, (10, 502.4)),
])
def test_requests_per_point_worked_values(costs, detect, tests, requests, blocks, wall, at256):
    """(O, t, sigma_b, sigma_w) -> requests per point and blocks, two arms: the least wall time
    of every window from the one measured to 2000 requests, against the 256 of conf/load/concurrency_sweep.yaml."""
    ch = choose(costs, detect=detect, tests=tests, alpha=ALPHA, arms=2)
    assert (ch.steps, ch.blocks) == (requests, blocks)
    assert ch.wall_s == pytest.approx(wall) == blocks * 2 * (costs.overhead_s + requests * costs.step_s)
    k256 = stats.blocks_for(detect, tests, costs.cv(256), ALPHA)
    assert (k256, k256 * 2 * costs.run_s(256)) == (at256[0], pytest.approx(at256[1]))
    every = min(k * 2 * costs.run_s(n) for n in range(max(5, costs.steps_before), 2001)
                if (k := stats.blocks_for(detect, tests, costs.cv(n), ALPHA)))
    assert ch.wall_s <= every * 1.05


def test_batch_estimate_is_the_medians_noise_and_the_plan_keeps_its_power():
    """sigma_w from the batches of earlier points' samples is the noise of the median TTFT over n
    requests (for a lognormal, sd(log median) = sqrt(pi/2) x 0.4 / sqrt(n)); at the plan's choice
    from it, runs that take the median of n requests vary by the CV the plan counts, and in
    simulated studies through the verdict code the printed MDE is called 75-85% of the time, two
    equal arms at most alpha (+ binomial slack)."""
    rng = np.random.default_rng(4848)
    est = []
    for _ in range(100):
        rows = [_row(float(t) * 4, ttft=float(t)) for t in 0.04 * np.exp(rng.normal(0, 0.4, 40))]
        est.append(requests_of(_point(4, rows, 4.0, n=40), [_point(4, rows, 4.0, n=40)], "median_ttft_ms").within2)
    sw = math.sqrt(float(np.mean(est)))
    assert sw == pytest.approx(math.sqrt(math.pi / 2) * 0.4, rel=0.15), sw
    c = Costs(20.0, 0.1, 0.03, sw, 40)
    ch = choose(c, detect=0.10, tests=1, alpha=ALPHA, arms=2)

    def runs(shape):  # log median TTFT of runs of ch.steps requests, each run 3% off the others
        return rng.normal(0, 0.03, shape) + np.log(np.median(np.exp(rng.normal(0, 0.4, (*shape, ch.steps))), axis=-1))

    assert float(np.std(runs((4000,)))) == pytest.approx(c.cv(ch.steps), rel=0.12)
    mde = math.log1p(stats.plan_mde(ch.blocks, 1, c.cv(ch.steps), ALPHA))

    def called(effect, studies=300):
        d = effect + runs((studies, ch.blocks)) - runs((studies, ch.blocks))
        return sum(bool(stats.compare([1.0] * ch.blocks, [1.0] * ch.blocks, "b", "a", "median_ttft_ms",
                                      design=stats.Design(blocks=row, name="abba")).significant) for row in d) / studies

    assert 0.75 <= called(mde) <= 0.85
    assert called(0.0) <= ALPHA + 0.035


SPEC = """name: served
arms:
  - {label: ib, fabric: loopback, baseline: true}
  - {label: roce, fabric: loopback}
workloads:
  - {name: s, entry: inference, overrides: ["load.points=[1,4]"]}
detect: 10%
window: auto
"""


def _earlier(root, rng, blocks=8, n=20):
    """An earlier study `old` of the sweep s under `root`: runs of 20 s outside two points of n
    requests (c1 at 0.1 s a request, c4 at 0.05 s), c4's latencies 30% apart between requests and 2%
    between runs; its records (c4's throughput from its samples) and timings.jsonl."""
    from workloads.core.records import write_record

    folder = root / "old"
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"id": "old", "workloads": [{"name": "s", "entry": "inference",
                                                                               "overrides": ["load.points=[1,4]"]}],
                                                   "arms": [{"label": "ib", "fabric": "loopback"},
                                                            {"label": "roce", "fabric": "loopback"}]}))
    timings = []
    for b in range(blocks):
        for arm in ("ib", "roce"):
            lat = 0.2 * np.exp(rng.normal(0, 0.02) + rng.normal(0, 0.3, n))
            rows = [_row(float(x)) for x in lat]
            c4 = _point(4, rows, float(lat.sum()) / 4, n=n, arm=arm, block=b, run_id=f"{arm}-{b}")
            c4["metrics"]["request_throughput"] = n / c4["metrics"]["duration"]
            c1 = _point(1, [_row(0.1)] * n, 0.1 * n, n=n, arm=arm, block=b, run_id=f"{arm}-{b}")
            for rec in (c1, c4):
                write_record(folder / f"{arm}-{b}" / "records", rec, rec["point"])
            timings.append({"workload": "s", "arm": arm, "seconds": 20 + 0.1 * n + float(lat.sum()) / 4, "ok": True})
    (folder / "timings.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timings))


def test_plan_sizes_requests_per_point_and_says_when_it_guesses(tmp_path):
    """`window: auto` for an inference sweep: without earlier sweeps the plan guesses, and says so;
    with an earlier study it sets load.num_requests (every point's) and says why, in the plan and
    in the records' study.window; a workload whose overrides set load.num_requests or
    load.duration_s keeps its own."""
    from workloads.study import run as study_run
    from workloads.study.plan import make_plan
    from workloads.study.schedule import Cell
    from workloads.study.spec import load_spec

    (tmp_path / "s.yaml").write_text(SPEC)
    out = tmp_path / "out"
    bare = make_plan(load_spec(str(tmp_path / "s.yaml"), None, str(out)))
    assert not bare.windows
    assert "window: guessing: its own window (no earlier runs to size it from)" in "\n".join(bare.lines())
    _earlier(out, np.random.default_rng(11))
    plan = make_plan(load_spec(str(tmp_path / "s.yaml"), "new", str(out)))
    (w,) = plan.spec.workloads
    n, costs = plan.windows["s"]
    assert f"load.num_requests={n}" in w.overrides and "load.points=[1,4]" in w.overrides
    # 20 s of server start against 0.15 s of requests, 30% apart: longer than the earlier 20
    assert n > 20 and 19 < costs.overhead_s < 21 and 0.13 < costs.step_s < 0.17 and 0.15 < costs.within < 0.45
    text = "\n".join(plan.lines())
    assert f"window: {n} measured requests per load point" in text and "duty cycle" in text, text
    # what every record of the study carries (a job made here: run.plan would compose each cell's config)
    why = study_run.study_field(plan.spec, study_run.Job(Cell("ib", 0, 0, 0), plan.spec.arms[0], w, ("c1", "c4")),
                                env={})["window"]
    assert why == w.window and why.startswith("chosen: run overhead") and "(one at every load point)" in why, why
    assert re.search(r"request \d+\.\d ms .*request sd \d+\.\d% over 20-request windows", why), why
    # blocks pinned (blocks:) above the plan's choice: fewer requests per point that still reach the power in them
    k = plan.spec.blocks + 2
    (tmp_path / "t.yaml").write_text(SPEC + f"blocks: {k}\n")
    fixed = make_plan(load_spec(str(tmp_path / "t.yaml"), "fixed", str(out)))
    m, _ = fixed.windows["s"]
    assert fixed.spec.blocks == k and m < n and stats.blocks_for(0.10, 1, fixed.cv_upper["s"], ALPHA) <= k
    for pin in ("load.num_requests=64", "load.duration_s=30"):
        (tmp_path / "p.yaml").write_text(SPEC.replace('"load.points=[1,4]"', f'"load.points=[1,4]", {pin}'))
        pinned = make_plan(load_spec(str(tmp_path / "p.yaml"), "pinned", str(out)))
        assert not pinned.windows and f"its own, pinned by its overrides ({pin.split('=')[0]})" in "\n".join(pinned.lines())
