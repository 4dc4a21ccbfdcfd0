"""The W&B logger's contract without a W&B server, and reading runs back from W&B.

Reading from W&B is tested at its API boundary: a fake `wandb.Api` object is injected
(no server is reachable from CI). Its runs carry exactly what the logger writes, built
with the logger's own `record_to_wandb`, so the round trip writer -> W&B layout -> reader
is checked; the fake also records the filters it was asked for. The offline logging end
to end (real wandb, real training) is in tests/analysis/test_report_e2e.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from analysis.compare import compare_table
from analysis.load import load_table, wandb_filters
from helpers.records import synthetic
from helpers.wandb_fake import FakeApi, FakeRun
from workloads.core.loggers import (
    Tracking,
    WandbLogger,
    _default_group,
    build_loggers,
    flatten,
    record_to_wandb,
    unflatten,
)


def test_read_runs_from_wandb_api_boundary():
    recs = synthetic(1.25, 0.02, 5, 3)
    recs[0]["config"]["fabric"]["env"]["HF_TOKEN"] = "hf_secret"
    api = FakeApi([FakeRun(f"r{i}", r) for i, r in enumerate(recs)])
    table = load_table([], "team/fabricbench", group="g1", tags=["fabric:a"], config={"fabric/name": "a"}, api=api)
    assert api.calls == [("team/fabricbench", {"group": "g1", "tags": {"$all": ["fabric:a"]}, "config.fabric/name": "a"})]
    assert len(table) == 10 and table.fabrics == ["a", "b"]
    assert table[0].source == "wandb://team/fabricbench/r0"
    assert table[0].record["config"]["fabric"]["env"]["HF_TOKEN"] == "<redacted>"
    assert table[0].coords["global_batch"] == 8 and table[0].metrics["samples_per_sec"] == recs[0]["metrics"]["samples_per_sec"]
    res = compare_table(table, baseline="a")
    (_, c), = res.comparisons
    assert c.lo <= 1.25 <= c.hi and c.verdict.startswith("b is faster than a by")


def test_flatten_roundtrip_and_filters():
    d = {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}
    assert flatten(d) == {"a/b": 1, "a/c/d": [1, 2], "e": None}
    assert unflatten(flatten(d)) == d
    assert wandb_filters() == {}


class Boom:
    """A wandb module whose every call fails, as with no network or a bad key."""

    Settings = staticmethod(lambda **kw: kw)

    def __init__(self):
        self.inits = 0

    def init(self, **kw):
        self.inits += 1
        raise ConnectionError("api.wandb.ai unreachable")


@pytest.fixture(autouse=True)
def _wandb_reachable_again(monkeypatch):
    """A failed W&B call turns W&B off for the rest of the process; each test is its own run."""
    from workloads.core import loggers

    monkeypatch.setattr(loggers, "_DOWN", [])


def test_failure_warns_once_and_never_raises(capsys):
    boom = Boom()
    lg = WandbLogger({"live": True}, {}, "n", "g", "pretrain", [], wandb_module=boom)
    for step in range(5):
        lg.log_step(step, {"loss": 1.0})
    lg.log_summary({"status": "ok", "metrics": {"samples_per_sec": 1.0}})
    lg.close()
    assert boom.inits == 1
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "unreachable" in err and "local record is unaffected" in err


def test_buffered_until_summary_then_sent():
    sent = []

    class Run:
        config = SimpleNamespace(update=lambda c, allow_val_change: sent.append(("config", c)))
        summary: dict = {}

        def log(self, m, step):
            sent.append(("log", step, m))

        def finish(self, exit_code=0):
            sent.append(("finish",))

    wb = SimpleNamespace(Settings=lambda **kw: kw, init=lambda **kw: sent.append(("init", kw)) or Run())
    lg = WandbLogger({}, {"config/x": 1}, "n", "g", "pretrain", ["fabric:a"], wandb_module=wb)
    lg.log_step(0, {"loss": 2.0})
    assert sent == []  # nothing touches W&B while steps are being timed
    lg.log_summary({"status": "ok", "metrics": {"samples_per_sec": 3.0, "tokens_per_sec": 9.0},
                    "fabric": {"name": "a", "env": {"NCCL_IB_HCA": "mlx5_0", "MY_API_KEY": "k"}},
                    "overrides": ["+fabric.env.MY_API_KEY=k", "train.steps=6"]})
    lg.close()
    assert [s[0] for s in sent] == ["init", "log", "config", "finish"]
    init = sent[0][1]
    assert init["mode"] == "offline" and init["group"] == "g" and init["job_type"] == "pretrain"
    config = sent[2][1]
    assert config["fabric/env/MY_API_KEY"] == "<redacted>" and config["fabric/env/NCCL_IB_HCA"] == "mlx5_0"
    assert config["overrides"] == ["+fabric.env.MY_API_KEY=<redacted>", "train.steps=6"]
    assert Run.summary["samples_per_sec"] == 3.0 and Run.summary["tokens_per_sec"] == 9.0


@pytest.mark.parametrize("rank,expect", [(0, 1), (1, 0)])
def test_build_loggers_rank0_only(rank, expect, monkeypatch):
    from omegaconf import OmegaConf

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = OmegaConf.create({"logger": {"name": "wandb", "live": False}, "workload": {"name": "pretrain"},
                            "fabric": {"name": "roce"}, "model": {"name": "neox-tiny"}, "parallel": {"name": "ddp"},
                            "train": {"micro_batch_size": 4}, "run_id": "r1"})
    info = SimpleNamespace(is_main=rank == 0, world_size=8, nodes=1)
    lgs = build_loggers(Tracking.from_config(OmegaConf.to_container(cfg)), info)
    assert len(lgs) == expect
    if expect:
        lg = lgs[0]
        assert lg.group == "pretrain-neox-tiny-ddp-ws8" and lg.name == "roce-neox-tiny-ddp-mb4-r1"
        assert lg.tags == ["fabric:roce", "model:neox-tiny", "parallel:ddp"] and lg.mode() in ("offline", "online")
    off = OmegaConf.to_container(OmegaConf.merge(cfg, {"logger": {"name": "none"}}))
    assert len(build_loggers(Tracking.from_config(off), info)) == 0


def test_collectives_and_inference_records_round_trip_through_the_wandb_layout():
    """What analysis needs from W&B for every workload: identity sections, metrics, and the
    per-size tables (busbw vs size, p2p latency) come back as they were written."""
    from workloads.core.loggers import record_from_wandb

    coll = {"workload": "collectives", "status": "ok", "collectives": {"ops": ["all_reduce"], "pattern": "all"},
            "fabric": {"name": "roce"}, "world": {"world_size": 16},
            "overrides": ["+fabric.env.HF_TOKEN=hunter2", "collectives.maxbytes=1G"],
            "metrics": {"avg_busbw(GB/s)": 180.5},
            "rows": [{"op": "all_reduce", "size": 1 << 20, "busbw": 120.0}], "p2p": [{"test": "latency", "value": 3.1}]}
    config, summary = record_to_wandb(coll)
    assert "hunter2" not in repr(config) and config["overrides"][0] == "+fabric.env.HF_TOKEN=<redacted>"
    back = record_from_wandb(config, summary, "wandb:x/y/1")
    assert back["rows"] == coll["rows"] and back["p2p"] == coll["p2p"]
    assert back["metrics"] == {"avg_busbw(GB/s)": 180.5} and back["collectives"] == coll["collectives"]

    inf = {"workload": "inference", "point": "c8", "arrival": {"kind": "closed", "concurrency": 8},
           "server": {"adapter": "vllm", "tp": 8}, "metrics": {"median_ttft_ms": 41.0}}
    back = record_from_wandb(*record_to_wandb(inf), "wandb:x/y/2")
    assert back["point"] == "c8" and back["arrival"]["concurrency"] == 8 and back["server"]["tp"] == 8
    assert back["metrics"]["median_ttft_ms"] == 41.0


def test_a_served_sweeps_wandb_names_carry_no_parallel_strategy(tmp_path):
    """Inference composes the root config, whose parallel group (ddp) measures nothing there:
    its W&B group, name and tags say parallel none, as they did from its own root before."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from workloads import CONF_DIR
    from workloads.core.rundir import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=["workload=inference", "logger=wandb", "run_id=r1", f"output_root={tmp_path}"])
    assert cfg.parallel.name == "ddp"  # composed, and not applicable
    t = Tracking.from_config(OmegaConf.to_container(cfg, resolve=True))
    assert t.parallel == "none" and t.server == "reference"
    assert _default_group(t, 2) == "inference-neox-tiny-reference-tp2"
