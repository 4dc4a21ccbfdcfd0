"""The floors hold: no module imports one on a higher floor, and no modules import each other
round in a circle (docs/layout.md names the floors).

A floor that imports upward is no longer a floor: the ground would need the house to stand.
Imports inside functions count too (a lazy import is still a dependency), and so does the
module a `from package import name` names when `name` is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import REPO

# room (first component under workloads/, or the top-level package) -> floor; higher may import lower
FLOORS = {
    "workloads": 0, "catalog": 0,                    # the checkout's paths; what a workload is
    "core": 1,                                       # errors, dist, records, loggers, config, signals
    "fabric": 2, "models": 2,                        # fabric profiles and proof; the models
    "session": 3,                                    # the opening every workload shares
    "training": 4, "collectives": 4, "inference": 4, "link": 4, "replay": 4,  # the workloads
    "study": 5, "testing": 5, "analysis": 5,         # what runs or reads workloads
    "commands": 6,                                   # entry points' machinery, fabricbench's dispatcher, doctor, emulate
}


def modules() -> dict[str, Path]:
    out = {}
    for top in ("workloads", "analysis"):
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules that `path` imports, anywhere in it."""
    return {m for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, (ast.Import, ast.ImportFrom))
            for m in imports_of(node, known)}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "workloads" and len(parts) > 1 else parts[0]


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def test_every_room_has_a_floor():
    assert not {room(m) for m in graph()} - set(FLOORS), "add the new folder to FLOORS"


def test_no_module_imports_a_higher_floor():
    up = [f"{m} (floor {FLOORS[room(m)]}) imports {t} (floor {FLOORS[room(t)]})"
          for m, targets in sorted(graph().items()) for t in sorted(targets)
          if FLOORS.get(room(t), 0) > FLOORS.get(room(m), 0)]
    assert not up, "\n".join(up)


def test_no_import_circles():
    edges = graph()
    circles, seen = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(edges[node]):
            if nxt in path:
                circle = path[path.index(nxt):]
                key = frozenset(circle)
                if key not in seen:
                    seen.add(key)
                    circles.append(" -> ".join([*circle, nxt]))
            elif nxt not in done:
                walk(nxt, [*path, nxt])
        done.add(node)

    done: set[str] = set()
    for start in sorted(edges):
        if start not in done:
            walk(start, [start])
    assert not circles, "\n".join(circles)


def test_inside_inference_the_engine_stands_below_the_adapters():
    """The reference engine (torch, the GPU-side server) never imports the serving side's
    adapters; what both need (the identity token, what the engine can serve) is in
    inference/protocol.py."""
    edges = graph()
    up = [f"{m} imports {t}" for m, ts in sorted(edges.items()) if m.startswith("workloads.inference.engine")
          for t in sorted(ts) if t.startswith("workloads.inference.adapters")]
    assert not up, "\n".join(up)


def test_no_product_module_imports_the_test_doubles():
    """workloads/testing/ is left out of the wheel: a product module importing it would break
    an installed fabricbench."""
    doubles = [m for m, targets in sorted(graph().items()) if room(m) != "testing"
               for t in targets if room(t) == "testing"]
    assert not doubles, doubles


def module_level_imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules importing `path` loads at once: its imports outside function bodies
    (a lazy import runs only when its function does), and the packages above each."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.update(imports_of(child, known))
            else:
                visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return out | {m.rsplit(".", i)[0] for m in out for i in range(1, m.count(".") + 1)} & set(known)


def imports_of(node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.level == 0 and node.module:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    else:
        return set()
    out = set()
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)
    return out


def test_a_training_run_loads_no_emulator_module():
    """`make train` on a real cluster runs launch/train.py: what it imports (its entry's lazy
    imports included), and all they load in turn, holds no iperf3, namespace, topology or
    noise-generator code; the per-point noise meter is its own module (fabric/noisemeter.py)."""
    known = modules()
    script = REPO / "launch" / "train.py"
    todo = list(imports(script, known))
    seen: set[str] = set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += module_level_imports(known[m], known)
    assert "workloads.training.run" in seen and "workloads.fabric.noisemeter" in seen  # the walk reaches them
    emulator = {f"workloads.fabric.{m}" for m in ("iperf3", "netns", "leafspine", "noise", "emuplan", "delayline")}
    assert not seen & emulator, sorted(seen & emulator)
