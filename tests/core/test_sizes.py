"""Module and room sizes only go down: no new product module over 500 lines (250 in commands/),
no new room over 15 modules, and the ones over today are held at their size (docs/architecture.md).

A module that long holds several jobs, and a reader of one job pays for all of them; a room that
big no longer says where a thing lives. Splitting the ones listed here moves files others edit,
so it goes room by room; until then this keeps them from growing, and an entry is dropped (the
test says so) the moment its module or room is back under the limit.
"""

from __future__ import annotations

from pathlib import Path

from helpers import REPO

MODULE_LIMIT = 500
COMMAND_LIMIT = 250
ROOM_LIMIT = 15

# module -> its lines when this test was written: it may shrink, not grow
MODULES_OVER = {
    "analysis/certificate.py": 556,
    "analysis/compare.py": 576,
    "analysis/stats.py": 832,
    "workloads/commands/doctor.py": 270,
    "workloads/commands/emulate.py": 552,
    "workloads/commands/entry.py": 515,
    "workloads/commands/gpu_check.py": 407,
    "workloads/commands/model.py": 321,
    "workloads/fabric/netns.py": 667,
    "workloads/inference/run.py": 501,
    "workloads/study/plan.py": 534,
    "workloads/study/run.py": 678,
}
# room (a folder of workloads/ or analysis/) -> its modules when this test was written
ROOMS_OVER = {
    "analysis": 21,
    "workloads/core": 18,
    "workloads/fabric": 30,
}


def product_modules() -> list[Path]:
    return sorted(p for top in ("workloads", "analysis") for p in (REPO / top).rglob("*.py"))


def limit(path: Path) -> int:
    return COMMAND_LIMIT if path.parent.name == "commands" else MODULE_LIMIT


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_no_module_grows_past_its_limit():
    bad = []
    for path in product_modules():
        n, name = lines(path), rel(path)
        ceiling = MODULES_OVER.get(name, limit(path))
        if n > ceiling:
            why = f"held at {ceiling}" if name in MODULES_OVER else f"the limit is {ceiling}"
            bad.append(f"{name}: {n} lines ({why}): split it at a seam of its jobs")
    assert not bad, "\n".join(bad)


def test_the_list_of_modules_over_is_current():
    sizes = {rel(p): lines(p) for p in product_modules()}
    gone = [m for m in MODULES_OVER if m not in sizes]
    under = [m for m, n in MODULES_OVER.items() if m in sizes and sizes[m] <= limit(REPO / m)]
    assert not gone and not under, f"drop from MODULES_OVER: {gone + under}"


def rooms() -> dict[str, int]:
    out: dict[str, int] = {}
    for path in product_modules():
        if path.name != "__init__.py":
            out[rel(path.parent)] = out.get(rel(path.parent), 0) + 1
    return out


def test_no_room_grows_past_its_limit():
    bad = [f"{r}: {n} modules (held at {ROOMS_OVER.get(r, ROOM_LIMIT)}): give a job of it a room of its own"
           for r, n in rooms().items() if n > ROOMS_OVER.get(r, ROOM_LIMIT)]
    assert not bad, "\n".join(bad)
    under = [r for r, n in ROOMS_OVER.items() if rooms().get(r, 0) <= ROOM_LIMIT]
    assert not under, f"drop from ROOMS_OVER: {under}"
