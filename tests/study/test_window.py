"""The measured window a study's plan chooses (`window: auto`, workloads/study/window.py): the
formulas with worked values, the choice against every other window, what the earlier runs say,
and, by simulation through the verdict code, that the chosen window and blocks keep the power
the plan prints and the false-call rate at alpha."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from analysis import stats
from helpers.binomial import at_least, at_most
from workloads.study.window import Costs, choose, costs_from, run_seconds, shortest, step_costs

ALPHA = 0.05
# A training run of the emulated study in docs/studies.md: 10 s outside a window of 80 ms
# steps, 2% between runs, 20% between steps.
C = Costs(overhead_s=10.0, step_s=0.08, between=0.02, within=0.20, steps_before=15)


def test_costs_worked_values():
    # n* = sqrt(sw^2 O / (sb^2 t)) = sqrt(0.04 x 10 / (0.0004 x 0.08)) = sqrt(12500)
    assert C.unconstrained() == pytest.approx(111.803, abs=1e-3)
    # CV(112)^2 = 0.02^2 + 0.2^2/112 = 0.0004 + 0.000357143
    assert C.cv(112) == pytest.approx(math.sqrt(0.000757143), rel=1e-6)
    assert C.run_s(112) == pytest.approx(18.96)
    assert C.duty(112) == pytest.approx(8.96 / 18.96)
    assert C.cv(15) == pytest.approx(math.sqrt(0.0004 + 0.04 / 15))


def test_choice_is_the_least_wall_time_of_every_window():
    """The chosen (steps, blocks) costs no more wall time than any window from 5 to 2000 steps
    (within the 5% grid above 50 steps), and says its blocks and duty cycle as computed."""
    ch = choose(C, detect=0.10, tests=1, alpha=ALPHA, arms=2)
    assert ch is not None
    assert ch.blocks == stats.blocks_for(0.10, 1, C.cv(ch.steps), ALPHA)
    assert ch.wall_s == pytest.approx(ch.blocks * 2 * C.run_s(ch.steps))
    assert ch.duty == pytest.approx(C.duty(ch.steps))
    every = min(stats.blocks_for(0.10, 1, C.cv(n), ALPHA) * 2 * C.run_s(n) for n in [*range(5, 300), 400, 800, 2000])
    assert ch.wall_s <= every * 1.05
    # the fixed 15-step window of today's studies costs more for the same power
    k15 = stats.blocks_for(0.10, 1, C.cv(15), ALPHA)
    assert ch.wall_s < k15 * 2 * C.run_s(15)


@pytest.mark.parametrize("overhead,between,within,measured,steps", [
    (10.0, 0.02, 0.20, 15, 70),   # start-up dominates and steps are noisy: measure longer
    (0.5, 0.05, 0.02, 5, 5),      # cheap runs, quiet steps, noisy runs: more, shorter runs (earlier runs measured 5)
    (0.5, 0.05, 0.02, 15, 15),    # the same costs measured at 15 steps: never shorter than the window measured
])
def test_window_moves_the_way_the_costs_say(overhead, between, within, measured, steps):
    """Longer where start-up is dear, shorter where runs are cheap, and never shorter than the
    window the earlier runs measured: below it CV(n) is extrapolated, and there it failed
    (window.floor: 5 steps cut from 15 varied 3x what the model said)."""
    c = Costs(overhead, 0.08, between, within, measured)
    ch = choose(c, detect=0.10, tests=1, alpha=ALPHA, arms=2)
    assert ch.steps == steps
    assert shortest(c, 200, 0.10, 1, ALPHA) == measured  # pinned blocks to spare: still the window measured


def test_shortest_window_for_pinned_blocks():
    """Blocks pinned (the user's `blocks:`): the fewest steps that still call the difference in them."""
    ch = choose(C, 0.10, 1, ALPHA, 2)
    n = shortest(C, ch.blocks + 2, 0.10, 1, ALPHA)
    assert n < ch.steps
    assert stats.blocks_for(0.10, 1, C.cv(n), ALPHA) <= ch.blocks + 2 < stats.blocks_for(0.10, 1, C.cv(n - 1), ALPHA)
    assert shortest(Costs(10, 0.08, 0.5, 0.2, 15), 3, 0.01, 1, ALPHA) is None


def test_upper_limit_and_unreachable():
    """Blocks are counted on the CV's upper limit; a difference no window can call is None."""
    plain = choose(C, 0.10, 1, ALPHA, 2)
    wary = choose(C, 0.10, 1, ALPHA, 2, upper_ratio=1.6)
    assert wary.blocks >= plain.blocks and wary.wall_s > plain.wall_s
    assert choose(Costs(10, 0.08, 0.5, 0.2, 15), 0.01, 1, ALPHA, 2) is None


def _rec(times, warmup=2, workload="w"):
    return {"status": "ok", "study": {"workload": workload},
            "samples": {"step_time_s": [0.5] * warmup + times, "warmup_steps": warmup}}


def test_step_costs_worked_values():
    """Ten measured steps, five of 0.1 s then five of 0.2 s, in batches of two: batch means of the
    logs a, a, (a+b)/2, b, b about (a+b)/2 give sd^2 = (b-a)^2 / 4 and sw^2 = 2 x that = (b-a)^2/2."""
    a, b = math.log(0.1), math.log(0.2)
    t, sw, n, overhead = step_costs([_rec([0.1] * 5 + [0.2] * 5)], [5.0, 6.0, 7.0])
    assert t == pytest.approx(0.15)
    assert sw == pytest.approx(math.sqrt((b - a) ** 2 / 2))
    assert n == 10
    assert overhead == pytest.approx(6.0 - 1.5)  # the median run less the measured 1.5 s
    c = costs_from([_rec([0.1] * 5 + [0.2] * 5)], [5.0, 6.0, 7.0], block_cv=0.2)
    assert c.between == pytest.approx(math.sqrt(0.04 - (b - a) ** 2 / 2 / 10))
    assert costs_from([_rec([0.1] * 5 + [0.2] * 5)], [6.0], block_cv=0.01).between == 0.005  # the floor
    assert step_costs([_rec([0.1] * 4)], [6.0]) is None  # too few steps for five batches
    assert costs_from([_rec([0.1] * 10)], [6.0], block_cv=None) is None


def test_run_seconds_reads_ok_runs_of_the_workload(tmp_path):
    (tmp_path / "timings.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"workload": "w", "arm": "a", "seconds": 8.0, "ok": True},
        {"workload": "w", "arm": "b", "seconds": 9.0, "ok": False},
        {"workload": "v", "arm": "a", "seconds": 1.0, "ok": True}]) + "\nnot json\n")
    assert run_seconds(tmp_path, {"w"}) == [8.0]
    assert run_seconds(tmp_path / "nowhere", {"w"}) == []


def _simulate(c: Costs, n: int, k: int, effect: float, rng, studies: int) -> float:
    """Fraction of `studies` simulated studies whose verdict (stats.compare over the k blocks' log
    ratios) is significant: each run's log metric is its arm's truth, a between-run draw and the
    mean of n step draws."""
    calls = 0
    for _ in range(studies):
        run = lambda: rng.normal(0, c.between) + rng.normal(0, c.within, n).mean()  # noqa: E731
        d = np.array([effect + run() - run() for _ in range(k)])
        cmp = stats.compare([1.0] * k, [1.0] * k, "b", "a", "samples_per_sec", design=stats.Design(blocks=d, name="abba"))
        calls += bool(cmp.significant)
    return calls / studies


def test_chosen_window_keeps_the_printed_power_and_alpha():
    """At the plan's choice, the MDE it prints (at the estimate) is called 75-85% of the time,
    and two equal arms are called different at most alpha (binomial slack) of the time."""
    ch = choose(C, detect=0.10, tests=1, alpha=ALPHA, arms=2)
    mde = math.log1p(stats.plan_mde(ch.blocks, 1, C.cv(ch.steps), ALPHA))
    rng = np.random.default_rng(48)
    power = _simulate(C, ch.steps, ch.blocks, mde, rng, 500)
    assert 0.75 <= power <= 0.85, power
    false = _simulate(C, ch.steps, ch.blocks, 0.0, rng, 500)
    assert false <= ALPHA + 0.03, false


SPEC = """name: sized
arms:
  - {label: ib, fabric: loopback, baseline: true}
  - {label: roce, fabric: loopback, overrides: [parallel.bucket_cap_mb=1]}
workloads:
  - {name: t, entry: pretrain}
detect: 10%
window: auto
"""


def _earlier(root, rng, blocks=8, steps=15, warmup=2, name="old"):
    """An earlier study `old` of workload t (train) under `root`: each run 10 s outside a window of
    `steps` steps of ~80 ms (2% between runs, 20% between steps), its records and timings.jsonl."""
    from helpers.records import train_record
    from workloads.core.records import write_record

    folder = root / name
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"id": name, "workloads": [{"name": "t", "entry": "train", "overrides": []}],
                                                   "arms": [{"label": "ib", "fabric": "loopback"},
                                                            {"label": "roce", "fabric": "loopback"}]}))
    timings = []
    for b in range(blocks):
        for arm in ("ib", "roce"):
            times = list(0.08 * np.exp(rng.normal(0, 0.02) + rng.normal(0, 0.2, steps)))
            rec = train_record(arm, 8 / float(np.mean(times)), trial=b, run_id=f"{arm}-{b}")
            rec["study"] = {"id": name, "arm": arm, "block": b, "workload": "t", "design": "abba"}
            rec["samples"] = {"step_time_s": [0.3] * warmup + times, "warmup_steps": warmup}
            write_record(folder / f"{arm}-{b}" / "records", rec, "r")
            timings.append({"workload": "t", "arm": arm, "seconds": 10 + sum(times), "ok": True})
    (folder / "timings.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timings))


def test_plan_sizes_the_window_from_earlier_runs_and_a_rerun_keeps_it(tmp_path):
    """`window: auto` with an earlier study of the workload: the plan chooses the steps (an
    override of train.steps, warm-up included), prints the window, the duty cycle and the wall
    time, and the records' study block says why; a rerun of the same study keeps the window its
    manifest holds even when the earlier runs would now say otherwise. Without earlier runs it
    says that it is not sizing, and why."""
    from workloads.study import run as study_run
    from workloads.study.plan import make_plan
    from workloads.study.spec import load_spec

    (tmp_path / "sized.yaml").write_text(SPEC)
    out = tmp_path / "out"
    spec = load_spec(str(tmp_path / "sized.yaml"), None, str(out))
    bare = make_plan(spec)
    assert not bare.windows and "no earlier runs" in "\n".join(bare.lines())
    _earlier(out, np.random.default_rng(5))
    plan = make_plan(load_spec(str(tmp_path / "sized.yaml"), None, str(out)))
    (w,) = plan.spec.workloads
    n, costs = plan.windows["t"]
    assert f"train.steps={n + 2}" in w.overrides and n > 15  # 10 s of start-up against 80 ms steps: longer
    assert 0.05 < costs.within < 0.4 and 9 < costs.overhead_s < 11 and 0.07 < costs.step_s < 0.09
    text = "\n".join(plan.lines())
    assert f"window: {n} measured steps per run" in text and "duty cycle" in text and "wall time: about" in text
    # the MDE at the blocks' own CV: the 80% upper limit of CV(n) at the chosen window, and at the estimate
    up = plan.cv_upper["t"]
    assert up == pytest.approx(costs.cv_up(n)) and up > costs.cv(n)
    mde = stats.plan_mde(plan.spec.blocks, 1, up, ALPHA)
    assert (f"at this window CV {stats.pct(costs.cv(n))}, its 80% upper limit {stats.pct(up)}: can call >= "
            f"{stats.pct(mde)} in {plan.spec.blocks} blocks with 80% power") in text, text
    assert study_run.study_field(plan.spec, _job(plan.spec), env={})["window"].startswith("chosen: run overhead")
    study_run._manifest(plan.spec)
    _earlier(out, np.random.default_rng(6), steps=60, name="newer")  # new evidence: a rerun must not move the window
    fresh = make_plan(load_spec(str(tmp_path / "sized.yaml"), None, str(out)).__class__(
        **{**load_spec(str(tmp_path / "sized.yaml"), None, str(out)).__dict__, "id": "other"}))
    assert fresh.windows["t"][1] != costs  # ... which a new study would use
    again = make_plan(load_spec(str(tmp_path / "sized.yaml"), None, str(out)))
    assert again.spec.workloads[0].overrides == w.overrides


def _job(spec):
    """The study's first job, made here: run.plan would compose and validate each cell's config
    (a torch import, ~5-20 s on a loaded host) to say what the records' study block says."""
    from workloads.study.run import Job
    from workloads.study.schedule import Cell

    return Job(Cell(spec.arms[0].label, 0, 0, 0), spec.arms[0], spec.workloads[0], ("",))


def test_window_field_is_checked(tmp_path):
    from workloads.core.errors import UsageError
    from workloads.study.spec import load_spec

    (tmp_path / "s.yaml").write_text(SPEC.replace("window: auto", "window: sometimes"))
    with pytest.raises(UsageError, match="window='sometimes': use auto"):
        load_spec(str(tmp_path / "s.yaml"))


# --- collectives: the window is collectives.iters (workloads/study/iterations.py) ---

# The all_reduce of the emulated study in issue 48: a run of 8.1 s with 0.55 s measured in 20
# iterations (27.5 ms each: one call of every size and placement), so O = 7.55 s.
CC = Costs(overhead_s=7.55, step_s=0.0275, between=0.02, within=0.10, steps_before=20)


@pytest.mark.parametrize("costs,detect,iters,blocks,wall,blocks_at_20", [
    (CC, 0.05, 62, 8, 148.08, 11),                                # n* = sqrt(0.01 x 7.55 / (0.0004 x 0.0275)) = 82.8
    (Costs(7.55, 0.0275, 0.02, 0.30, 20), 0.10, 102, 6, 124.26, 15),  # noisy calls: longer still
    (Costs(0.5, 0.0275, 0.05, 0.02, 5), 0.10, 5, 9, 11.475, 9),   # cheap runs, quiet calls, measured at 5: the shortest
    (Costs(0.5, 0.0275, 0.05, 0.02, 20), 0.10, 20, 9, 18.9, 9),   # the same measured at 20: not below it (window.floor)
])
def test_collectives_window_worked_values(costs, detect, iters, blocks, wall, blocks_at_20):
    """(O, t, sigma_b, sigma_w) -> iterations and blocks over a study's 3 primary verdicts (two
    arms): the least wall time of every window from the one measured to 2000 iterations, against the 20 of
    conf/workload/collectives.yaml."""
    ch = choose(costs, detect=detect, tests=3, alpha=ALPHA, arms=2)
    assert (ch.steps, ch.blocks) == (iters, blocks)
    assert ch.wall_s == pytest.approx(wall) == blocks * 2 * (costs.overhead_s + iters * costs.step_s)
    assert ch.cv == pytest.approx(math.sqrt(costs.between ** 2 + costs.within ** 2 / iters))
    assert stats.blocks_for(detect, 3, costs.cv(20), ALPHA) == blocks_at_20
    every = min(stats.blocks_for(detect, 3, costs.cv(n), ALPHA) * 2 * costs.run_s(n)
                for n in range(max(5, costs.steps_before), 2001) if stats.blocks_for(detect, 3, costs.cv(n), ALPHA))
    assert ch.wall_s <= every * 1.05


def _coll_rec(times_4m, cells_us, iters=20, busbw=1.0):
    """A collectives record of all_reduce at 1 MiB and 4 MiB, both placements: `cells_us` the four
    cells' block times (1M oop, 1M ip, 4M oop, 4M ip), `times_4m` rank 0's per-call samples at
    4 MiB (rank 1 spends 1 us less in each: rank 0 is the call's duration)."""
    def cell(us):
        return {"time_us": us, "busbw": busbw, "algbw": busbw, "wrong": 0}

    stab = {"samples": len(times_4m), "times_us_by_rank": {"0": [x * 1e6 for x in times_4m],
                                                           "1": [x * 1e6 - 1 for x in times_4m]}}
    return {"workload": "collectives", "status": "ok", "config": {"collectives": {"iters": iters}},
            "rows": [{"op": "all_reduce", "size": 1 << 20, "out_of_place": cell(cells_us[0]), "in_place": cell(cells_us[1])},
                     {"op": "all_reduce", "size": 1 << 22, "out_of_place": cell(cells_us[2]), "in_place": cell(cells_us[3]),
                      "stability": stab}]}


def test_iterations_worked_values():
    """t = the sum of every timed cell (one iteration of the sweep), the window iters x t, and
    sigma_w^2 per iteration = the calls' batch variance over the row's two placements: calls of 4
    and 8 ms, five then five, in batches of two give (ln 2)^2 / 2 per call, / 2 placements."""
    from workloads.study.iterations import iterations_of, primary_row

    rec = _coll_rec([0.004] * 5 + [0.008] * 5, [1000, 1100, 4000, 4200])
    m = iterations_of(rec, "all_reduce/busbw@4194304(GB/s)")
    assert m.step_s == pytest.approx(0.0103) and m.window_s == pytest.approx(0.206) and m.steps == 20
    assert m.within2 == pytest.approx(math.log(2) ** 2 / 4)
    assert primary_row(rec["rows"], "all_reduce/busbw@1048576(GB/s)")["size"] == 1 << 20
    # an op's average over two sizes is no one row's; over one size it is that row's
    assert iterations_of(rec, "all_reduce/avg_busbw(GB/s)") is None
    one = {**rec, "rows": rec["rows"][1:]}
    assert iterations_of(one, "all_reduce/avg_busbw(GB/s)").within2 == pytest.approx(math.log(2) ** 2 / 4)
    # too few per-call samples (collectives.sample_iters=4), or none at that size: no window from them
    assert iterations_of(_coll_rec([0.004] * 4, [1000, 1100, 4000, 4200]), "all_reduce/busbw@4194304(GB/s)") is None
    assert iterations_of(rec, "all_reduce/busbw@1048576(GB/s)") is None
    c = costs_from([rec], [5.206, 6.206], block_cv=0.2, read=lambda r: iterations_of(r, "all_reduce/busbw@4194304(GB/s)"))
    assert c.overhead_s == pytest.approx(5.706 - 0.206) and c.step_s == pytest.approx(0.0103)
    assert c.between == pytest.approx(math.sqrt(0.04 - math.log(2) ** 2 / 4 / 20))


COLL_SPEC = SPEC.replace("{name: t, entry: pretrain}", "{name: ar, entry: collectives}")


def _earlier_collectives(root, rng, blocks=8, iters=20):
    """An earlier study of workload ar (collectives) under `root`: runs 6 s outside a window of
    `iters` iterations of 8, 8, 32, 32 ms cells (2% between runs, calls 30% apart), records and timings."""
    from workloads.core.records import write_record

    folder = root / "old"
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"id": "old", "workloads": [{"name": "ar", "entry": "collectives",
                                                                               "overrides": []}],
                                                   "arms": [{"label": "ib", "fabric": "loopback"},
                                                            {"label": "roce", "fabric": "loopback"}]}))
    timings = []
    for b in range(blocks):
        for arm in ("ib", "roce"):
            shift = rng.normal(0, 0.02)
            cells = [base * float(np.exp(shift + rng.normal(0, 0.3, iters)).mean()) for base in (8000, 8000, 32000, 32000)]
            rec = _coll_rec(list(0.032 * np.exp(shift + rng.normal(0, 0.3, 10))), cells, iters=iters)
            for row, (a, c) in zip(rec["rows"], ((0, 1), (2, 3))):
                row["out_of_place"]["busbw"], row["in_place"]["busbw"] = row["size"] / cells[a], row["size"] / cells[c]
            rec |= {"run_id": f"{arm}-{b}", "fabric": {"name": "loopback"}, "world": {"world_size": 2, "nodes": 1},
                    "study": {"id": "old", "arm": arm, "block": b, "workload": "ar", "design": "abba"}}
            write_record(folder / f"{arm}-{b}" / "records", rec, "r")
            timings.append({"workload": "ar", "arm": arm, "seconds": 6 + iters * sum(cells) * 1e-6, "ok": True})
    (folder / "timings.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timings))


def test_plan_sizes_collectives_iterations_and_says_when_it_guesses(tmp_path):
    """`window: auto` for collectives: without earlier runs the plan says it is guessing, in its
    line and in the records' study.window, and a rerun of that study keeps the guess; with an
    earlier study a new study chooses collectives.iters (the measured iterations alone: the
    warm-up is collectives.warmup_iters) and says why."""
    from workloads.study import run as study_run
    from workloads.study.plan import make_plan
    from workloads.study.spec import load_spec

    (tmp_path / "ar.yaml").write_text(COLL_SPEC)
    out = tmp_path / "out"
    bare = make_plan(load_spec(str(tmp_path / "ar.yaml"), None, str(out)))
    text = "\n".join(bare.lines())
    assert not bare.windows and "window: guessing: its own window (no earlier runs to size it from)" in text, text
    assert study_run.study_field(bare.spec, _job(bare.spec), env={})["window"].startswith("guessing: its own window")
    study_run._manifest(bare.spec)  # its first attempt ran (and wrote its definition) ...
    _earlier_collectives(out, np.random.default_rng(7))
    again = make_plan(load_spec(str(tmp_path / "ar.yaml"), None, str(out)))
    assert again.spec.workloads == bare.spec.workloads  # ... so a rerun keeps the guess its first blocks measured
    study_run._manifest(again.spec)  # (not refused as another definition)
    plan = make_plan(load_spec(str(tmp_path / "ar.yaml"), "new", str(out)))  # a new study sizes it
    (w,) = plan.spec.workloads
    n, costs = plan.windows["ar"]
    assert f"collectives.iters={n}" in w.overrides and n > 20  # 6 s of start-up against 80 ms iterations
    assert 5.5 < costs.overhead_s < 6.5 and 0.07 < costs.step_s < 0.09 and 0.12 < costs.within < 0.32
    text = "\n".join(plan.lines())
    assert f"window: {n} measured iterations per run" in text and "duty cycle" in text, text
    why = study_run.study_field(plan.spec, _job(plan.spec), env={})["window"]
    assert why.startswith("chosen: run overhead") and re.search(r"iteration \d+\.\d ms", why), why
    assert "(one call of every op, size and placement)" in why and "iteration sd" in why, why


def _plan_end_to_end(rng, sb: float, sw: float, n0: int, blocks0: int = 8, t: float = 0.08, o: float = 10.0):
    """One plan as `window: auto` makes it, from a simulated earlier A/A study (`blocks0` blocks x 2
    arms of n0 steps; true sigma_b `sb`, sigma_w `sw`, a block drift shared by both arms): sigma_w
    by batch_var and summarize over the runs' steps, the block CV as plan.measured_cv computes it
    (sd(d)/sqrt(2), its 80% upper limit on blocks0 - 1 df), costs_from, choose, shortest; returns
    (steps, blocks, the MDE printed at the upper limit)."""
    from workloads.study.plan import _upper
    from workloads.study.window import steps_of

    records, seconds, logs = [], [], []
    for _ in range(blocks0):
        drift = rng.normal(0, 0.05)
        pair = []
        for _arm in range(2):
            times = t * np.exp(drift + rng.normal(0, sb) + rng.normal(0, sw, n0))
            records.append({"samples": {"step_time_s": list(times), "warmup_steps": 0}})
            seconds.append(o + float(times.sum()))
            pair.append(-math.log(times.mean()))
        logs.append(pair[0] - pair[1])
    cv = float(np.std(logs, ddof=1)) / math.sqrt(2)
    c = costs_from(records, seconds, cv, steps_of, _upper(cv, blocks0 - 1))
    assert steps_of(records[0]).steps == n0
    ch = choose(c, 0.10, 1, ALPHA, 2)
    n = shortest(c, ch.blocks, 0.10, 1, ALPHA) or ch.steps
    return n, ch.blocks, stats.plan_mde(ch.blocks, 1, c.sized(n), ALPHA)


@pytest.mark.parametrize("sb,sw,n0,seed", [(0.02, 0.20, 15, 5721), (0.03, 0.15, 10, 5722)])
def test_the_printed_mde_is_called_80_percent_end_to_end(sb, sw, n0, seed):
    """The whole pipeline, not the true costs: each plan estimates its noise from an earlier study
    (sigma_b a difference of two estimates, the window lengthened exactly where sigma_b looks
    small), prints the MDE at CV(n)'s 80% upper limit, and a new study at its (steps, blocks),
    drawn from the true noise with the printed MDE as the true effect, calls it in >= 80% of plans
    (at the estimate it was 77% and 70% in these two cases); two equal arms at most alpha."""
    rng = np.random.default_rng(seed)
    plans, called, false = 300, 0, 0
    truth = Costs(10.0, 0.08, sb, sw, n0)
    for _ in range(plans):
        n, k, mde = _plan_end_to_end(rng, sb, sw, n0)
        for effect, is_null in ((math.log1p(mde), False), (0.0, True)):
            run = lambda: rng.normal(0, truth.between) + rng.normal(0, truth.within, n).mean()  # noqa: E731
            d = np.array([effect + run() - run() for _ in range(k)])
            cmp = stats.compare([1.0] * k, [1.0] * k, "b", "a", "samples_per_sec",
                                design=stats.Design(blocks=d, name="abba"))
            if is_null:
                false += bool(cmp.significant)
            else:
                called += bool(cmp.significant and cmp.speedup > 1)
    assert at_least(called, plans, 0.80), called
    assert at_most(false, plans, ALPHA), false
