"""Per-call samples across ranks (workloads/collectives/stability.py): worked values of the
pure definitions, and a real 2-rank Gloo run in which the test hook FABRICBENCH_TEST_SLOW_RANK
makes rank 1 arrive 40 ms late at every sampled call: the record and the printed summary must
name rank 1, and an A/A control without the hook must not. The delay is far above what a loaded
2-core box adds to a tiny Gloo call (CI once measured a 3-call headline block at 9 ms), so the
assertions hold on a busy machine as on an idle one."""

import numpy as np
import pytest

from helpers import child_env, records_in, run_entry
from helpers.collectives import settings as _settings
from workloads.collectives import stability
from workloads.collectives.settings import SLOW_RANK_ENV
from workloads.core.errors import UsageError

MS = 1e-3


def test_lateness_is_the_wait_the_others_had():
    t = np.array([[6.0, 6.0], [1.0, 2.0]])  # rank 0 waited 6 ms; rank 1 came late and spent 1-2 ms
    assert stability.lateness(t).tolist() == [[0.0, 0.0], [5.0, 4.0]]


def test_worked_values_straggler_stable_variable():
    # rank 1 arrives 5 ms late at every call: the others spend 6 ms inside, it spends 1 ms
    st = stability.size_stats({0: [6 * MS] * 4, 1: [1 * MS] * 4}, [[0, 1]], ranks_per_node=1)
    assert st["p50(us)"] == pytest.approx(6000) and st["p99(us)"] == pytest.approx(6000) and st["cv"] == 0
    assert st["latest_rank"] == 1 and st["latest_node"] == 1
    assert st["latest_median_lateness(us)"] == pytest.approx(5000)
    assert st["latest_share_of_p50"] == pytest.approx(5 / 6) and st["latest_arrived_last"] == 1.0
    assert st["verdict"] == "straggler"
    assert stability.verdict_line(st) == "straggler: rank 1 (node 1) arrives 5000 us late (83% of p50), last in 100% of calls"
    # ranks take turns arriving last: median lateness 0.5 ms = 25% of T, but last in only half the calls
    alt = stability.size_stats({0: [1 * MS, 2 * MS] * 2, 1: [2 * MS, 1 * MS] * 2}, [[0, 1]], ranks_per_node=2)
    assert alt["latest_arrived_last"] == 0.5 and alt["verdict"] == "stable" and alt["latest_node"] == 0
    # one slow call in four for everybody: T = [1, 1, 1, 3] ms
    var = stability.size_stats({0: [MS, MS, MS, 3 * MS], 1: [MS, MS, MS, 3 * MS]}, [[0, 1]], ranks_per_node=1)
    assert var["p50(us)"] == pytest.approx(1000)
    assert var["p95(us)"] == pytest.approx(2700) and var["p99(us)"] == pytest.approx(2940)  # linear interpolation
    assert var["cv"] == pytest.approx(1 / 1.5)  # std(ddof=1) = 1 ms, mean 1.5 ms
    assert var["verdict"] == "variable"


def test_lateness_is_taken_within_each_communicator():
    # one_per_node on 2 nodes x 2: groups [0, 2] and [1, 3]; rank 3 is late in its own group
    times = {0: [2 * MS] * 3, 2: [2 * MS] * 3, 1: [4 * MS] * 3, 3: [0.5 * MS] * 3}
    st = stability.size_stats(times, [[0, 2], [1, 3]], ranks_per_node=2)
    assert st["latest_rank"] == 3 and st["latest_node"] == 1 and st["samples"] == 6
    assert st["median_lateness_us_by_rank"]["0"] == 0 and st["median_lateness_us_by_rank"]["3"] == pytest.approx(3500)


def test_settings_of_the_sampling_and_its_hook():
    s = _settings()
    assert s.timing.sample_iters == 10 and s.faults.slow_rank is None
    assert _settings(env={SLOW_RANK_ENV: "1:5"}).faults.slow_rank == (1, 0.005)
    for bad in ("2:5", "1", "x:y", "1:-3"):
        with pytest.raises(UsageError, match=SLOW_RANK_ENV):
            _settings(env={SLOW_RANK_ENV: bad})


SMALL = ["collectives.minbytes=1K", "collectives.maxbytes=8K", "collectives.stepfactor=8", "collectives.iters=3",
         "collectives.warmup_iters=1", "collectives.sample_iters=8", "launcher.nproc_per_node=2"]
DELAY_MS = 40
HALF_US = DELAY_MS * 1000 / 2


@pytest.mark.slow
def test_slow_rank_is_named_and_the_control_is_not(tmp_path):
    runs = {}
    for label, hook in [("slow", {SLOW_RANK_ENV: f"1:{DELAY_MS}"}), ("control", {})]:
        r = run_entry("collectives.py", f"output_root={tmp_path / label}", *SMALL, env=child_env(**hook), timeout=400)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        (rec,) = records_in(tmp_path / label)
        runs[label] = (r.stdout, rec)
    out, rec = runs["slow"]
    assert rec["collectives"]["test_hooks"]["slow_rank"] == [1, DELAY_MS * MS] and "test_hooks" not in runs["control"][1]["collectives"]
    for row in rec["rows"]:
        st = row["stability"]
        assert st["samples"] == 8 and st["verdict"] == "straggler" and st["latest_rank"] == 1, st
        assert set(st["times_us_by_rank"]) == {"0", "1"} and len(st["times_us_by_rank"]["1"]) == 8
        # rank 0 waits ~40 ms in every sampled call; rank 1, which slept first, hardly at all
        assert st["median_lateness_us_by_rank"]["1"] > HALF_US > st["median_lateness_us_by_rank"]["0"]
        # the headline block never sleeps: far below the sampled calls that waited for rank 1
        assert row["in_place"]["time_us"] < st["p50(us)"]
    assert out.count("straggler: rank 1 (node 0)") == len(rec["rows"]), out[-2000:]
    _, control = runs["control"]
    for row in control["rows"]:
        st = row["stability"]
        # the A/A control may see a rank arrive last by chance, but never by half the injected delay
        assert st["verdict"] != "straggler" or st["latest_median_lateness(us)"] < HALF_US, st
