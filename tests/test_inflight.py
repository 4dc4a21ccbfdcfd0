"""The in-flight copy of a point being measured (workloads/core/inflight.py): it becomes one
failed record when its writer dies, never two, and never while the writer lives. Real
processes: the writer is a real child, the finishers race in separate processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

from workloads.core import inflight
from workloads.core.records import new_record


def _copy_of(tmp_path, n: int = 0):
    rec = new_record("pretrain", config={"trial": n}, run_id="r")
    return inflight.write(rec, tmp_path / "records", f"point{n}")


def _recover_all(where: str, start, out) -> None:
    start.wait()  # both finishers are up: they race for the same copies
    out.put([str(p) for p in inflight.recover(where, "the writer died")])


def test_two_finishers_write_each_record_once(tmp_path):
    """A launcher and a surviving rank (here: two processes at once) finish the same copies:
    each copy becomes exactly one record, whoever claims it first."""
    for n in range(20):
        _copy_of(tmp_path, n)
    where = str(tmp_path / "records" / ".inflight")
    ctx = multiprocessing.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(2)
    finishers = [ctx.Process(target=_recover_all, args=(where, start, out)) for _ in range(2)]
    for f in finishers:
        f.start()
    written = out.get(timeout=60) + out.get(timeout=60)  # (each claims about half here)
    for f in finishers:
        f.join(30)
    records = sorted((tmp_path / "records").glob("*.json"))
    assert len(written) == len(records) == 20
    # One record per point: no point-001 from a second writer.
    assert [p.name for p in records] == sorted(f"point{n}-000.json" for n in range(20))
    assert all(json.loads(p.read_text())["status"] == "failed" for p in records)
    assert not list(Path(where).iterdir())  # no copy, claim or temp file left


def test_a_living_writer_is_left_to_write_its_own_record(tmp_path, monkeypatch):
    """The other rank acts only once the writer's pid is gone (a zombie counts as gone), and
    names the death and what it saw itself."""
    monkeypatch.setattr(inflight, "DEATH_WAIT_S", 0.3)
    writer = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(600)"],
                              stdin=subprocess.PIPE)
    copy = _copy_of(tmp_path)
    who = inflight.writer(copy) | {"pid": writer.pid, "start": inflight._start_time(writer.pid)}
    seen = RuntimeError("Connection closed by peer\nmore lines")
    assert inflight.after_writer_died(who, 1, seen) is None  # alive: nothing written
    assert copy.exists() and not list((tmp_path / "records").glob("*.json"))
    writer.kill()  # not reaped yet: a zombie, dead all the same
    path = inflight.after_writer_died(who, 1, seen)
    rec = json.loads(path.read_text())
    assert rec["status"] == "failed"
    assert rec["error"].startswith(f"rank 0 (pid {writer.pid} on ") and "died during this point" in rec["error"]
    assert rec["error"].endswith("rank 1 then got RuntimeError: Connection closed by peer")
    assert inflight.after_writer_died(who, 1, seen) is None  # once only
    writer.wait()


def test_a_launcher_keeps_its_copies_to_itself(tmp_path, monkeypatch):
    """Under self-launch the copy goes to the launcher's folder and no rank is told of it: the
    launcher knows how the rank died, so it writes the record."""
    monkeypatch.setenv(inflight.INFLIGHT_ENV, str(tmp_path / "launcher"))
    copy = _copy_of(tmp_path)
    assert copy.parent == tmp_path / "launcher" and inflight.writer(copy) is None
    monkeypatch.delenv(inflight.INFLIGHT_ENV)
    assert inflight.writer(_copy_of(tmp_path, 1))["pid"] == os.getpid()
