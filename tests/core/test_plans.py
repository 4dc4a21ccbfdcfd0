"""Plans all the way down: the Hydra config stops at a workload's entry and its validator.

What travels below them is the finished plan and its run context (session.RunContext), so a
function that takes a `DictConfig` anywhere else is a second reader of the raw config, and
the two can disagree. This walks the annotations of the modules already converted; a
workload joins ENTRIES when its own plan is finished.
"""

from __future__ import annotations

import ast

from helpers import REPO

# module -> the functions that may take the raw config: the entry, what checks and plans it
ENTRIES = {
    "workloads/session.py": {"prepare", "context", "section"},
    "workloads/core/loggers.py": set(),
    "workloads/core/records.py": set(),
    "workloads/collectives/run.py": {"validate", "run_collectives"},
    **{f"workloads/collectives/{m}.py": set() for m in ("settings", "harness", "ops", "p2p", "nccltests", "stability")},
    # validate's helpers read the sections they check; run_training only hands cfg to validate
    "workloads/training/run.py": {"validate", "model_config", "model_label", "_expert_layout", "run_training"},
    **{f"workloads/training/{m}.py": set() for m in ("engines", "data", "metrics", "commtimer", "expected")},
    "workloads/link/run.py": {"validate", "settings", "run_link"},
    "workloads/link/tools.py": set(),
    "workloads/replay/run.py": {"validate", "run_replay"},
    "workloads/replay/trace.py": set(),
    "workloads/inference/engine/run.py": {"validate", "run_server"},
    # arrivals and _load_settings are validate's, reading the load: section they check
    "workloads/inference/run.py": {"validate", "arrivals", "_load_settings", "run_sweep"},
}


def config_takers(path) -> set[str]:
    """Functions with a parameter annotated DictConfig (or a union naming it), or named cfg
    (the old loggers took `cfg: Any`)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if a.arg == "cfg" or (a.annotation is not None and "DictConfig" in ast.unparse(a.annotation)):
                    out.add(node.name)
    return out


def test_only_entries_and_validators_take_the_raw_config():
    extra = {m: sorted(config_takers(REPO / m) - allowed) for m, allowed in ENTRIES.items()}
    assert {m: f for m, f in extra.items() if f} == {}


# Where else the raw config may be read, each because it is a command's or a validator's own
# reading, above or at the point where a plan is made: nothing below a plan.
BOUNDARY = {
    "workloads/core/config.py": {"validate_job"},  # find the workload's validator
    "workloads/commands/entry.py": {"main", "_job"},  # Hydra's main and the job it runs
    "workloads/core/schema.py": {"check", "_get", "_value"},  # types of every value, the first thing prepare() checks
    "workloads/fabric/emuplan.py": {"_spec_of", "_check_served"},  # a config -> the emulated topology it asks for
    "workloads/fabric/profile.py": {"node_env"},  # a served node composes its own config (its entry)
}


def test_no_module_anywhere_takes_the_raw_config_below_its_entry():
    """Every module of workloads/ and analysis/, not only the converted workloads': a new
    function that takes a DictConfig (or an untyped `cfg`) is either an entry or validator
    named above, or a second reader of the raw config."""
    allowed = {**ENTRIES, **BOUNDARY}
    found = {}
    for top in ("workloads", "analysis"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                args = node.args
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                    note = ast.unparse(a.annotation) if a.annotation is not None else None
                    raw = "DictConfig" in (note or "") or (a.arg == "cfg" and note in (None, "Any"))
                    if raw and node.name not in allowed.get(rel, set()):
                        found.setdefault(rel, []).append(node.name)
    assert found == {}
