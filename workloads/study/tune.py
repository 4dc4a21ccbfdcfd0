"""Run a tune: search the settings of one arm, then confirm the winner against the default.

    fabricbench tune conf/tune/emu-cc.yaml          # or a name from conf/tune/
    fabricbench tune my-tune.yaml --plan            # the plan and its number of runs; nothing runs
    fabricbench tune my-tune.yaml --id cc-0601 --output-root /shared/results

(The command: workloads/commands/tune.py.) The tune prints its plan (candidates, rounds, blocks, runs) before its first run. Search:
successive halving (workloads/study/halving.py), each round a small study of its candidates in
interleaved blocks (`<tune folder>/search-<round>/`). Confirm: the winner against the default
on fresh blocks, ABBA (`<tune folder>/confirm/`), judged by compare's verdicts. Then
`<tune folder>/tuned.yaml`, the arm a study names (`arms: [{tuned: <tune folder>}]`), and
`tune.txt`, what it said. A rerun resumes: every phase's finished runs are kept (the study's
own resume), the rounds are decided again from their records, and only missing runs run.

Exit status: 0 every run ok and judged, 1 a run failed (rerun to retry it) or the confirmation's runs gave
no verdict (the line says why), 2 bad input, 130/143 interrupted.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

from workloads.core import celllock
from workloads.core.errors import UsageError
from workloads.core.records import iter_records, overlapped
from workloads.study import halving, tuned, tunepower
from workloads.study.plan import primary_of
from workloads.study.run import Job, _belongs, _cells_lock, _lock, _manifest, _same_code, definition, execute
from workloads.study.run import plan as study_plan
from workloads.study.spec import StudySpec
from workloads.study.tunespec import DEFAULT, TuneSpec, round_blocks, rounds


def phase_spec(tune: TuneSpec, phase: str, names: list[str], blocks: int, seed: int) -> StudySpec:
    """One phase (a search round or the confirmation) as a study of its candidates, in the tune's
    folder: interleaved blocks, ABBA for two, a Williams square for more (the order rotates from
    block to block, so no candidate always runs first or after the same other)."""
    arms = tuple(tune.candidate(n).arm(tune.arm, tune.id, baseline=i == 0) for i, n in enumerate(names))
    return StudySpec(name=tune.name, id=phase, arms=arms, workloads=tune.workloads, blocks=blocks,
                     design="abba" if len(arms) == 2 else "williams", seed=seed, output_root=str(tune.dir),
                     timeout_s=tune.timeout_s, source=tune.source, detect=tune.detect, margin=tune.margin,
                     cv=tune.cv, blocks_given=True, alpha=tune.alpha)


def search_phases(tune: TuneSpec) -> list[tuple[int, int]]:
    """(candidates, blocks) of each search round."""
    sizes = rounds(len(tune.candidates))
    return list(zip(sizes, round_blocks(len(tune.candidates), len(tune.workloads), tune.search_runs)))


def plan_lines(tune: TuneSpec, family: int = 1) -> list[str]:
    from analysis import stats

    w = len(tune.workloads)
    level = tune.alpha / max(family, 1)
    phases = search_phases(tune)
    search = sum(n * b * w for n, b in phases)
    confirm = 2 * tune.confirm_blocks * w
    arm = tune.arm.fabric + (f" with {' '.join(tune.arm.overrides)}" if tune.arm.overrides else "")
    out = [f"plan of tune {tune.id}: {search + confirm} runs = search {search} + confirmation {confirm} "
           f"(none of the confirmation's if the search keeps the default); arm {arm}",
           f"  candidates: {len(tune.candidates)}, the default (the arm as it is) included:"]
    out += [f"    {c.name}: {c.describe()}" for c in tune.candidates]
    swept = sorted({k for c in tune.candidates for k in (c.settings.get("sysctls") or {})})
    if swept:
        from workloads.fabric.netns import namespace_default

        # the default is what a new node namespace starts with: the host's congestion control
        # (bbr on some kernels, cubic on others), the kernel's own buffer sizes
        out[-len(tune.candidates)] += " (" + ", ".join(f"{k.rsplit('.', 1)[-1]}={namespace_default(k) or '?'}"
                                                     for k in swept) + ", read from a new namespace)"
    out += [f"  workloads: {', '.join(f'{wl.name} ({wl.entry}, primary {wl.primary_metric or wl.kind.primary_text})' for wl in tune.workloads)}",
            f"  search: successive halving, {len(phases)} round(s): "
            + "; ".join(f"round {r + 1}: {n} candidates x {b} block(s) x {w} workload(s) = {n * b * w} runs"
                        for r, (n, b) in enumerate(phases))
            + f" (budget {tune.search_runs}); blocks interleaved, the order rotated from block to block",
            f"  confirm: the winner against the default on {tune.confirm_blocks} fresh blocks, ABBA; planned to call >= "
            f"{stats.pct(stats.plan_mde(tune.confirm_blocks, w, tune.cv, level))} with 80% power over {w} primary "
            f"verdict(s) at CV {stats.pct(tune.cv)} ({tune.cv_source}; asked: {stats.pct(tune.detect)}), Holm at alpha "
            f"{tune.alpha:g}" + (f"/{family} (one of the study's {family} tunes)" if family > 1 else "")
            + "; re-sized on the noise the search measures before it starts" + ("" if not tune.confirm_given else
                                                                             " (the blocks declared are kept)")
            + "; " + (f"equivalence within ±{stats.pct(tune.margin)} needs about {eq} blocks at that noise"
                                   if (eq := _eq_blocks(tune)) else
                                   f"equivalence within ±{stats.pct(tune.margin)}: out of reach at that noise"),
            "  the search's scores choose, they are never the gain: the winner of k noisy candidates is biased "
            "upward (the winner's curse); the gain reported is the confirmation's"]
    return out


def _eq_blocks(tune: TuneSpec) -> int | None:
    from workloads.study.plan import Plan

    spec = phase_spec(tune, "confirm", [DEFAULT, tune.candidates[1].name], tune.confirm_blocks, tune.seed)
    return Plan(spec, len(tune.workloads), 0, {w.name: (tune.cv, "") for w in tune.workloads}, {}, [1]).equivalence_blocks()


def _good_paths(spec: StudySpec) -> set[Path]:
    """Records of the phase that no other run of it overlapped (records.overlapped: measured beside another)."""
    every = list(iter_records(spec.dir, "*/records/*.json"))
    bad = {every[i][0] for i in overlapped([r for _, r in every])}
    return {p for p, _ in every} - bad


def job_value(spec: StudySpec, job: Job, good: set[Path]) -> tuple[float, str] | None:
    """(primary value, metric) of one job: the declared load point's, else the heaviest point's."""
    best = None
    for p, rec in iter_records(job.records_dir(spec)):
        if p not in good or rec.get("status") != "ok" or not _belongs(spec, job, rec):
            continue
        metric, v, r = primary_of(rec, job.workload)
        if metric is None or not isinstance(v, (int, float)) or not v > 0:
            continue
        if job.workload.primary_point is not None and r.point != job.workload.primary_point:
            continue
        level = r.coords.get("concurrency", r.coords.get("rate", math.inf))
        if best is None or level > best[0]:
            best = (level, float(v), metric)
    return None if best is None else (best[1], best[2])


def round_scores(spec: StudySpec, jobs: list[Job], seen: dict[str, list] | None = None) -> dict[str, float]:
    """Each candidate's search score: block_scores per workload, averaged over the workloads
    (`seen`: workload -> each round's log values, appended, from which the noise is measured)."""
    from analysis.compare import direction

    good = _good_paths(spec)
    names = [a.label for a in spec.arms]
    total = {n: 0.0 for n in names}
    for w in spec.workloads:
        logs: dict[str, list[float | None]] = {n: [None] * spec.blocks for n in names}
        hib = True
        for job in jobs:
            if job.workload.name != w.name:
                continue
            got = job_value(spec, job, good)
            if got is not None:
                logs[job.arm.label][job.cell.block] = math.log(got[0])
                hib = direction(got[1])[0]
        if seen is not None:
            seen.setdefault(w.name, []).append(logs)
        for n, s in halving.block_scores(logs, hib).items():
            total[n] += s / len(spec.workloads)
    return total


def confirmation(spec: StudySpec, tune: TuneSpec, winner: str, alpha: float | None = None) -> tuple[list, str]:
    """The confirmation's primary verdicts of the winner against the default (compare's own code),
    and, when there is none, why. The keys the candidates' settings change are allowed to differ
    (they are the arm)."""
    from analysis.compare import compare_table
    from analysis.load import load_table

    allow = sorted({*tuned.varied_keys(tune.candidate(winner).settings), "config.tuned"})
    res = compare_table(load_table([str(spec.dir)]), DEFAULT, allow=allow,
                        alpha=tune.alpha if alpha is None else alpha)
    got = [c for _, c in res.comparisons if c.primary and not c.control and c.arm == winner]
    if got:
        return got, ""
    if res.refusals:
        why = "compare refuses the pair: " + res.refusals[0].message()
    elif res.excluded_summary():
        why = res.excluded_summary()
    elif res.unmatched:
        why = res.unmatched_summary() or "no point has runs of both arms"
    else:
        why = "no block holds an ok run with the primary metric of both arms"
    return [], why


def _phase(spec: StudySpec, launcher: str, say) -> tuple[int, int, list[str], list[Job]]:
    """Run what is missing of one phase, under the study's own locks and resume."""
    jobs = study_plan(spec)
    _manifest(spec)
    lock = _lock(spec)  # noqa: F841  (held until this function returns)
    cells = _cells_lock(spec, say)
    try:
        _same_code(spec, jobs)
        ran, failed, failures = execute(spec, jobs, launcher, say)
    finally:
        celllock.release(cells)
    return ran, failed, failures, jobs


RECORDS_DIGEST = "tune.records"  # the records the verdict in tune.txt was reached on


def records_digest(folder: Path) -> str:
    """One hash over every record of a tune's phases (names and bytes): reading them is a few
    milliseconds, composing and judging them again is seconds a cell."""
    import hashlib

    h = hashlib.sha256()
    for p in sorted(folder.glob("*/*/records/*.json")):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _finished_earlier(tune: TuneSpec, plan_only: bool, say) -> bool:
    """A tune of this id ran before: its definition must be this one (else one line, before
    anything is composed or printed), and when it finished its verdict is said again."""
    if not (tune.dir / "tune.json").is_file():
        return False
    definition(tune.dir, "tune", tune.as_dict(), tune.output_root)
    if plan_only or not (tune.dir / "tune.txt").is_file() or not (tune.dir / tuned.FILE).is_file():
        return False
    digest = tune.dir / RECORDS_DIGEST
    if not digest.is_file() or digest.read_text().strip() != records_digest(tune.dir):
        return False  # a run's folder gone or a record changed since the verdict: judge again
    # finished: its verdict and arm stand (a rerun would measure nothing and judge the same
    # records), so say them again rather than re-reading every round's records
    say(f"tune {tune.id}: finished earlier, nothing to run ({tune.dir}/tune.txt): "
        f"{(tune.dir / 'tune.txt').read_text().strip()}")
    say(f"tuned arm: {tune.dir / tuned.FILE}; a study names it as {{tuned: {tune.dir}}}; to measure "
        "again, pass --id <new id>")
    return True


def _confirm(tune: TuneSpec, winner: str, conf, launcher: str, say):
    """The winner against the default on fresh blocks: the verdicts, or the exit code of a
    confirmation that failed or reached none."""
    say(conf.line)
    spec = phase_spec(tune, "confirm", [DEFAULT, winner], conf.blocks, tune.seed + 1000)
    say(f"confirm: {winner} ({tune.candidate(winner).describe()}) against the default on {conf.blocks} "
        "fresh blocks")
    _, failed, failures, _ = _phase(spec, launcher, say)
    if failed:
        return _failed(failures, say)
    verdicts, why = confirmation(spec, tune, winner, conf.alpha)
    if not verdicts:
        # every run is recorded and ok, so a rerun would measure nothing and say the same: the
        # tune is not done, and tuned.yaml is left as it was (a study naming it is not handed a
        # "nothing was confirmed" that no measurement said)
        say(f"error: tune {tune.id}: the confirmation of {winner} reached no verdict: {why} "
            f"(its runs are kept under {spec.dir})")
        return 1
    return verdicts


def run_tune(tune: TuneSpec, launcher: str = "auto", say=print, plan_only: bool = False, family: int = 1) -> int:
    """`family`: the tunes a study runs together (each is then judged at alpha / family)."""
    if launcher == "auto":
        launcher = "slurm" if os.environ.get("SLURM_JOB_ID") else "local"
    if _finished_earlier(tune, plan_only, say):
        return 0
    # every candidate x workload composed and checked (a bad key, a sysctl the kernel lacks) before
    # the plan is printed: a refused tune says only why, not a plan it will never run
    first = phase_spec(tune, "search-1", [c.name for c in tune.candidates], 1, tune.seed)
    try:
        study_plan(first)
    except UsageError as e:
        raise _unknown_key(tune, str(e)) or e from None
    for line in plan_lines(tune, family):
        say(line)
    if plan_only:
        return 0
    if tune.arm.emulated and os.geteuid() != 0:
        raise UsageError(f"fabric {tune.arm.fabric} is emulated (network namespaces and tc): run the tune as root")
    definition(tune.dir, "tune", tune.as_dict(), tune.output_root)
    lock = _lock(SimpleNamespace(dir=tune.dir, id=tune.id), "tune")  # noqa: F841  (one run of this tune at a time)
    failed_lines: list[str] = []
    seen: dict[str, list] = {}

    def measure(r: int, names: list[str], blocks: int) -> dict[str, float]:
        spec = phase_spec(tune, f"search-{r + 1}", names, blocks, tune.seed + r)
        say(f"search round {r + 1}: {len(names)} candidates ({', '.join(names)}) x {blocks} block(s)")
        _, failed, failures, jobs = _phase(spec, launcher, say)
        if failed:
            failed_lines.extend(failures)
            raise _Failed
        scores = round_scores(spec, jobs, seen)
        kept = halving.keep(scores, names)
        say(f"  round {r + 1} search scores (mean within-block log difference from the block mean; they choose, "
            f"they are not the gain): " + ", ".join(f"{n} {100 * math.expm1(s):+.1f}%" for n, s in scores.items())
            + f"; kept {', '.join(kept)}")
        return scores

    try:
        winner, _ = halving.successive_halving([c.name for c in tune.candidates], [b for _, b in search_phases(tune)],
                                               measure)
    except _Failed:
        return _failed(failed_lines, say)
    except ValueError as e:  # ok runs without the primary metric: nothing to rank them by
        say(f"error: {e}: the runs are ok but hold no primary value to rank (see the records under {tune.dir}); "
            "declare the metric to tune on (workloads[].primary), then rerun: the runs are kept")
        return 1
    k = len(tune.candidates)
    conf = tunepower.size([tunepower.residual_sd(seen.get(w.name, [])) for w in tune.workloads], tune.confirm_blocks,
                          tune.confirm_given, tune.cv, tune.detect, len(tune.workloads), tune.alpha, family)
    if winner == DEFAULT:
        result = halving.outcome(winner, DEFAULT, k, [])
    else:
        verdicts = _confirm(tune, winner, conf, launcher, say)
        if isinstance(verdicts, int):
            return verdicts
        result = halving.outcome(winner, DEFAULT, k, verdicts)
    return _finish(tune, result, say, conf, family)


def _unknown_key(tune: TuneSpec, message: str) -> UsageError | None:
    """Hydra's "Could not override 'k'" for a key the tune's settings name, said as the tune's
    field: the key is misspelt, and Hydra's hint to add it with `+` would only hide that."""
    import re

    m = re.search(r"Could not override '([^']+)'", message)
    if not m:
        return None
    key = m.group(1)
    for c in tune.candidates:
        if key in {k.lstrip("+~") for k in c.settings.get("overrides") or {}}:
            return UsageError(f"overrides: {key} (candidate {c.name}): the workloads' config has no such key; correct "
                              f"its spelling (the config groups are in conf/), or write +{key} to add a new one")
    return None


class _Failed(Exception):
    """A run of a search round failed: the round is not judged around it."""


def _failed(failures: list[str], say) -> int:
    say(f"{len(failures)} run(s) failed; rerun the same command to retry them (finished runs are kept):\n  "
        + "\n  ".join(failures))
    return 1


def _collectives(tune: TuneSpec) -> list[str]:
    """The collectives the tune measured (for the NCCL tuner file's lines)."""
    from workloads import CONF_DIR
    from workloads.core.config import compose

    out: list[str] = []
    for w in tune.workloads:
        if w.entry == "collectives":
            cfg = compose(CONF_DIR, [*w.argv, f"fabric={tune.arm.fabric}"])
            out += [str(o) for o in cfg.collectives.ops]
    return out


def _finish(tune: TuneSpec, result: halving.Outcome, say, conf: tunepower.Confirm, family: int) -> int:
    settings = tune.candidate(result.winner).settings if result.adopted else {}
    chosen = result.winner if result.adopted else DEFAULT
    info = {"name": tune.name, "id": tune.id, "source": tune.source, "outcome": result.kind, "candidate": chosen,
            "search_winner": result.winner, "chosen_among": len(tune.candidates), "verdict": result.sentence,
            # what a study of several tunes reads to correct across them (workloads/study/tunepower.py)
            "p": tunepower.tune_p(result.comparisons), "alpha": tune.alpha, "level": conf.alpha, "family": family,
            "confirm_blocks": conf.blocks, "mde": conf.mde}
    label = f"{tune.name}-tuned"
    written = tuned.write(tune.dir, info, label, tune.arm.fabric, list(tune.arm.overrides), settings, _collectives(tune))
    (tune.dir / "tune.txt").write_text(result.sentence + "\n")
    (tune.dir / RECORDS_DIGEST).write_text(records_digest(tune.dir) + "\n")
    say(f"tune {tune.id}: {result.sentence}")
    say(f"tuned arm ({'the winner' if result.adopted else 'the default: nothing was confirmed'}): "
        + ", ".join(str(p) for p in written) + f"; a study names it as {{tuned: {tune.dir}}}")
    return 0
