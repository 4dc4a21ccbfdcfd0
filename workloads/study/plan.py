"""A study's plan, made before its first run: the family of tests that decides, the noise it
expects, the smallest difference it can call, the blocks it needs, and its wall time.

    fabricbench study conf/study/emu-ab.yaml --plan     # print the plan, run nothing

The deciding family is one primary verdict per real arm and workload point
(docs/statistics.md); the A/A control's primaries are a family of their own. Its minimum detectable
effect (MDE) is analysis.stats.plan_mde: the paired t-test over k blocks, one real effect
among m tests judged at alpha/m (what Holm gives it), 80% power, with sd(d) = CV x sqrt(2):
the CV is defined by the block log-ratio d the test uses.

Where the CV comes from, first found wins: the study's `cv:` (per workload or study-wide);
earlier records of the same workload (same entry and overrides) under the output root:
sd(d)/sqrt(2) of their blocks (measured_cv; the study's own fabrics first), else, with no
blocked study, the within-arm spread over at least 3 runs per arm; else the workload's
default_cv (workloads/catalog.py). The plan says which. A measured CV is an estimate: the
blocks are counted on its 80% upper limit, the MDE printed at the estimate. Default `blocks`: the fewest (>= 3) whose MDE is at
most `detect`. A study that cannot call `detect` with the blocks it was given is refused before anything runs.

Sequential (`--until-decided --max-blocks N`): the verdicts are looked at after 3, 4, 6, 8,
12, 18, 24, 36, ... blocks below N (looks_at) and at N; the look after k_j blocks spends
alpha x k_j / (k_1 + ... + k_L) (analysis/looks.py: weighted Bonferroni over looks, valid whenever
the study stops), and the study stops at the first look where every primary verdict is settled:
a difference called or equivalence within the margin (with `--stop-on ...,futility`, also a
difference of `detect` ruled out by the interval). This is the only way to add blocks after a
look: a fixed study whose verdicts were printed is not extended (workloads/study/run.py,
extension_refusal).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median

from workloads.core.errors import UsageError
from workloads.core.records import iter_records
from workloads.study import iterations, served
from workloads.study.spec import StudySpec, Workload
from workloads.study.tunepower import upper as _upper
from workloads.study.window import MAX_STEPS, Choice, Costs, choose, costs_from, run_seconds, shortest
from workloads.study.words import entry_name

FIRST_LOOK = 3


def looks_at(max_blocks: int) -> list[int]:
    """The blocks after which a sequential study looks (analysis/looks.py: 16 gives 3, 4, 6, 8,
    12, 16); the verdicts read the same schedule back from the records."""
    from analysis import looks

    return looks.looks_at(max_blocks, FIRST_LOOK)


@dataclass(frozen=True)
class Plan:
    spec: StudySpec               # with `blocks` filled in
    tests: int                    # primary verdicts of the real arms (one family)
    control_tests: int            # primary verdicts of the A/A control (a family of its own)
    cv: dict[str, tuple[float, str]]   # workload -> (expected CV, where it came from)
    seconds: dict[str, float]     # workload -> median seconds per run, from earlier runs
    looks: list[int]              # [blocks] for a fixed design; the look schedule when sequential
    # workload -> an 80% upper limit of its CV (a measured CV is an estimate: blocks are counted
    # on its upper limit, so a lucky low estimate does not undersize the study); absent: the CV itself
    cv_upper: dict[str, float] = field(default_factory=dict)
    # workload -> (measured steps per run, its costs) where `window: auto` chose the window
    windows: dict[str, tuple[int, "Costs"]] = field(default_factory=dict)
    window_notes: dict[str, str] = field(default_factory=dict)   # workload -> why no window was chosen

    @property
    def family(self) -> tuple[int, str]:
        """(size, name) of the family the refusal and the default blocks are judged on."""
        return (self.tests, "primary") if self.tests else (self.control_tests, "A/A control")

    @property
    def worst_cv(self) -> float:
        return max(cv for cv, _ in self.cv.values())

    @property
    def spread(self) -> float:
        """What alpha is divided by at the last look (the cap, where the plan's MDE applies): the
        looks' total blocks over the cap's (analysis/looks.py); 1 for a fixed design."""
        return sum(self.looks) / self.looks[-1]

    @property
    def worst_cv_upper(self) -> float:
        """The largest upper limit of a CV: what the block count is sized on."""
        return max(self.cv_upper.get(name, cv) for name, (cv, _) in self.cv.items())

    def mde(self, blocks: int | None = None) -> float:
        from analysis import stats

        return stats.plan_mde(blocks or self.spec.blocks, self.family[0], self.worst_cv, self.spec.alpha, self.spread)

    def equivalence_blocks(self) -> int | None:
        """About how many blocks let two equal arms be called equivalent at the margin (80%):
        the TOST interval's half-width (each side at alpha/(m x looks), stats.Comparison.equivalent)
        plus its own wobble must fit inside the margin; never fewer than stats.MIN_EQUIVALENT."""
        from scipy import stats as sps

        from analysis import stats

        m, sd = max(self.family[0], 1), self.worst_cv * math.sqrt(2)
        level = self.spec.alpha / (m * self.spread)
        for k in range(stats.MIN_EQUIVALENT, 1001):
            if (sps.t.ppf(1 - level, k - 1) + sps.norm.ppf(0.9)) * sd / math.sqrt(k) <= math.log1p(self.spec.margin):
                return k
        return None

    def runs(self) -> int:
        return self.spec.blocks * len(self.spec.arms) * len(self.spec.workloads)

    def wall_seconds(self) -> float | None:
        if len(self.seconds) < len(self.spec.workloads):
            return None
        return sum(self.seconds[w.name] for w in self.spec.workloads) * self.spec.blocks * len(self.spec.arms)

    def lines(self) -> list[str]:
        from analysis import stats

        s = self.spec
        m, name = self.family
        out = [f"plan of study {s.id}: {len(s.arms)} arms x {len(s.workloads)} workload point(s) x {s.blocks} blocks = "
               f"{self.runs()} runs, design {s.design}"
               + (f", sequential: looks after {', '.join(map(str, self.looks))} blocks (alpha x "
                  f"{', '.join(f'{k}/{sum(self.looks)}' for k in self.looks)}: in proportion to the blocks)"
                  if len(self.looks) > 1 else "")
               + ("" if s.blocks_given else " (blocks chosen by this plan)"),
               (f"  decides: {self.tests} primary verdict(s) ({len(s.arms) - 1 - bool(self.control_tests)} arm(s) x "
                f"{len(s.workloads)} point(s)), Holm at alpha {s.alpha:g}"
                + (f"; the A/A control: {self.control_tests} verdict(s), a family of its own" if self.control_tests else ""))
               if self.tests else
               f"  an A/A study: its control's {self.control_tests} primary verdict(s) bound the bias between two runs "
               f"of one configuration, Holm at alpha {s.alpha:g}"]
        out += [f"  arm {a.label}: {a.tune_note}" for a in s.arms if a.tune_note and not a.control]
        for w in s.workloads:
            cv, src = self.cv[w.name]
            out.append(f"  {w.name} ({w.entry}): primary {w.primary_metric or w.kind.primary_text}"
                       f"{' at ' + w.primary_point if w.primary_point else ''}; expected CV {stats.pct(cv)} ({src})")
            if w.name in self.windows:
                n, c = self.windows[w.name]
                up = self.cv_upper.get(w.name, cv)
                out.append(f"    window: {n} measured {_unit(w)}s per {iterations.PER.get(w.kind.window[0], 'run')} "
                           f"({w.window}); a run "
                           f"about {c.run_s(n):.1f} s, duty cycle {100 * c.duty(n):.0f}% (measured / wall); at this "
                           f"window CV {stats.pct(cv)}, its 80% upper limit {stats.pct(up)}: can call >= "
                           f"{stats.pct(stats.plan_mde(s.blocks, max(m, 1), up, s.alpha, self.spread))} in "
                           f"{s.blocks} blocks with 80% power (at the estimate "
                           f"{stats.pct(stats.plan_mde(s.blocks, max(m, 1), cv, s.alpha, self.spread))})")
            elif w.name in self.window_notes or w.window:
                out.append(f"    window: {self.window_notes.get(w.name) or w.window}")
        n = len(s.arms)
        rows = n if n % 2 == 0 else 2 * n
        if n >= 3 and s.design in ("abba", "williams") and s.blocks % rows:
            # arm positions and carry-over pairs balance only over whole squares
            out.append(f"  design: a Williams square of {rows} rows; {s.blocks} blocks leave its balance incomplete "
                       f"(a multiple of {rows} completes it)")
        eq = self.equivalence_blocks()
        out.append(f"  can call: >= {stats.pct(self.mde())} with 80% power over the {name} family of {m} "
                   f"(asked: {stats.pct(s.detect)}); sign-flip check's smallest p {min(1.0, 2 / 2 ** s.blocks):.3g}")
        out.append(f"  equivalence within the margin +-{stats.pct(s.margin)}: needs about {eq} blocks at that noise" if eq else
                   f"  equivalence within the margin +-{stats.pct(s.margin)}: out of reach at that noise")
        wall = self.wall_seconds()
        duty = self.duty()
        out.append(f"  wall time: about {clock(wall)} ({self.runs()} runs at the median of earlier runs"
                   + (f"; duty cycle {100 * duty:.0f}% of it measured" if duty is not None else "") + ")"
                   if wall is not None else "  wall time: unknown until the first runs (the progress line then gives an ETA)")
        return out

    def duty(self) -> float | None:
        """Measured time over wall time of the study's runs, when every workload's window was chosen."""
        if not self.windows or len(self.windows) < len(self.spec.workloads):
            return None
        measured = sum(n * c.step_s for n, c in self.windows.values())
        return measured / sum(c.run_s(n) for n, c in self.windows.values())

    def refusal(self) -> str | None:
        from analysis import stats

        s = self.spec
        mde = self.mde()
        if mde <= s.detect:
            return None
        m, name = self.family
        need = stats.blocks_for(s.detect, m, self.worst_cv_upper, s.alpha, self.spread)
        fix = (f"set blocks: {need} (or leave blocks out to let the plan choose)" if need and len(self.looks) == 1 else
               f"raise --max-blocks to at least {need}" if need else "the noise is too large for any number of blocks")
        return (f"study {s.id} cannot call a {stats.pct(s.detect)} difference: with {s.blocks} blocks and {m} {name} "
                f"test{'s' if m != 1 else ''} at CV {stats.pct(self.worst_cv)} the smallest it can call (80% power) is "
                f"{stats.pct(mde)}; {fix}, raise detect:, or compare fewer arms or workload points")


def clock(s: float) -> str:
    """Seconds as m:ss, or h:mm:ss past an hour."""
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _same(w: Workload, other: dict) -> bool:
    """Another study's workload is this one: the same entry and overrides, whatever window either
    measured (a window the plan chose is an override of the steps key)."""
    # a study saved before the entry words became the catalog's names wrote train / infer
    return (entry_name(other.get("entry")) == w.entry
            and _unwindowed(w, other.get("overrides") or []) == _unwindowed(w, w.overrides))


def _unwindowed(w: Workload, overrides) -> list[str]:
    knob = w.kind.window[0] if w.kind.window else None
    return [str(o) for o in overrides if knob is None or str(o).lstrip("+~").split("=", 1)[0] != knob]


def _window_costs(earlier: list[tuple[Path, dict]], w: Workload, block_cv: float | None,
                  block_upper: float | None = None) -> tuple[Costs | None, str, int]:
    """The costs of `w`'s runs (window.py; a collectives run's iterations, iterations.py) from
    earlier studies' records and timings, or why not; and the warm-up steps those runs took
    (its override, else the records' median)."""
    records, seconds = [], []
    for folder, manifest in earlier:
        names = {o["name"] for o in manifest.get("workloads") or [] if _same(w, o)}
        if not names:
            continue
        seconds += run_seconds(folder, names)
        records += [rec for _, rec in iter_records(folder, "*/records/*.json")
                    if rec.get("status") == "ok" and (rec.get("study") or {}).get("workload") in names]
    warm = _warmup(w, records)
    if not records:
        return None, "no earlier runs to size it from", warm
    if block_cv is None:
        return None, "no measured CV of earlier blocks", warm
    key, metric = w.kind.window[0], (lambda rec: primary_of(rec, w)[0])
    read = served.reader(records, metric, lambda rec: _rank(rec, w)) if key == served.KEY else iterations.reader(key, metric)
    c = costs_from(records, seconds, block_cv, read, block_upper)
    return c, "" if c is not None else f"earlier runs lack per-{_unit(w)} samples{_NEEDS.get(key, '')} or run times", warm


# what else a sweep's earlier runs must have for their per-request samples to size its window (served.py)
_NEEDS = {served.KEY: " of the primary metric at a fixed load.num_requests (an open loop's throughput has none)"}


def _rank(rec: dict, w: Workload) -> float | None:
    """How a sweep's point record ranks for the primary point: its load, None when it is not the
    declared point or lacks the metric (the heaviest point decides when none is declared)."""
    value, level = _primary_value(rec, w)
    return None if value is None else level


def _unit(w: Workload) -> str:
    return iterations.unit(w.kind.window[0])


def _apply_windows(plan: Plan, earlier: list[tuple[Path, dict]], measured: dict[str, Noise]) -> Plan:
    """`window: auto`: for each workload that has a window (catalog), the measured steps (a
    collectives run's iterations, an inference sweep's requests per load point) with the least
    wall time at the plan's power (window.choose),
    then the shortest window that needs no more blocks than the study's slowest-to-decide
    workload; the choice becomes the workload's steps override and its `window` text, which its
    records carry. A workload the plan cannot size keeps its own window, and its text says why
    (`guessing` without earlier evidence). A study resumed keeps the windows its manifest holds."""
    pinned = _pinned_windows(plan.spec)
    costs, warmups, notes = _window_inputs(plan, earlier, measured, pinned)
    chosen = _choices(plan, costs, notes)
    return _windowed(plan, pinned, costs, chosen, _window_blocks(plan, costs, chosen), warmups, notes)


def _window_inputs(plan: Plan, earlier: list[tuple[Path, dict]], measured: dict[str, Noise],
                   pinned: dict) -> tuple[dict[str, tuple[Costs, float]], dict[str, int], dict[str, str]]:
    """Per workload the plan may size: its costs with the ratio of its CV's upper limit to the
    estimate, and its warm-up; or a note why it keeps its own window."""
    costs: dict[str, tuple[Costs, float]] = {}
    warmups: dict[str, int] = {}
    notes: dict[str, str] = {}
    for w in plan.spec.workloads:
        if w.kind.window is None or w.name in pinned:
            continue
        keys = (w.kind.window[0], *iterations.PINS.get(w.kind.window[0], ()))
        if pin := next((k for o in w.overrides if (k := str(o).lstrip("+~").split("=", 1)[0]) in keys), None):
            notes[w.name] = f"its own, pinned by its overrides ({pin})"
            continue
        noise = measured.get(w.name)
        c, why, warm = _window_costs(earlier, w, noise.cv if noise else None, noise.upper if noise else None)
        if c is None:
            notes[w.name] = f"guessing: its own window ({why}); this study's runs measure it"
            continue
        costs[w.name] = (c, (noise.upper / noise.cv) if noise and noise.cv else 1.0)
        warmups[w.name] = warm
    return costs, warmups, notes


def _choices(plan: Plan, costs: dict[str, tuple[Costs, float]], notes: dict[str, str]) -> dict[str, Choice | None]:
    """window.choose for each sized workload; a workload no window can size gets a note."""
    from analysis import stats

    spec = plan.spec
    chosen = {name: choose(c, spec.detect, max(plan.family[0], 1), spec.alpha, len(spec.arms), len(plan.looks), ratio)
              for name, (c, ratio) in costs.items()}
    for name, ch in chosen.items():
        if ch is None:
            w = next(x for x in spec.workloads if x.name == name)
            notes[name] = (f"its own: no window up to {MAX_STEPS} {_unit(w)}s calls {stats.pct(spec.detect)} at the "
                           "noise earlier runs had")
    return chosen


def _window_blocks(plan: Plan, costs: dict[str, tuple[Costs, float]], chosen: dict[str, Choice | None]) -> int | None:
    """The blocks the windows are fitted to: the user's `blocks` (a fixed design), else the study's
    slowest-to-decide workload at its best window (a sequential cap only bounds it); None when no
    window was chosen."""
    from analysis import stats

    spec, m, looks = plan.spec, max(plan.family[0], 1), len(plan.looks)
    best = [ch.blocks for ch in chosen.values() if ch]
    if not best:
        return None
    if spec.blocks_given and looks == 1:
        return spec.blocks  # blocks pinned by the user: the windows that reach the power in them
    if spec.blocks_given:
        return min(spec.blocks, max(best))
    others = [stats.blocks_for(spec.detect, m, plan.cv_upper.get(w.name, plan.cv[w.name][0]), spec.alpha, looks)
              for w in spec.workloads if w.name not in costs]
    return max([k for k in others if k] + best)


def _windowed(plan: Plan, pinned: dict, costs: dict[str, tuple[Costs, float]], chosen: dict[str, Choice | None],
              blocks: int | None, warmups: dict[str, int], notes: dict[str, str]) -> Plan:
    """The plan with each workload's window: resumed from the manifest, chosen (the shortest that
    calls in `blocks`: its steps override, its CV at that window), or its own with the note."""
    spec, m, looks = plan.spec, max(plan.family[0], 1), len(plan.looks)
    workloads, windows, cv, upper = [], {}, dict(plan.cv), dict(plan.cv_upper)
    for w in spec.workloads:
        if w.name in pinned:
            w = replace(w, overrides=pinned[w.name][0], window=pinned[w.name][1])
        elif blocks is not None and chosen.get(w.name) is not None:
            c, ratio = costs[w.name]
            n = shortest(c, blocks, spec.detect, m, spec.alpha, looks, ratio) or chosen[w.name].steps
            key, unit = w.kind.window[0], _unit(w)
            why = (f"chosen: run overhead {c.overhead_s:.1f} s, {unit} {1000 * c.step_s:.1f} ms"
                   f"{iterations.WHAT.get(key, '')}, between-run sd {100 * c.between:.1f}%, {unit} sd "
                   f"{100 * c.within:.1f}% over {c.steps_before}-{unit} windows")
            w = replace(w, overrides=(*_unwindowed(w, w.overrides), f"{key}={warmups[w.name] + n}"), window=why)
            windows[w.name] = (n, c)
            cv[w.name] = (c.cv(n), f"at the chosen window: sqrt(between^2 + {unit}^2/{n}) from earlier runs")
            upper[w.name] = c.sized(n, ratio)
        elif w.name in notes:
            w = replace(w, window=notes[w.name])  # the records say why, and a rerun keeps it
        workloads.append(w)
    seconds = {**plan.seconds, **{name: c.run_s(n) for name, (n, c) in windows.items()}}
    return replace(plan, spec=replace(spec, workloads=tuple(workloads)), cv=cv, cv_upper=upper, windows=windows,
                   window_notes=notes, seconds=seconds)


def _pinned_windows(spec: StudySpec) -> dict[str, tuple[tuple[str, ...], str]]:
    """The windows an earlier run of this same study chose (its manifest): a rerun resumes with them."""
    try:
        manifest = json.loads((spec.dir / "study.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {o["name"]: (tuple(o.get("overrides") or ()), o["window"])
            for o in manifest.get("workloads") or [] if o.get("window")}


def _warmup(w: Workload, records: list[dict]) -> int:
    """The warm-up steps the workload's steps key counts (its override, else what earlier records
    say); 0 where that key counts the measured steps alone (collectives.iters)."""
    key = w.kind.window[1]
    if key is None:
        return 0
    for o in w.overrides:
        if str(o).lstrip("+~").split("=", 1)[0] == key:
            return int(str(o).split("=", 1)[1])
    seen = [int((rec.get("samples") or {}).get("warmup_steps") or 0) for rec in records]
    return int(median(seen)) if seen else 0


def _earlier(spec: StudySpec) -> list[tuple[Path, dict]]:
    """(study folder, manifest) of every study under the output root, this one included."""
    root = Path(spec.output_root)
    out = []
    for manifest in sorted(root.glob("*/study.json")) if root.is_dir() else []:
        try:
            out.append((manifest.parent, json.loads(manifest.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return out


def primary_of(rec: dict, w: Workload):
    """(metric, value, run) of the primary metric in one record: the study's declared metric,
    else the workload's own (workloads/catalog.py), the one its verdict is called on."""
    from analysis.compare import expand, primary_metric
    from analysis.load import run_from_record

    r = run_from_record(rec)
    metric = (expand([w.primary_metric], r.metrics) or [None])[0] if w.primary_metric else primary_metric(r.workload, r.metrics)
    return metric, (r.metric(metric) if metric else None), r


def _primary_value(rec: dict, w: Workload) -> tuple[float | None, float]:
    """(value of the workload's primary metric, load level) of one record."""
    _, value, r = primary_of(rec, w)
    level = r.coords.get("concurrency", r.coords.get("rate", math.inf))
    if w.primary_point is not None and r.point != w.primary_point:
        return None, level
    return value, level


@dataclass(frozen=True)
class Noise:
    """A measured CV: its estimate, an 80% upper limit (the block count is sized on it), and where
    it came from, said in the plan."""

    cv: float
    upper: float
    source: str


def measured_cv(earlier: list[tuple[Path, dict]], w: Workload, fabrics: set[str] | frozenset = frozenset()) -> Noise | None:
    """The noise of what the verdict tests, from earlier ok runs of this workload.

    The verdict's paired t-test sees the within-block log-ratio d, so its spread is what sizes a
    study: CV = sd(d) / sqrt(2), pooled over every pair of arms within the blocks of earlier
    studies (each pair's mean removed: its real difference is not noise). The between-run spread
    of one arm is the wrong variance for a paired design: drift between blocks inflates it,
    though pairing removes it (11 blocks planned where 4 suffice), while an order effect inside
    a block adds to sd(d) and not to it (65% power at the plan's MDE). Only without a blocked
    study does the plan fall back to the pooled within-arm sd, and says so. Earlier studies of
    this study's own `fabrics` are preferred, and named."""
    logs: dict[tuple, list[tuple[float, float]]] = {}
    cells: dict[tuple, dict[str, list[tuple[float, float]]]] = {}  # (folder, block) -> arm -> [(level, log)]
    fabric_of: dict[tuple, str] = {}
    for folder, manifest in earlier:
        names = [o["name"] for o in manifest.get("workloads") or [] if _same(w, o)]
        arms = {a.get("label"): a.get("fabric") for a in manifest.get("arms") or []}
        for _, rec in iter_records(folder, "*/records/*.json") if names else ():
            st = rec.get("study") or {}
            if rec.get("status") != "ok" or st.get("workload") not in names:
                continue
            v, level = _primary_value(rec, w)
            if v is not None and v > 0:
                arm = st.get("arm")
                logs.setdefault((folder.name, arm), []).append((level, math.log(v)))
                fabric_of[(folder.name, arm)] = str(arms.get(arm) or (rec.get("fabric") or {}).get("name"))
                if st.get("block") is not None:
                    cells.setdefault((folder.name, st["block"]), {}).setdefault(arm, []).append((level, math.log(v)))
    # inference: the heaviest load point of each arm (the primary point when none is declared)
    top = {key: max(lv for lv, _ in vals) for key, vals in logs.items()}
    pairs: dict[tuple, list[float]] = {}
    for (folder, _), by_arm in cells.items():
        means = {arm: [x for lv, x in vals if lv == top[(folder, arm)]] for arm, vals in by_arm.items()}
        means = {arm: sum(xs) / len(xs) for arm, xs in means.items() if xs}
        for a in sorted(means):
            for b in sorted(means):
                if a < b:
                    pairs.setdefault((folder, a, b), []).append(means[a] - means[b])
    own = {k: d for k, d in pairs.items() if fabric_of[(k[0], k[1])] in fabrics and fabric_of[(k[0], k[2])] in fabrics}
    use = {k: d for k, d in (own or pairs).items() if len(d) >= 2}
    dof = sum(len(d) - 1 for d in use.values())
    if dof >= 2:
        ss = sum(sum((x - sum(d) / len(d)) ** 2 for x in d) for d in use.values())
        sd = math.sqrt(ss / dof) / math.sqrt(2)
        names = sorted({fabric_of[(k[0], a)] for k in use for a in k[1:]})
        where = f"{'' if own else 'other fabrics: '}{', '.join(names)}"
        return Noise(max(sd, 0.005), max(_upper(sd, dof), 0.005),  # a floor: no study is noise-free
                     f"sd of the block log-ratio / sqrt 2 over {sum(len(d) for d in use.values())} earlier blocks "
                     f"({where}); blocks sized on its 80% upper limit {100 * _upper(sd, dof):.1f}%")
    groups = [[x for lv, x in vals if lv == top[key]] for key, vals in logs.items()]
    groups = [g for g in groups if len(g) >= 3]
    if not groups:
        return None
    dof = sum(len(g) - 1 for g in groups)
    ss = sum(sum((x - sum(g) / len(g)) ** 2 for x in g) for g in groups)
    n = sum(len(g) for g in groups)
    sd = math.sqrt(ss / dof)
    return Noise(max(sd, 0.005), max(_upper(sd, dof), 0.005),
                 f"measured over {n} earlier runs, within arm: no blocked study to measure the block log-ratio; "
                 f"blocks sized on its 80% upper limit {100 * _upper(sd, dof):.1f}%")


def _seconds(earlier: list[tuple[Path, dict]], w: Workload) -> float | None:
    spent = [t for folder, manifest in earlier
             for t in run_seconds(folder, {o["name"] for o in manifest.get("workloads") or [] if _same(w, o)})]
    return median(spent) if spent else None


def make_plan(spec: StudySpec, max_blocks: int | None = None) -> Plan:
    """The plan for `spec`; `max_blocks` makes it sequential. Fills in `blocks` when the study
    left it out. Raises UsageError (exit 2) when the plan cannot call `detect`."""
    cv: dict[str, tuple[float, str]] = {}
    upper: dict[str, float] = {}
    measured: dict[str, Noise] = {}
    earlier = _earlier(spec)
    fabrics = {a.fabric for a in spec.arms}
    for w in spec.workloads:
        if w.cv is not None:
            cv[w.name] = (w.cv, "declared for the workload")
        elif spec.cv is not None:
            cv[w.name] = (spec.cv, "declared for the study")
        elif (got := measured_cv(earlier, w, fabrics)) is not None:
            cv[w.name], upper[w.name] = (got.cv, got.source), got.upper
            measured[w.name] = got
        else:
            cv[w.name] = (w.kind.default_cv, f"default for {w.entry}; no earlier runs")
    control = any(a.control for a in spec.arms)
    real = len(spec.arms) - 1 - int(control)
    tests, control_tests = real * len(spec.workloads), int(control) * len(spec.workloads)
    seconds = {w.name: t for w in spec.workloads if (t := _seconds(earlier, w)) is not None}
    if max_blocks is not None:
        if max_blocks < FIRST_LOOK:
            raise UsageError(f"--max-blocks {max_blocks}: a sequential study looks first after {FIRST_LOOK} blocks; "
                             f"give at least {FIRST_LOOK}")
        spec = replace(spec, blocks=max_blocks, blocks_given=True)
        plan = Plan(spec, tests, control_tests, cv, seconds, looks_at(max_blocks), upper)
        return _checked(_apply_windows(plan, earlier, measured) if spec.window == "auto" else plan)
    plan = Plan(spec, tests, control_tests, cv, seconds, [spec.blocks or 1], upper)
    if spec.window == "auto":
        plan = _apply_windows(plan, earlier, measured)
        spec = plan.spec
    if not spec.blocks_given:
        from analysis import stats

        m = plan.family[0]
        k = stats.blocks_for(spec.detect, m, plan.worst_cv_upper, spec.alpha)
        if k is None:
            raise UsageError(f"study {spec.id}: at CV {stats.pct(plan.worst_cv)} no number of blocks up to 200 can call "
                             f"a {stats.pct(spec.detect)} difference over {m} tests; raise detect: or compare fewer points")
        plan = replace(plan, spec=replace(spec, blocks=k), looks=[k])
    return _checked(plan)


def _checked(plan: Plan) -> Plan:
    if (why := plan.refusal()) is not None:
        raise UsageError(why)
    return plan
