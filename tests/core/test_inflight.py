"""The in-flight copy of a point being measured (workloads/core/inflight.py): it becomes one
failed record when its writer dies, never two, and never while the writer lives. Real
processes: the writer is a real child, the finishers race in separate processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.core import inflight
from workloads.core.ports import free_port
from workloads.core.records import new_record


def _copy_of(tmp_path, n: int = 0):
    rec = new_record("pretrain", config={"trial": n}, run_id="r")
    return inflight.write(rec, tmp_path / "records", f"point{n}")


def _recover_all(where: str, start, out) -> None:
    start.wait()  # both finishers are up: they race for the same copies
    out.put([str(p) for p in inflight.recover(where, "the writer died")])


@pytest.mark.slow
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
    assert not Path(where).exists()  # no copy, claim or temp file left, nor their folder


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


def _enter_point(rank: int, port: int, out: str, late, q) -> None:
    """One rank of a real 2-rank Gloo group entering a measured point; rank 1 only once
    `late` is set, so rank 0 waits for it in the point's opening collective."""
    import torch
    import torch.distributed as dist

    from workloads.core import dist as fdist
    from workloads.session import Recorded

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    info = fdist.DistInfo(rank, 2, rank, 2, "gloo", torch.device("cpu"))
    if rank == 1:
        late.wait(60)
    q.put((rank, "entering"))
    point = Recorded(new_record("pretrain", config={"trial": 0}, run_id="r"), Path(out), "point",
                     write=rank == 0, info=info)
    with point:
        copies = sorted(str(p) for p in (Path(out) / ".inflight").glob(f"*{inflight.SUFFIX}"))
        q.put((rank, copies if rank == 0 else point.writer["path"]))
    fdist.end_group_and_exit()


@pytest.mark.slow
def test_the_copy_is_written_once_every_rank_knows_where(tmp_path):
    """While rank 0 waits in the point's opening collective for a late rank 1 there is no copy:
    were rank 0 to die there, no rank could finish one (it would be orphaned beside the records).
    Once both are in, the copy exists where rank 1 was told it is. Real Gloo ranks."""
    port = free_port()
    out = tmp_path / "records"
    ctx = multiprocessing.get_context("spawn")
    q, late = ctx.Queue(), ctx.Event()
    ranks = [ctx.Process(target=_enter_point, args=(r, port, str(out), late, q)) for r in (0, 1)]
    for r in ranks:
        r.start()
    try:
        assert q.get(timeout=120) == (0, "entering")
        deadline = time.monotonic() + 1.0  # rank 0 is in (or about to be in) the opening collective
        while time.monotonic() < deadline:
            assert not list(out.glob(".inflight/*")), "a copy before rank 1 knows where it is"
            time.sleep(0.05)
    finally:
        late.set()
    seen = dict(q.get(timeout=60) for _ in range(3))
    for r in ranks:
        r.join(60)
    assert [r.exitcode for r in ranks] == [0, 0]
    (copy,) = seen[0]
    assert seen[1] == copy
    (rec,) = out.glob("*.json")
    assert json.loads(rec.read_text())["status"] == "ok" and not list(out.glob(".inflight/*"))


def _interrupted_on_entering(port: int, out: str, q) -> None:
    """One rank (a group of one) whose Ctrl-C lands in the point's opening, after its copy is
    written: the delay meter, the last thing __enter__ builds, raises it."""
    import torch
    import torch.distributed as dist

    from workloads import session
    from workloads.core import dist as fdist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    info = fdist.DistInfo(0, 1, 0, 1, "gloo", torch.device("cpu"))

    def ctrl_c():
        assert list((Path(out) / ".inflight").glob(f"*{inflight.SUFFIX}")), "the copy is not written yet"
        raise KeyboardInterrupt

    session.DelayMeter = ctrl_c
    try:
        with session.Recorded(new_record("pretrain", config={"trial": 0}, run_id="r"), Path(out), "point",
                              write=True, info=info):
            q.put("measured")
    except KeyboardInterrupt:
        q.put("interrupted")
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_signal_between_the_copy_and_the_measurement_still_writes_the_record(tmp_path):
    """Ctrl-C after the copy is written but before the point's body runs (where Python calls no
    __exit__): the rank writes the failed record itself and removes its copy, as it does
    mid-measurement. Left to the launcher, the copy became a second line after "interrupted"
    (CI, the signal test). A real Gloo group in a spawned process."""
    out = tmp_path / "records"
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    rank = ctx.Process(target=_interrupted_on_entering, args=(free_port(), str(out), q))
    rank.start()
    said = q.get(timeout=120)
    rank.join(60)
    assert (said, rank.exitcode) == ("interrupted", 0)
    (rec,) = out.glob("*.json")
    saved = json.loads(rec.read_text())
    assert saved["status"] == "failed" and saved["error"].startswith("interrupted"), saved
    assert not list(out.glob(".inflight/*"))


def test_an_error_after_a_signal_is_recorded_and_raised_as_the_interruption(tmp_path, monkeypatch):
    """A rank asked to stop whose interruption Python dropped (workloads/core/signals.py) then
    fails on a stopped peer: its record says interrupted, as the entry point's line does, not
    the peer's error as if it were the fabric's; and the point ends as that interruption (exit
    143), not as the error. Without a signal the error is the error."""
    import signal

    import pytest

    from workloads.core import signals
    from workloads.session import Recorded

    for received, raised, error in [(None, RuntimeError, "RuntimeError: Connection closed by peer"),
                                    (signal.SIGTERM, signals.Terminated, "interrupted (Ctrl-C or SIGTERM)")]:
        monkeypatch.setattr(signals, "_received", received)
        point = Recorded(new_record("pretrain", config={"trial": 0}, run_id="r"), tmp_path / str(received),
                         "point", write=True)
        with pytest.raises(raised), point:
            raise RuntimeError("Connection closed by peer")
        assert json.loads(point.path.read_text())["error"] == error


def test_a_signal_library_code_swallowed_still_ends_the_point(tmp_path, monkeypatch):
    """SIGTERM's exception raised inside a library that catches it as any other error (aiohttp
    made it one request's ClientPayloadError; the load generator counted a failed request and
    the point ran to its end, seen in CI): the point is recorded as interrupted, what it
    measured kept, and the interruption raised, so the sweep stops with exit 143 rather than
    going on or ending "partial" with exit 1."""
    import signal

    import pytest

    from workloads.core import signals
    from workloads.session import Recorded

    monkeypatch.setattr(signals, "_received", signal.SIGTERM)
    point = Recorded(new_record("inference", config={"trial": 0}, run_id="r"), tmp_path, "point", write=True)
    with pytest.raises(signals.Terminated), point as rec:
        rec["metrics"] = {"completed": 2, "failed": 1}
        rec["status"], rec["error"] = "partial", "1 of 3 requests failed"
    saved = json.loads(point.path.read_text())
    assert (saved["status"], saved["error"], saved["metrics"]) == \
        ("failed", "interrupted (Ctrl-C or SIGTERM)", {"completed": 2, "failed": 1})


def test_a_copy_done_with_takes_its_empty_folder_with_it(tmp_path, monkeypatch):
    """records/.inflight/ goes with its last copy (empty ones piled up in run folders); a copy
    of another point keeps it."""
    monkeypatch.delenv(inflight.INFLIGHT_ENV, raising=False)
    rec = tmp_path / "records"
    a = inflight.write({"status": "running"}, rec, "a")
    b = inflight.write({"status": "running"}, rec, "b")
    assert a.parent == rec / ".inflight"
    inflight.discard(a)
    assert b.exists()
    inflight.discard(b)
    assert not (rec / ".inflight").exists() and rec.is_dir()
