"""Adding a workload is its own package, a launch script, a YAML and one catalog entry.

The throwaway workload here lives entirely outside the repository (tmp_path, on PYTHONPATH
and Hydra's search path): a package that registers itself and declares one typed key and one
metric (declare.py), a launch script, conf/workload/toy.yaml. Its runs go through the real
entry (Hydra, self-launch, one gloo rank, the record written by session.run_point); the
config check refuses a bad value of its key, and `fabricbench compare` judges its records
on its metric, whose direction only its declaration gives. Nothing under workloads/core,
analysis/, tests/core or tests/config names it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO
from workloads import catalog

INIT = '''
from workloads import catalog

catalog.register(catalog.Workload(
    "toy", "Toy", "toy_launch.py", overrides=("workload=toy",), validator="fbtoy.run", declares="fbtoy.declare",
    primary=catalog.named("toy_score"), primary_text="toy_score", headline=("toy_score",),
    not_applicable=("model", "parallel"), group="toy-ws{world}"))
'''

DECLARE = '''
from workloads.catalog import Metric
from workloads.core.schema import COUNT

KEYS = {"toy.size": COUNT}
METRICS = (Metric("toy_score", "sums/s", True, "faster"),)   # no unit suffix: only this says which way is better
'''

RUN = '''
import time
from dataclasses import dataclass

from workloads import session
from workloads.core import dist as fdist
from workloads.fabric.profile import FabricProfile


@dataclass(frozen=True)
class ToyPlan:
    size: int
    fabric: FabricProfile
    run: session.RunContext


def validate(cfg, world):
    return ToyPlan(int(session.section(cfg, "toy")["size"]), session.prepare(cfg), session.context(cfg))


def run_toy(cfg, overrides):
    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    info, run_dir, env = session.start(plan.run, plan.fabric)
    record = session.base_record("toy", plan.run, plan.fabric, env, run_dir.name, overrides,
                                 world={"world_size": info.world_size}, metrics={}, samples={})

    def measure():
        t0 = time.perf_counter()
        sum(range(plan.size))
        record["metrics"] = {"toy_score": 1 / (time.perf_counter() - t0)}

    session.run_point(session.Point(record, run_dir / "records", f"toy-{plan.fabric.name}", info), measure,
                      plan.run.tracking)
'''

LAUNCH = '''
import sys
sys.path.insert(0, {repo!r})

import fbtoy  # registers the workload


def run(cfg, overrides):
    from fbtoy.run import run_toy

    run_toy(cfg, overrides)


if __name__ == "__main__":
    from workloads.commands.entry import hydra_entry

    hydra_entry(__file__, run, workload="toy")
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "fbtoy"
    pkg.mkdir()
    for name, text in (("__init__.py", INIT), ("declare.py", DECLARE), ("run.py", RUN)):
        (pkg / name).write_text(text)
    (tmp_path / "toy_launch.py").write_text(LAUNCH.format(repo=str(REPO)))
    (tmp_path / "conf" / "workload").mkdir(parents=True)
    (tmp_path / "conf" / "fabric").mkdir()
    (tmp_path / "conf" / "workload" / "toy.yaml").write_text("# @package _global_\nworkload:\n  name: toy\n"
                                                              "toy:\n  size: 200000\n")
    # a second arm on the same wire: an A/A pair, which the verdict must not call different
    (tmp_path / "conf" / "fabric" / "lo-b.yaml").write_text(
        (REPO / "conf" / "fabric" / "loopback.yaml").read_text().replace("name: loopback", "name: lo-b"))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    catalog.unregister("toy")
    for m in ("fbtoy.declare", "fbtoy.run", "fbtoy"):
        sys.modules.pop(m, None)


def _launch(root, *overrides):
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO}", OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    return subprocess.run([sys.executable, str(root / "toy_launch.py"), f"hydra.searchpath=[file://{root / 'conf'}]",
                           "launcher.nproc_per_node=1", f"output_root={root / 'res'}", *overrides],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_its_key_is_type_checked_by_the_config_check(toy):
    import fbtoy  # noqa: F401  (registers it)
    from omegaconf import OmegaConf

    from workloads.core import schema
    from workloads.core.errors import UsageError

    schema.check(OmegaConf.create({"toy": {"size": 3}}))
    with pytest.raises(UsageError, match=r"toy.size must be a positive integer, got 1.5"):
        schema.check(OmegaConf.create({"toy": {"size": 1.5}}))


@pytest.mark.slow
def test_a_workload_outside_the_repository_runs_and_is_judged_on_its_metric(toy, capsys):
    from workloads.commands.cli import main as cli_main

    for trial in range(2):
        for fabric in ("loopback", "lo-b"):
            p = _launch(toy, f"fabric={fabric}", f"trial={trial}", f"run_id={fabric}-{trial}")
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    recs = [json.loads(f.read_text()) for f in sorted((toy / "res").rglob("records/*.json"))]
    assert len(recs) == 4 and all(r["workload"] == "toy" and r["status"] == "ok" for r in recs)
    assert all(r["config"]["toy"] == {"size": 200000} and r["metrics"]["toy_score"] > 0 for r in recs)

    import fbtoy  # noqa: F401  (this process's catalog learns the workload as the launch script's did)

    assert cli_main(["compare", str(toy / "res"), "--baseline", "loopback", "--json", str(toy / "v.json")]) == 0
    assert "toy_score" in capsys.readouterr().out
    (v,) = json.loads((toy / "v.json").read_text())["verdicts"]
    assert (v["workload"], v["metric"], v["baseline"], v["other"], v["n"], v["n_base"]) == \
        ("toy", "toy_score", "loopback", "lo-b", 2, 2)
    assert v["primary"] and "faster" in v["verdict"], v  # the declaration's word; higher is better
