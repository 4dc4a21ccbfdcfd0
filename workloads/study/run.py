"""Run a study: every (arm, trial) cell as its own process group, in a counterbalanced order.

The command, its options and its exit statuses are workloads/commands/study.py's. Every study
first prints its plan (workloads/study/plan.py) and is refused, before any run, when it cannot
call the difference it asks for (`detect:`).

Each cell runs each workload of the study as a separate process of its entry point
(launch/train.py, launch/collectives.py, launch/infer.py; launch/emulate.py when the arm's
fabric is emulated; one Slurm step per cell inside an allocation), with its own run_id
`<study id>-<arm>-t<trial>-<workload>` and the cell in one `study={...}` override that
every record keeps. Records go to `<output_root>/<study id>/`; each cell's console output
to `<output_root>/<study id>/logs/`. A rerun of the same study skips every cell whose
records are all there with status ok and runs the missing or failed ones; a rerun of a
finished study writes nothing. At the end: the summary table, the verdicts (judged once, in
this process, as `fabricbench compare` on the study's folder prints them; saved as
compare.txt) and the report (report/).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median

from analysis.clock import measured_s
from workloads import REPO_ROOT
from workloads.core import celllock, errors, timeline
from workloads.core.config import hydra_value
from workloads.core.errors import UsageError
from workloads.core.records import iter_records, overlapped
from workloads.core.rundir import derive_run_id, log_since
from workloads.core.signals import stop_group
from workloads.study import precheck
from workloads.study.fabrics import KeptFabrics, fork_run
from workloads.study.plan import clock, primary_of
from workloads.study.schedule import Cell, schedule
from workloads.study.spec import Arm, StudySpec, Workload


@dataclass(frozen=True)
class Job:
    """One process: one workload of one (arm, trial) cell."""

    cell: Cell
    arm: Arm
    workload: Workload
    points: tuple[str, ...]  # the records it writes: inference, one per load point ("c1" ...); else ("",)

    def run_id(self, spec: StudySpec) -> str:
        """<study id>-<arm>-t<trial>-<workload>, in the characters a run directory allows
        (an A/A arm's `~` becomes `-`: Hydra's override grammar would not take it)."""
        return derive_run_id(f"{spec.id}-{self.arm.label}-t{self.cell.trial}-{self.workload.name}", {})

    def records_dir(self, spec: StudySpec) -> Path:
        return spec.dir / self.run_id(spec) / "records"


def study_field(spec: StudySpec, job: Job, env=os.environ, retry: str | None = None) -> dict:
    """The record's `study` block (shared contract with analysis/: keep these names). `retry`:
    why the cell's run before this one was retried (its rendezvous was lost)."""
    f = {"name": spec.name, "id": spec.id, "arm": job.arm.label, "baseline": spec.baseline.label,
         "control": job.arm.control, "block": job.cell.block, "position": job.cell.position,
         "design": spec.design, "seed": spec.seed, "blocks": spec.blocks, "workload": job.workload.name,
         "margin": spec.margin, "detect": spec.detect, "looks": spec.looks, "alpha": spec.alpha}
    if job.workload.primary_metric:
        f["primary_metric"] = job.workload.primary_metric
    if job.workload.primary_point:
        f["primary_point"] = job.workload.primary_point
    if job.workload.window:
        f["window"] = job.workload.window  # the plan chose this run's measured steps (window: auto), and why
    if retry:
        f["retry_of"] = retry
    if env.get("SLURM_JOB_ID"):
        f["slurm_job"] = str(env["SLURM_JOB_ID"])
        f["nodes"] = str(env.get("SLURM_JOB_NODELIST", ""))  # both arms' steps run on these nodes
    return f


def study_override(field: dict) -> str:
    """One Hydra override `study={k: v, ...}`."""
    return "study={" + ",".join(f"{k}:{hydra_value(v)}" for k, v in field.items()) + "}"


def cell_overrides(spec: StudySpec, job: Job, env=os.environ, retry: str | None = None) -> list[str]:
    return [*job.workload.argv, *job.arm.overrides, f"fabric={job.arm.fabric}", f"trial={job.cell.trial}",
            f"run_id={job.run_id(spec)}", f"output_root={hydra_value(str(spec.dir))}",
            study_override(study_field(spec, job, env, retry))]


def cell_argv(spec: StudySpec, job: Job, launcher: str, python: str = sys.executable, env=os.environ,
              retry: str | None = None) -> list[str]:
    """The command of one job. Emulated arms go through launch/emulate.py (namespaces, root);
    under Slurm a distributed job is one step over the allocation's nodes (lib.sh's srun
    per node + torchrun_node.sh), so every arm runs on the same nodes."""
    overrides = cell_overrides(spec, job, env, retry)
    script = str(REPO_ROOT / job.workload.script)
    if job.arm.emulated:
        return [python, str(REPO_ROOT / "launch" / "emulate.py"), "--timeout", f"{spec.timeout_s:g}", script,
                *overrides]
    if launcher == "slurm" and not job.workload.kind.served:
        step = ('source "$FB_HOME/launch/slurm/lib.sh" && fb_setup >&2 && '
                'fb_srun_per_node bash "$FB_HOME/launch/slurm/torchrun_node.sh" "$@"')
        return ["bash", "-c", step, "fabricbench-study", script, *overrides]
    return [python, script, *overrides]


def plan(spec: StudySpec) -> list[Job]:
    points = {(a.label, w.name): precheck.job_points(w, a) for a in spec.arms for w in spec.workloads}
    return [Job(c, spec.arm(c.arm), w, points[(c.arm, w.name)])
            for c in schedule([a.label for a in spec.arms], spec.blocks, spec.design, spec.seed, spec.id)
            for w in spec.workloads]


def _belongs(spec: StudySpec, job: Job, rec: dict) -> bool:
    st = rec.get("study") or {}
    return (st.get("id"), st.get("arm"), st.get("workload")) == (spec.id, job.arm.label, job.workload.name) and \
        (rec.get("config") or {}).get("trial") == job.cell.trial


def job_records(spec: StudySpec, job: Job) -> list[dict]:
    """This job's records (every status), read from its run directory."""
    return [rec for _, rec in iter_records(job.records_dir(spec)) if _belongs(spec, job, rec)]


def complete(spec: StudySpec, job: Job) -> bool:
    """Every point of the job has an ok record that no other run of the study overlapped
    (records.overlap: a rerun measures such a point again; analysis leaves it out)."""
    every = list(iter_records(spec.dir, "*/records/*.json"))
    bad = {every[i][0] for i in overlapped([r for _, r in every])}
    here = job.records_dir(spec)
    ok = {r.get("point") or "" for p, r in every
          if p.parent == here and p not in bad and r.get("status") == "ok" and _belongs(spec, job, r)}
    return ok >= set(job.points)


def _manifest(spec: StudySpec) -> None:
    """The study's definition beside its records: a rerun with another definition under the
    same id would mix two experiments, so it is refused."""
    definition(spec.dir, "study", spec.as_dict(), spec.output_root)


def definition(folder: Path, kind: str, mine: dict, output_root: str) -> None:
    """Write `<folder>/<kind>.json` (a study's or a tune's definition), or refuse when the one
    there differs: a rerun under the same id resumes the same experiment, never another."""
    from workloads.study.words import saved

    path = folder / f"{kind}.json"
    if path.is_file():
        theirs = saved(json.loads(path.read_text()))  # one saved before the rename says entry: train / infer
        if theirs != mine:
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise UsageError(f"{folder} holds {kind} {theirs.get('id')!r} with other {', '.join(keys)}; "
                             f"pass --id <new id> to run this one, or restore the {kind} file")
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mine, indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"--output-root {output_root}: cannot write the {kind}'s folder {folder} "
                         f"({e.strerror}); give a writable folder") from None


def _commit(record: dict) -> str | None:
    """The code a record's run was measured on: its git commit, with `+<hash>` of the
    uncommitted changes to tracked files when there were any (None outside a checkout)."""
    git = (record.get("fingerprint") or {}).get("git") or {}
    return _code(git) if git.get("commit") else None


def _code(git: dict) -> str:
    return git["commit"] + (f"+{git['dirty_hash']}" if git.get("dirty_hash") else "")


def _words(code: str, full: bool = False) -> str:
    """'commit 0123456789ab' or 'commit 0123456789ab with uncommitted changes (diff hash …)'."""
    commit, _, diff = code.partition("+")
    return f"commit {commit if full else commit[:12]}" + (f" with uncommitted changes (diff hash {diff})" if diff else "")


def _same_code(spec: StudySpec, jobs: list[Job]) -> None:
    """Refuse to resume a study on other code than its recorded runs: compare never pools
    runs of two commits, nor of one commit with and without uncommitted edits (code is
    identity, analysis/guard.py), so the runs added now would have no counterpart among those
    of the first session and the study would lose its blocks. Checked before anything runs; a
    finished study (nothing to run) is not."""
    from workloads.core.fingerprint import git_commit

    here = git_commit()
    if here["commit"] is None or all(complete(spec, j) for j in jobs):
        return  # no commit here (an installed copy, not a checkout), or nothing left to run
    mine = _code(here)
    runs = Counter(c for j in jobs for r in job_records(spec, j) if r.get("status") == "ok" and (c := _commit(r)))
    if not set(runs) - {mine}:
        return
    if len(runs) == 1:
        (theirs,) = runs
        commit, _, diff = theirs.partition("+")
        back = f"git checkout {commit}" + (", with the same uncommitted edits" if diff else
                                           " with no uncommitted edits (git stash)" if "+" in mine else "")
        raise UsageError(f"study {spec.id} was measured on {_words(theirs)} and this checkout is {_words(mine)}: compare "
                         "never pools runs of different code, so the runs still to do would have no counterpart. Finish "
                         f"it on its code ({back}), or pass --id <new id> to run the study again on this one")
    held = ", ".join(f"{_words(c)}: {n} run(s)" for c, n in runs.most_common())
    raise UsageError(f"study {spec.id} already holds runs of {len(runs)} versions of the code ({held}) and this checkout "
                     f"is {_words(mine)}: compare never pools runs of different code. Pass --id <new id> to run the study "
                     "again on one version, or delete the records of the runs of the other versions under "
                     f"{spec.dir} and finish it on one")


def extension_refusal(folder: Path, study_id: str, blocks: int) -> str | None:
    """Why a study may not run to `blocks` blocks now, or None. Once its verdicts were printed
    (compare.txt), adding blocks and judging again at full alpha is optional stopping: A/A
    studies extended from 8 to 16 blocks whenever the first verdict called nothing call a
    difference in about 9% of cases, not 5%. The blocks a study was planned for are in its
    records (`study.blocks`); a rerun to the same size (a resume) is fine."""
    if not (folder / "compare.txt").is_file():
        return None
    planned = [int(b) for _, rec in iter_records(folder, "*/records/*.json")
               if (st := rec.get("study") or {}).get("id") == study_id and (b := st.get("blocks")) is not None]
    if not planned or blocks <= max(planned):
        return None
    return (f"study {study_id} printed its verdicts after {max(planned)} blocks (compare.txt): adding blocks now and "
            "judging them again is optional stopping, a false call about twice as often as alpha. Run a new study "
            f"(--id <new id>) with blocks: {blocks}, whose verdicts use only its own blocks, or plan the extra blocks "
            "from the start with --until-decided --max-blocks N (alpha spent over its looks)")


def _lock(spec: StudySpec, kind: str = "study"):
    """An exclusive lock on the study's folder for as long as it runs: two runs of one study
    at once would compete for the machine (their "ok" records measured that contention) and
    each would count the other's runs as its own failures. The open file holds the lock."""
    import fcntl

    f = open(spec.dir / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise UsageError(f"{kind} {spec.id} is already running in {spec.dir} ({holder}); wait for it to finish, "
                         f"or pass --id <new id> for a separate {kind}") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    return f


# How long a resumed study waits for the runs of a killed attempt: they got SIGTERM when it died,
# and a rank has signals.TERM_GRACE_S to write its interrupted record before it is gone.
ORPHAN_WAIT_S = 60.0


def _cells_lock(spec: StudySpec, say=print):
    """No cell starts while a run of an earlier attempt of this study lives (workloads/core/celllock.py):
    it would measure beside it, and both would count the contention."""
    held = celllock.acquire(spec.dir, ORPHAN_WAIT_S, say)
    if held is None:
        who = celllock.holders(spec.dir / celllock.NAME)
        raise UsageError(f"study {spec.id}: run(s) of an earlier attempt are still running after {ORPHAN_WAIT_S:.0f} s "
                         f"({', '.join(map(celllock.describe, who)) or 'processes of another user'}); wait for them to "
                         f"end or stop them{' (kill ' + ' '.join(map(str, who)) + ')' if who else ''}, then rerun")
    return held


def progress_line(k: int, n: int, job: Job, spec: StudySpec, elapsed: float, eta: float | None) -> str:
    w = spec.workloads.index(job.workload)
    return (f"[{k}/{n}] block {job.cell.block} · {job.arm.label} · trial {job.cell.trial} · "
            f"{job.workload.name} ({w + 1}/{len(spec.workloads)}) · elapsed {clock(elapsed)} · "
            f"ETA {'?' if eta is None else clock(eta)}")


def run_job(spec: StudySpec, job: Job, launcher: str, fabric_env: dict[str, str] | None = None,
            retry: str | None = None) -> tuple[int, float, float, Path]:
    """Start the job in its own process group, its output to its log; wait (timeout,
    Ctrl-C and SIGTERM stop the whole group). Returns (exit code, start, end, log), the
    times in time.monotonic() seconds of the process's own span. `fabric_env`: the arm's kept
    emulated topology (study/fabrics.py); `retry`: why the run before was retried (study_field)."""
    log = spec.dir / "logs" / f"{job.run_id(spec)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = cell_argv(spec, job, launcher, retry=retry)
    env = dict(os.environ) | {"FB_HOME": str(REPO_ROOT), celllock.CELL_LOCK_ENV: str(spec.dir / celllock.NAME)}
    env |= fabric_env or {}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "ab") as out:
        env[timeline.T0_ENV] = f"{time.time():.3f}"  # the record's timeline counts from the study starting the cell
        from workloads.core.redact import redact_argv

        out.write(f"# {redact_argv(argv)}\n".encode())
        out.flush()
        t0 = time.monotonic()
        # the cell dies with the study (SIGKILL included) and holds the study's cell lock meanwhile
        proc = fork_run(argv, env, out)
        proc = proc or subprocess.Popen(argv, cwd=str(REPO_ROOT), stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                        pass_fds=celllock.inherited(), preexec_fn=celllock.die_with_parent)
        try:
            code = proc.wait(timeout=spec.timeout_s + 60)
        except subprocess.TimeoutExpired:
            stop_group(proc, wait_s=20)
            code = 124
        except BaseException:
            stop_group(proc, wait_s=20)
            raise
    return code, t0, time.monotonic(), log


# What torch's elastic agent raises when the rendezvous store goes away under a run (torch 2.x,
# distributed/elastic/rendezvous/api.py RendezvousConnectionError; c10d_rendezvous_backend.py
# words it "The connection to the C10d store has failed"): a peer or a host too slow to keep
# the store's connection, not the cell. The study says so and runs the cell again, once.
RENDEZVOUS_LOST = ("RendezvousConnectionError", "The connection to the C10d store has failed")


def rendezvous_lost(log: Path, offset: int = 0) -> str | None:
    """The last line of the log, from byte `offset` (this run's part), that says the run lost
    its rendezvous store (a traceback's exception line, below the source lines that raise it);
    None when none does."""
    text = log_since(log, offset) or ""
    line = next((x.strip() for x in reversed(text.splitlines()) if any(w in x for w in RENDEZVOUS_LOST)), None)
    return line[:200] if line else None


def _tail(path: Path, lines: int = 8) -> str:
    with open(path, errors="replace") as f:
        return "".join(deque(f, lines)).rstrip()


def execute(spec: StudySpec, jobs: list[Job], launcher: str, say=print,
            timings: list | None = None) -> tuple[int, int, list[str]]:
    """Run every incomplete job in schedule order. Returns (ran, failed, failure lines);
    `timings` gets (job, start, end) in time.monotonic() seconds of each process."""
    todo = [j for j in jobs if not complete(spec, j)]
    done = len(jobs) - len(todo)
    if done and todo:
        say(f"study {spec.id}: {done} of {len(jobs)} runs already recorded (status ok); running the other {len(todo)}")
    with KeptFabrics(todo, run_id=lambda job: job.run_id(spec), say=say) as fabrics:
        return _execute(spec, todo, len(jobs), done, launcher, say, timings, fabrics)


def _execute(spec: StudySpec, todo: list[Job], total: int, done: int, launcher: str, say, timings: list | None,
             fabrics: KeptFabrics) -> tuple[int, int, list[str]]:
    start, spent, failures = time.monotonic(), [], []
    for k, job in enumerate(todo, 1):
        eta = (median(spent) * (len(todo) - k + 1)) if spent else None
        say(progress_line(done + k, total, job, spec, time.monotonic() - start, eta))
        log = spec.dir / "logs" / f"{job.run_id(spec)}.log"
        offset = log.stat().st_size if log.exists() else 0
        code, t0, t1, log = run_job(spec, job, launcher, fabrics.env(job))
        if code not in (0, 130) and (lost := rendezvous_lost(log, offset)):
            # one retry, as a new run of the same cell: its record's study.retry_of says why; a
            # second loss is a failure like any other (the machine, not chance, is then the cause)
            _timing(spec, job, t1 - t0, False)
            say(f"  rendezvous lost after {t1 - t0:.1f} s (exit {code}: {lost}); running the cell again, once")
            code, t0, t1, log = run_job(spec, job, launcher, fabrics.env(job),
                                        retry=f"{job.run_id(spec)} lost its rendezvous (exit {code}): {lost}")
        seconds = t1 - t0
        spent.append(seconds)
        if timings is not None:
            timings.append((job, t0, t1))
        if code == 130:
            raise KeyboardInterrupt
        ok = code == 0 and complete(spec, job)
        _timing(spec, job, seconds, ok)
        if not ok:
            line = f"{job.run_id(spec)}: exit {code} after {seconds:.1f} s; log {log}"
            failures.append(line)
            say(f"  FAILED {line}\n    " + _tail(log).replace("\n", "\n    "))
        else:
            say(f"  ok in {seconds:.1f} s")
    return len(todo), len(failures), failures


def _timing(spec: StudySpec, job: Job, seconds: float, ok: bool) -> None:
    try:
        with open(spec.dir / "timings.jsonl", "a") as f:  # the next plan's wall-time estimate
            f.write(json.dumps({"workload": job.workload.name, "arm": job.arm.label, "seconds": round(seconds, 3),
                                "ok": ok}) + "\n")
    except OSError:
        pass  # a full disk: only a later plan's estimate is lost; the run said where its record went


def clock_line(spec: StudySpec, jobs: list[Job], wall_s: float, verdicts: Verdicts | None = None) -> str | None:
    """The study's clock: how much of its runs' wall time was measured (the duty cycle) and the
    wall time per decided primary verdict of this invocation (`verdicts`: the study's, judged
    once; judged here when not given)."""
    try:
        spent = [json.loads(x)["seconds"] for x in (spec.dir / "timings.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError, KeyError):
        return None
    measured = [m for j in jobs for r in job_records(spec, j) if r.get("status") == "ok"
                and (m := measured_s(r)) is not None]
    if not spent or not measured:
        return None
    duty = sum(measured) / sum(spent)
    result = (verdicts or judge(spec)).result
    if result is None:  # compare refused the records (mixed code...): the verdicts' text says why, below
        return f"clock: {sum(measured):.0f} s measured of {sum(spent):.0f} s of runs (duty cycle {100 * duty:.0f}%)"
    n_decided, n, _ = _decided(result)
    per = f"; {n_decided} of {n} primary verdict(s) decided, {clock(wall_s / n_decided)} of wall time each" \
        if n_decided else f"; none of {n} primary verdict(s) decided yet"
    return (f"clock: {sum(measured):.0f} s measured of {sum(spent):.0f} s of runs (duty cycle {100 * duty:.0f}%), "
            f"{clock(wall_s)} in this invocation{per}")


def summary_table(spec: StudySpec, jobs: list[Job]) -> str:
    """Per workload (and load point) and arm: trials ok / asked, and the primary metric's
    median and range over trials (the metric the verdicts are called on), in the style of a
    benchmark's result block."""
    rows: dict[tuple, list] = {}
    metrics: dict[tuple, str] = {}
    asked: dict[tuple, int] = {}
    for job in jobs:
        for rec in job_records(spec, job):
            key = (job.workload.name, rec.get("point") or "", job.arm.label)
            if rec.get("status") == "ok":
                metric, v, _ = primary_of(rec, job.workload)
                rows.setdefault(key, []).append(v)
                if metric:
                    metrics.setdefault(key, metric)
        for point in job.points:
            asked[(job.workload.name, point, job.arm.label)] = asked.get((job.workload.name, point, job.arm.label), 0) + 1
    head = ("workload", "point", "arm", "trials ok", "metric", "median", "min", "max")
    body = []
    for key in sorted(asked):
        vals = [v for v in rows.get(key, []) if isinstance(v, (int, float))]
        metric = metrics.get(key) or next(w.primary_metric or "n/a" for w in spec.workloads if w.name == key[0])
        fmt = (lambda v: f"{v:.4g}")
        body.append((key[0], key[1] or "-", key[2], f"{len(rows.get(key, []))}/{asked[key]}", metric,
                     *(fmt(f(vals)) if vals else "n/a" for f in (median, min, max))))
    widths = [max(len(str(r[i])) for r in [head, *body]) for i in range(len(head))]
    line = "  ".join("{:<%d}" % w for w in widths)
    bar = "=" * (sum(widths) + 2 * (len(widths) - 1))
    return "\n".join([f"{' Study ' + spec.id + ' ':=^{len(bar)}}", line.format(*head), *(line.format(*r) for r in body),
                      *kv_lines(spec, jobs), bar])


def kv_lines(spec: StudySpec, jobs: list[Job]) -> list[str]:
    """Disaggregated serving (records with a `kv` block, server=vllm-pd): per arm, the KV
    transfer's mean time and its share of TTFT, beside the time the link's rate predicts for the
    bytes one transfer moved (docs/metrics.md), so what the TTFT verdict is made of is in view."""
    by: dict[tuple, list[dict]] = {}
    for job in jobs:
        for rec in job_records(spec, job):
            if rec.get("status") == "ok" and (rec.get("kv") or {}).get("xfer_ms_mean") is not None:
                by.setdefault((job.workload.name, rec.get("point") or "-", job.arm.label), []).append(rec)
    out = []
    for (workload, point, arm), recs in sorted(by.items()):
        kv, link = recs[0]["kv"], recs[0]["kv"].get("link") or {}
        shares = [r["metrics"]["kv_ttft_share"] for r in recs if r["metrics"].get("kv_ttft_share") is not None]
        text = (f"KV transfer, {workload} {point} {arm}: {median(r['kv']['xfer_ms_mean'] for r in recs):.4g} ms "
                f"(median over {len(recs)} runs of each run's mean)")
        if shares:
            text += f", {100 * median(shares):.0f}% of mean TTFT"
        if link.get("predicted_xfer_ms") is not None:
            text += (f"; the link's arithmetic: {kv['expected_bytes_per_transfer']:.0f} B at {link['rate']}'s TCP "
                     f"payload rate = {link['predicted_xfer_ms']:.4g} ms, {link['predicted_xfer_ms_after_burst']:.4g} "
                     "after tbf's burst")
        out.append(text)
    return out


@dataclass(frozen=True)
class Verdicts:
    """The study's verdicts, judged once: `text` and `code` are what `fabricbench compare` on the
    study's folder prints and exits with; `table` and `result` what the report and the clock line
    read (None where compare refused the records)."""

    text: str
    code: int
    table: object = None  # analysis.load.Table
    result: object = None  # analysis.compare.Result


def judge(spec: StudySpec) -> Verdicts:
    """Compare the study's records, as `fabricbench compare <study folder> --baseline <baseline>
    [--allow <tuned arms' keys>]` would, at the study's alpha, in this process: its lines, its
    warnings after them, its one-line refusal and its exit code."""
    from analysis import verdicts
    from analysis.load import load_table

    out, err = io.StringIO(), io.StringIO()
    table = result = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            table = load_table([str(spec.dir)])
            # tuned arms' settings are the arms
            result = verdicts.judge(table, spec.baseline.label, spec.allow, alpha=spec.alpha, where=str(spec.dir))
            for line in verdicts.lines(result, dirs=[str(spec.dir)]):
                print(line)
            if (why := verdicts.unjudged(table, result)) is not None:
                raise UsageError(why)
            code = 0
        except UsageError as e:
            code = errors.say(e)
        except Exception:  # a bug: its traceback goes into compare.txt, and the study still ends in its own words
            traceback.print_exc()
            code = 1
    return Verdicts((out.getvalue() + err.getvalue()).rstrip(), code, table, result)


def analyse(spec: StudySpec, refresh: bool, say=print, verdicts: Verdicts | None = None) -> int:
    """The verdicts (saved as compare.txt) and `fabricbench report`'s report over the study's
    records. Kept as they are when nothing new was measured."""
    out_txt, report_dir = spec.dir / "compare.txt", spec.dir / "report"
    if not refresh and out_txt.is_file() and report_dir.is_dir():
        say(out_txt.read_text().rstrip())
        return 0
    verdicts = verdicts or judge(spec)
    say(verdicts.text)
    try:
        out_txt.write_text(verdicts.text + "\n")
    except OSError as e:  # a full disk: the verdicts are on the console, the records are safe; no traceback
        out_txt.unlink(missing_ok=True)
        say(f"error: cannot write {out_txt} ({e.strerror}) on the disk mounted at {_mount(spec.dir)}: the records are "
            f"kept in {spec.dir}/*/records; free space there and rerun the same command (it measures nothing again, "
            "and writes compare.txt and the report)")
        return 1
    why = _report(verdicts, report_dir)
    say(f"report: {report_dir}" if why is None else f"warning: report failed: {why[-500:]}")
    return verdicts.code


def _report(verdicts: Verdicts, folder: Path) -> str | None:
    """Write the report of the judged verdicts into `folder`; None, or what its failure printed."""
    if verdicts.result is None:
        return verdicts.text + "\n"  # the records compare refused, the report refuses too
    from analysis.report import write_report

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            write_report(verdicts.table, verdicts.result, folder)
    except UsageError as e:
        return f"{out.getvalue()}error: {e}\n"
    except Exception:
        return out.getvalue() + traceback.format_exc()
    return None


def _mount(path: Path) -> Path:
    """The mount point of the filesystem `path` lies on (the disk a user has to free)."""
    path = path.resolve()
    dev = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == dev:
        path = path.parent
    return path


def decided(spec: StudySpec, upto: int | None = None, stop_on: tuple[str, ...] | None = None) -> tuple[int, int, list[str]]:
    """(decided, primary verdicts, their sentences) over the study's records of blocks before
    `upto` (all when None). A look judges only its own blocks: a study resumed after a failure
    may hold later blocks already, and judging those at an early look would be a look the plan
    did not spend alpha on."""
    from analysis.compare import compare_table
    from analysis.load import Table, load_table

    table = load_table([spec.dir])
    if upto is not None:
        table = Table(r for r in table if (r.study or {}).get("block", 0) < upto)
    return _decided(compare_table(table, spec.baseline.label, spec.allow, alpha=spec.alpha), stop_on)


def _decided(res, stop_on: tuple[str, ...] | None = None) -> tuple[int, int, list[str]]:
    """decided() of a comparison's result: the real arms' primaries (the A/A control's when the
    study has no other arm). Decided: what `stop_on` stops on (analysis/looks.py: by default
    faster, slower or equivalent; a difference of `detect` ruled out only with futility)."""
    from analysis import looks

    real = [(p, c) for p, c in res.comparisons if c.primary and not c.control]
    mine = real or [(p, c) for p, c in res.comparisons if c.primary]
    return (sum(looks.stops(c, stop_on or looks.STOP_ON) for _, c in mine), len(mine),
            [f"{p.label} [{c.metric}]: {c.verdict}" for p, c in mine])


def execute_sequential(spec: StudySpec, jobs: list[Job], launcher: str, looks: list[int], say=print,
                       stop_on: tuple[str, ...] | None = None) -> tuple[int, int, list[str]]:
    """Run block after block; at each look, stop when every primary verdict is decided."""
    ran = failed = 0
    failures: list[str] = []
    for k in looks:
        r, f, lines = execute(spec, [j for j in jobs if j.cell.block < k], launcher, say)
        ran, failed, failures = ran + r, failed + f, failures + lines
        if failed:
            return ran, failed, failures  # a failed run is retried by a rerun, not judged around
        n_decided, n, _ = decided(spec, k, stop_on)
        say(f"look after {k} blocks: {n_decided} of {n} primary verdict(s) decided"
            + ("; stopping" if n and n_decided == n else "" if k == looks[-1] else "; adding blocks"))
        if n and n_decided == n:
            break
    return ran, failed, failures


def run_pilot(spec: StudySpec, launcher: str, say=print) -> int:
    """Run the pilot block (resumed like any study: what it recorded is kept); the failed runs'
    count (0: every run ok)."""
    pilot = precheck.pilot_spec(spec)
    if any(a.emulated for a in pilot.arms) and os.geteuid() != 0:
        raise UsageError("--pilot: the study's emulated arms need namespaces and tc: run it as root")
    jobs = plan(pilot)
    definition(pilot.dir, "study", pilot.as_dict(), pilot.output_root)
    lock = _lock(pilot)  # noqa: F841  (held until this function returns)
    say(f"pilot {pilot.id}: one block, {len(jobs)} runs, records in {pilot.dir}")
    _, failed, failures = execute(pilot, jobs, launcher, say)
    for line in failures:
        say(f"  pilot run failed: {line}")
    return failed


def run_study(spec: StudySpec, launcher: str = "auto", say=print, plan_only: bool = False,
              max_blocks: int | None = None, stop_on: tuple[str, ...] | None = None, pilot: bool = False) -> int:
    from workloads.study.plan import make_plan

    if launcher == "auto":
        launcher = "slurm" if os.environ.get("SLURM_JOB_ID") else "local"
    checked = precheck.check(spec)  # every cell's config, before a pilot or any run (UsageError)
    if pilot and (failed := run_pilot(spec, launcher, say)):
        say(f"pilot: {failed} run(s) failed (logs above); the estimate counts the ok ones")
    the_plan = make_plan(spec, max_blocks)
    spec = replace(the_plan.spec, looks=len(the_plan.looks) if max_blocks else 1)
    for line in [*the_plan.lines(), *checked, *precheck.time_lines(the_plan, pilot)]:
        say(line)
    if plan_only:
        return 0
    if any(a.emulated for a in spec.arms) and os.geteuid() != 0:
        emu = ", ".join(a.label for a in spec.arms if a.emulated)
        raise UsageError(f"arm(s) {emu} use an emulated fabric (network namespaces and tc): run the study as root")
    jobs = plan(spec)
    _manifest(spec)
    lock = _lock(spec)  # noqa: F841  (held until this function returns)
    cells = _cells_lock(spec, say)
    try:
        return _run_locked(spec, jobs, launcher, the_plan, max_blocks, say, stop_on)
    finally:
        celllock.release(cells)


def _run_locked(spec: StudySpec, jobs: list[Job], launcher: str, the_plan, max_blocks: int | None, say,
                stop_on: tuple[str, ...] | None = None) -> int:
    """run_study once it holds the study's locks: check the code, run what is left, analyse."""
    _same_code(spec, jobs)
    if (why := extension_refusal(spec.dir, spec.id, spec.blocks)) is not None:
        raise UsageError(why)
    say(f"study {spec.id}: {len(spec.arms)} arms ({', '.join(a.label for a in spec.arms)}; baseline "
        f"{spec.baseline.label}) x {spec.blocks} blocks x {len(spec.workloads)} workload(s), design {spec.design}"
        f"{' seed ' + str(spec.seed) if spec.design != 'abba' else ''}, {launcher}; records in {spec.dir}")
    started = time.monotonic()
    if max_blocks:
        ran, failed, failures = execute_sequential(spec, jobs, launcher, the_plan.looks, say, stop_on)
    else:
        ran, failed, failures = execute(spec, jobs, launcher, say)
    say(summary_table(spec, jobs))
    verdicts = judge(spec)  # once: the clock line counts what compare.txt says
    commits = {_commit(r) for j in jobs for r in job_records(spec, j)}
    if len(commits) > 1:
        say(f"warning: the study's records come from {len(commits)} versions of the code "
            f"({'; '.join(_words(c) if c else 'no commit' for c in sorted(commits, key=str))}): "
            "the code changed during the study, and compare will not pool trials of different code")
    if ran == 0:
        say("every run of this study is recorded; nothing was run")
    code = analyse(spec, refresh=ran > 0, say=say, verdicts=verdicts)
    # last: the clock covers the compare and the report too, everything this invocation waited for
    if (line := clock_line(spec, jobs, time.monotonic() - started, verdicts)) is not None:
        say(line)
    if failed:
        say(f"{failed} run(s) failed; rerun the same command to retry them:\n  " + "\n  ".join(failures))
        return 1
    return 0 if code in (0, None) else code
