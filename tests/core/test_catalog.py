"""workloads/catalog.py is the one place that says what a workload is.

A workload that exists only as a package plus one catalog entry reaches the launcher's
checks, the W&B group, a study's spec and plan, the emulator's entry check and analysis'
primary metric, headline and display name. And no module keeps a second table of
workload names: one that did would disagree with the catalog sooner or later (a study's
summary once showed one metric while the verdict was called on another).
"""

from __future__ import annotations

import argparse
import ast
import sys

import pytest
from omegaconf import OmegaConf

from helpers import REPO
from workloads import catalog
from workloads.core.errors import UsageError

PACKAGE = '''
from workloads.core.errors import UsageError


def validate(cfg, world):
    if world > 2:
        raise UsageError(f"echo runs on at most 2 ranks, not {world}")
'''


@pytest.fixture
def echo(tmp_path, monkeypatch):
    """A throwaway workload: one package (its validator) and one catalog entry."""
    pkg = tmp_path / "echo_workload"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "run.py").write_text(PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    w = catalog.register(catalog.Workload(
        "echo", "Echo", "launch/echo.py", overrides=("workload=echo",), validator="echo_workload.run",
        primary=catalog.named("echoes_per_sec"), primary_text="echoes_per_sec",
        headline=("echoes_per_sec", "echo_ms"), not_applicable=("parallel",), group="echo-{model}-ws{world}",
        default_cv=0.07))
    yield w
    catalog.unregister("echo")
    sys.modules.pop("echo_workload.run", None)
    sys.modules.pop("echo_workload", None)


def test_a_registered_workload_reaches_the_launcher_and_the_logger(echo):
    from workloads.core.config import validate_job
    from workloads.core.loggers import Tracking, _default_group

    cfg = OmegaConf.create({"workload": {"name": "echo"}, "model": {"name": "neox-tiny"},
                            "parallel": {"name": "ddp"}, "fabric": {"name": "loopback"}})
    validate_job(cfg, 2)
    with pytest.raises(UsageError, match="at most 2 ranks, not 4"):
        validate_job(cfg, 4)
    assert _default_group(Tracking.from_config(OmegaConf.to_container(cfg)), 2) == "echo-neox-tiny-ws2"


def test_a_registered_workload_reaches_a_study(echo, tmp_path):
    from workloads.study.plan import make_plan
    from workloads.study.spec import load_spec

    spec_file = tmp_path / "s.yaml"
    spec_file.write_text("name: e\narms:\n  - {label: a, fabric: loopback, baseline: true}\n"
                         "  - {label: b, fabric: loopback}\n"
                         "workloads:\n  - {name: e1, entry: echo, overrides: [x=1]}\nblocks: 40\n")
    spec = load_spec(spec_file, output_root=str(tmp_path / "out"))
    w = spec.workloads[0]
    assert (w.script, w.argv) == ("launch/echo.py", ("workload=echo", "x=1"))
    text = "\n".join(make_plan(spec).lines())
    assert "e1 (echo): primary echoes_per_sec" in text and "CV 7" in text


def test_a_registered_workload_reaches_the_emulator(echo, tmp_path):
    from workloads.commands.emulate import _check_entry

    entry = tmp_path / "echo.py"
    entry.write_text("")
    args = argparse.Namespace(entry=str(entry), overrides=["fabric=emu-100m"], nproc_per_node=1)
    assert _check_entry(args) is False
    assert args.overrides == ["workload=echo", "fabric=emu-100m"]
    catalog.register(catalog.Workload("echo", "Echo", "launch/echo.py", crosses_link=False))
    with pytest.raises(UsageError, match="does not run across emulated nodes"):
        _check_entry(argparse.Namespace(entry=str(entry), overrides=[], nproc_per_node=1))


def test_a_registered_workload_reaches_analysis(echo):
    from analysis.compare import headline, primary_metric
    from analysis.load import run_from_record
    from analysis.summary import display

    names = ["echo_ms", "echoes_per_sec", "other_per_sec"]
    assert primary_metric("echo", names) == "echoes_per_sec"
    assert headline("echo", names) == ["echoes_per_sec", "echo_ms"]
    assert display("echo") == "Echo"
    r = run_from_record({"workload": "echo", "status": "ok", "metrics": {"echoes_per_sec": 5.0},
                         "config": {"parallel": {"name": "ddp"}, "model": {"name": "m"}}})
    assert r.parallel is None and r.metric("echoes_per_sec") == 5.0


def _names(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Dict):
        return [k for k in node.keys if k is not None]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return node.elts
    return []


def test_no_second_table_of_workload_names():
    """A literal holding two or more workload names (or a study's old entry words) outside the
    catalog is a second table of workloads."""
    words = set(catalog.CATALOG) | {w.old_entry for w in catalog.CATALOG.values() if w.old_entry}
    found = []
    for top in ("workloads", "analysis", "launch", "benchmarks"):
        for path in sorted((REPO / top).rglob("*.py")):
            if path == REPO / "workloads" / "catalog.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                hits = [e.value for e in _names(node) if isinstance(e, ast.Constant) and e.value in words]
                if len(hits) >= 2:
                    found.append(f"{path.relative_to(REPO)}:{node.lineno} {hits}")
    assert not found, "workload names belong in workloads/catalog.py:\n" + "\n".join(found)


def test_core_and_the_direction_rules_name_no_workload_key_or_metric():
    """A workload's keys and metrics are declared beside its code and read through the catalog:
    the config check names no workload's section, and the direction rules are unit rules."""
    import re

    from analysis.compare import DIRECTIONS

    sections = "|".join(sorted({k.split(".")[0] for k in catalog.keys()}))
    found = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "workloads" / "core").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(rf'"({sections})\.', line)]
    assert not found, found
    assert all(pattern.startswith("*") for pattern, _, _ in DIRECTIONS), DIRECTIONS
    declared = [m.name for m in catalog.metrics()]
    assert not [p for p, _, _ in DIRECTIONS if p in declared]


def test_declared_metrics_agree_where_two_workloads_match_one_name():
    by_name: dict[str, set] = {}
    for m in catalog.metrics():
        by_name.setdefault(m.name, set()).add((m.higher, m.word, m.counted))
    assert all(len(v) == 1 for v in by_name.values()), by_name
