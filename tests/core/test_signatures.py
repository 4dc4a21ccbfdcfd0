"""Length does not hide in signatures or in long bodies: no production function (workloads/,
analysis/) takes more than 10 parameters (typed values instead: stats.Design and Judging,
session.Point, harness.Communicators, metrics.ModelShape), and no function runs over 60 lines
but the few named below, each with its reason."""

from __future__ import annotations

import ast

from helpers import REPO

MAX_PARAMS = 10
MAX_LINES = 60
# path:function -> why it may stay long
LONG = {
    # one request's SSE stream read in one loop: TTFT and ITL are stamped as the chunks arrive
    "workloads/inference/loadgen/client.py:stream_request": "the timed loop stays whole",
    # a test double: one scripted reply per request path, read top to bottom
    "workloads/testing/scripted_server.py:handle": "a test double's script",
}


def functions():
    for top in ("workloads", "analysis"):
        for path in sorted((REPO / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{path.relative_to(REPO)}:{node.name}", node


def params(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs] + [x.arg for x in (a.vararg, a.kwarg) if x]
    return len([n for n in names if n not in ("self", "cls")])


def test_no_production_function_takes_more_than_ten_parameters():
    trains = [f"{name} ({params(node)})" for name, node in functions() if params(node) > MAX_PARAMS]
    assert not trains, trains


def test_only_the_named_functions_run_over_sixty_lines():
    long = {name for name, node in functions() if node.end_lineno - node.lineno + 1 > MAX_LINES}
    assert long <= set(LONG), sorted(long - set(LONG))
    assert not set(LONG) - long, f"now short, drop from LONG: {sorted(set(LONG) - long)}"
