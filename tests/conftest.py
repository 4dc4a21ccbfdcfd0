"""Fixtures every test folder shares, and the `requires` marker (helpers.need). Tests are
CPU-only and use real processes and sockets; helpers live in tests/helpers/."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import need


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    for mark in item.iter_markers("requires"):
        need(*mark.args)


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    return tmp_path / "results"


def _namespaces_and_veths() -> set[str]:
    """Our namespaces (fb-<pid>-...) and any emu0 veth left in the root namespace (ours only
    ever live inside namespaces)."""
    from workloads.fabric.emulate import leftovers

    links = subprocess.run(["ip", "-o", "link", "show", "type", "veth"], capture_output=True, text=True).stdout
    return set(leftovers("fb-")) | {f"root-namespace veth {w.rstrip(':')}" for w in links.split() if w.startswith("emu0")}


@pytest.fixture(scope="module", autouse=True)
def nothing_of_ours_remains(request):
    """After every module that needs root: each namespace and veth it made is gone, also when
    a test failed (deleting a namespace deletes its veths and their qdiscs)."""
    if not any(m.args and "root" in m.args for item in request.session.items if item.module is request.module
               for m in item.iter_markers("requires")):
        yield
        return
    before = _namespaces_and_veths()
    yield
    left = _namespaces_and_veths() - before
    assert not left, f"left behind by {request.module.__name__}: {sorted(left)}"
