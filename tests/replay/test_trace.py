"""The replay workload's trace reader (workloads/replay/trace.py): a training record's collectives
and a real Flight Recorder dump (tests/fixtures/flight_recorder/), and the bad input it names."""

from __future__ import annotations

import json

import pytest

from helpers import FIXTURES
from workloads.core.errors import UsageError
from workloads.replay.trace import load, union_s

FR = FIXTURES / "flight_recorder" / "gloo_torch2.15_rank0.json"


def _training(tmp_path, calls, comm=(0.1, 0.2, 0.3), step=(0.5, 0.6, 0.7)):
    rec = {"workload": "pretrain", "world": {"world_size": 2},
           "samples": {"comm_calls": calls, "warmup_steps": 1, "comm_time_s": list(comm), "step_time_s": list(step)}}
    p = tmp_path / "rec.json"
    p.write_text(json.dumps(rec))
    return p


def test_a_training_record_trace(tmp_path):
    calls = [[["all_reduce", "float32", 1000, 2, 0.01, 0.05], ["all_reduce", "float32", 500, 2, 0.03, 0.06]],
             [["all_reduce", "float32", 1000, 2, 0.02, 0.04], ["barrier", None, 0, 2, 0.05, 0.06]]]
    t = load(_training(tmp_path, calls))
    assert t.source == "record" and t.world == 2 and len(t.steps) == 2
    assert [c.numel for c in t.steps[0]] == [1000, 500] and len(t.steps[1]) == 1   # a barrier carries nothing
    assert t.comm_time_s == (0.2, 0.3)                                             # the steps after warm-up
    assert t.bytes_per_step == (1000 + 500 + 1000) * 4 / 2
    # in flight: [0.01, 0.06] -> 0.05 s (the two calls overlap)
    assert union_s(t.steps[0]) == pytest.approx(0.05)


def test_a_real_flight_recorder_dump():
    t = load(FR)
    assert t.source == "flight-recorder" and t.world == 2 and len(t.steps) == 1
    ops = [(c.op, c.dtype, c.numel) for c in t.steps[0]]
    assert ops == [("all_reduce", "float32", 231168), ("all_reduce", "float32", 1024),
                   ("all_reduce", "float32", 4096), ("all_gather", "float32", 512)]
    starts = [c.start_s for c in t.steps[0]]
    assert starts[0] == 0 and starts == sorted(starts) and all(c.end_s is None for c in t.steps[0])
    assert t.comm_time_s is None


def test_bad_traces_are_named(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(UsageError, match="not JSON"):
        load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"workload": "collectives", "rows": []}))
    with pytest.raises(UsageError, match="neither a fabricbench training record"):
        load(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({"samples": {"step_time_s": [1.0]}}))
    with pytest.raises(UsageError, match="holds no collectives trace"):
        load(tmp_path / "z.json")
    with pytest.raises(UsageError, match="no collective replay can run"):
        load(_training(tmp_path, [[["barrier", None, 0, 2, 0.0, 0.1]]]))


def test_no_flight_recorder_dump_unless_asked(tmp_path, monkeypatch):
    from workloads.training.commtimer import dump_flight_recorder

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    assert dump_flight_recorder(tmp_path / "fr", 0) is None and not (tmp_path / "fr").exists()
