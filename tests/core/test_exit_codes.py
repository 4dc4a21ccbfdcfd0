"""docs/reliability.md's exit-code table and the code agree: every code the error classes carry
is in the table, and every test the table names as pinning a code exists (those tests run real
commands; this one reads files only)."""

from __future__ import annotations

import re
import signal

from helpers import REPO


def _table() -> dict[str, list[str]]:
    """{code: [pinning test ids]} from the table under '## Exit codes'."""
    text = (REPO / "docs" / "reliability.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("code", "---"):
            rows[cells[0]] = re.findall(r"`(tests/[^`]+::[A-Za-z0-9_]+)`", cells[2])
    return rows


def test_each_code_is_pinned_by_a_test_that_exists():
    rows = _table()
    assert set(rows) == {"0", "1", "2", "3", "124", "128+N"}, rows
    for code, tests in rows.items():
        assert tests, f"exit {code} names no test that pins it"
        for test in tests:
            path, name = test.split("::")
            assert re.search(rf"^def {name}\(", (REPO / path).read_text(), re.M), f"exit {code}: {test} does not exist"


def test_the_error_classes_carry_the_tables_codes():
    from workloads.collectives.run import CollectivesFailed
    from workloads.core.errors import Fault, RecordNotWritten, TransportMismatch, UsageError
    from workloads.core.signals import Terminated
    from workloads.fabric.noise import NoiseFailed
    from workloads.inference.pd.serve import NOT_READY
    from workloads.link.run import LinkFailed
    from workloads.replay.run import ReplayFailed

    assert UsageError.exit_code == 2 and TransportMismatch.exit_code == 3
    faults = (Fault, RecordNotWritten, CollectivesFailed, LinkFailed, NoiseFailed, ReplayFailed)
    assert {c.exit_code for c in faults} == {NOT_READY} == {1}
    assert Terminated.exit_code == 128 + signal.SIGTERM
