"""A study, read from YAML and checked once: arms x workloads x blocks in a design.

    name: emu-ab                     # the study; its id (default: the name) names its folder
    arms:                            # each a fabric profile plus optional Hydra overrides
      - {label: emu-veth, fabric: emu-veth, baseline: true}
      - {label: emu-100m, fabric: emu-100m}
      # or a tune's confirmed best: {tuned: results/<tune id>, label: ...} (docs/tune.md)
    workloads:                       # entry: a workload of workloads/catalog.py (pretrain, finetune, collectives, inference, ...)
      - {name: allreduce, entry: collectives, overrides: [collectives.minbytes=1M, collectives.maxbytes=1M]}
        # optional per workload: primary: {metric: ..., point: c8}   cv: 5%
    blocks: 8                        # each arm once per block; default: the fewest that can call `detect` (the plan)
    detect: 10%                      # the smallest difference the study must be able to call
    margin: 2%                       # the margin within which two arms are called equivalent
    cv: 5%                           # expected run-to-run noise; default: earlier records, else per entry
    window: auto                     # the plan sizes each run's measured window (training); default fixed
    design: abba                     # abba (2 arms; Williams for 3+) | williams | permuted (seeded)
    seed: 0
    control: false                   # true adds an A/A arm: the baseline again as <baseline>~aa

Everything that can be wrong is found here, before any cell runs: each message names the
field and the fix. A sweep in a workload's overrides (`train.micro_batch_size=1,2,4`) is
expanded into one workload point per combination, each its own cell. The words are the
record's (`study.blocks`, `study.margin`, `workload`); the ones a spec wrote before (`trials:`,
`equivalence:`, `entry: train` / `infer`) still load for a release (workloads/study/words.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from workloads import CONF_DIR, REPO_ROOT, catalog
from workloads.core.errors import UsageError

DESIGNS = ("abba", "williams", "permuted")
CONTROL_SUFFIX = "~aa"
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~-]*$")
# Decided by the study for each cell; an arm or workload setting them would break the design.
_RESERVED = ("fabric", "run_id", "output_root", "trial", "study")


@dataclass(frozen=True)
class Arm:
    label: str
    fabric: str
    overrides: tuple[str, ...] = ()
    baseline: bool = False
    control: bool = False          # the A/A arm: the baseline's settings under another label
    emulated: bool = False         # the fabric has an emulate: block (run through launch/emulate.py)
    # a tuned arm (`tuned: <tune output>`): the record keys its settings change beside the fabric's,
    # which compare allows to differ between arms (they are the arm: workloads/study/tuned.py)
    tuned_keys: tuple[str, ...] = ()
    tune_note: str = ""            # a tuned arm: its tune's outcome, level and MDE (the plan prints it)


@dataclass(frozen=True)
class StudyWorkload:
    name: str                      # unique within the study; part of every cell's run_id
    entry: str                     # the workload of workloads/catalog.py, by its name (the record's `workload`)
    overrides: tuple[str, ...] = ()
    primary_metric: str | None = None   # declared; None: the workload's default (analysis/compare.py)
    primary_point: str | None = None    # inference: the load point that decides ("c8"); None: the heaviest
    cv: float | None = None             # expected noise of the primary metric, when declared
    window: str | None = None           # the measured window the plan chose and why (`window: auto`)

    @property
    def kind(self) -> catalog.Workload:
        return catalog.get(self.entry)

    @property
    def script(self) -> str:
        return self.kind.script

    @property
    def argv(self) -> tuple[str, ...]:
        return (*self.kind.overrides, *self.overrides)


# the name before StudyWorkload (catalog.Workload is what a workload is); study/plan.py and
# study/run.py still read it, edited elsewhere this round
Workload = StudyWorkload


@dataclass(frozen=True)
class StudySpec:
    name: str
    id: str
    arms: tuple[Arm, ...]
    workloads: tuple[StudyWorkload, ...]
    blocks: int
    design: str
    seed: int
    output_root: str
    timeout_s: float
    source: str                    # the YAML it came from
    detect: float = 0.10           # the difference the plan must be able to call (a fraction)
    margin: float = 0.02           # equivalence margin (a fraction)
    cv: float | None = None        # expected noise for every workload, when declared
    blocks_given: bool = True      # False: `blocks` was chosen by the plan
    alpha: float = 0.05
    looks: int = 1                 # a sequential study's planned looks (workloads/study/plan.py)
    window: str = "fixed"          # auto: the plan sizes each run's measured window (workloads/study/window.py)
    # the ranks each run has where the study runs (nodes x GPUs per node): the plan checks every workload at it
    # (workloads/study/precheck.py); None: launcher.nproc_per_node, this host's self-launch. Not identity.
    world: int | None = None

    @property
    def trials(self) -> int:
        """`blocks`, by its name before (kept for a release)."""
        return self.blocks

    @property
    def trials_given(self) -> bool:
        """`blocks_given`, by its name before (kept for a release)."""
        return self.blocks_given

    @property
    def baseline(self) -> Arm:
        return next(a for a in self.arms if a.baseline)

    @property
    def dir(self) -> Path:
        return Path(self.output_root) / self.id

    def arm(self, label: str) -> Arm:
        return next(a for a in self.arms if a.label == label)

    @property
    def allow(self) -> list[str]:
        """Record keys compare lets differ between this study's arms beyond the fabric: its tuned
        arms' settings (each arm is the fabric at its tune's best)."""
        return sorted({k for a in self.arms for k in a.tuned_keys})

    def as_dict(self) -> dict[str, Any]:
        """What defines the study (not where it runs): a rerun must match it to resume."""
        return {"name": self.name, "id": self.id, "design": self.design, "seed": self.seed,
                "detect": self.detect, "margin": self.margin, "looks": self.looks,
                **({"window": self.window} if self.window != "fixed" else {}),
                "arms": [{"label": a.label, "fabric": a.fabric, "overrides": list(a.overrides),
                          "baseline": a.baseline, "control": a.control} for a in self.arms],
                "workloads": [{"name": w.name, "entry": w.entry, "overrides": list(w.overrides),
                               "primary_metric": w.primary_metric, "primary_point": w.primary_point,
                               **({"window": w.window} if w.window else {})}
                              for w in self.workloads]}


def _fabric_profile(name: str) -> dict:
    import yaml

    path = Path(CONF_DIR) / "fabric" / f"{name}.yaml"
    if not path.is_file():
        have = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise UsageError(f"fabric={name} has no profile conf/fabric/{name}.yaml; present: {', '.join(have)}")
    return yaml.safe_load(path.read_text()) or {}


def _label(value: Any, what: str) -> str:
    s = str(value or "")
    if not _LABEL.match(s):
        raise UsageError(f"{what}={value!r}: use letters, digits and . _ ~ - (it names folders and run ids)")
    return s


def _overrides(value: Any, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise UsageError(f"{what} must be a list of Hydra overrides, e.g. [train.micro_batch_size=1]")
    out = tuple(str(o) for o in value)
    for o in out:
        key = o.lstrip("+~").split("=", 1)[0]
        if key in _RESERVED or key.startswith("fabric."):
            if key.startswith("fabric.") and what.startswith("arms"):
                continue  # an arm may tune its own fabric (fabric.env.NCCL_IB_HCA=...)
            raise UsageError(f"{what}: {o!r} sets {key}, which the study decides per cell; "
                             "remove it (fabrics are arms, blocks are `blocks:`)")
        if o.startswith("-"):
            raise UsageError(f"{what}: {o!r} is a flag, not a Hydra override")
    return out


class TuneFirst(UsageError):
    """Tuned arms name tune specs whose output is not there yet: `fabricbench study` runs those
    tunes first (workloads/commands/study.py), `--plan` prints their plans."""

    def __init__(self, tunes: list[tuple[str, str]], family: int = 1):
        self.tunes = tunes  # (tune file, output root) of each
        self.family = family  # the tunes the study's arms name, run and then corrected together
        super().__init__(f"arm(s) tuned by {', '.join(t for t, _ in tunes)}: the tune has not run yet under "
                         f"{tunes[0][1]}; `fabricbench study` runs it first (or run `fabricbench tune` yourself)")


def _arms(raw: Any, control: bool, output_root: str = "results") -> tuple[Arm, ...]:
    if not isinstance(raw, list) or len(raw) < 1:
        raise UsageError("arms: give a list of at least one arm, e.g. [{label: ib, fabric: ib, baseline: true}, "
                         "{label: roce, fabric: roce}]")
    arms, pending, tuned_at = [], [], {}
    refs = {str(_tune_output(str(a["tuned"]), output_root)[0]) for a in raw
            if isinstance(a, Mapping) and a.get("tuned") is not None}
    for i, a in enumerate(raw):
        if isinstance(a, Mapping) and a.get("tuned") is not None:
            folder, tune_file = _tune_output(str(a["tuned"]), output_root)
            if tune_file is not None and not (folder / "tuned.yaml").is_file():
                pending.append((tune_file, output_root))
                arms.append(Arm(f"pending-{i}", "loopback"))  # a stand-in until the tune has run
                continue
            tuned_at[len(arms)] = (a, i, folder)
            arms.append(None)
            continue
        if not isinstance(a, Mapping) or "fabric" not in a:
            raise UsageError(f"arms[{i}] needs at least fabric: <profile> (and label:, overrides:, baseline:), or "
                             "tuned: <a tune's output>")
        fabric = _label(a["fabric"], f"arms[{i}].fabric")
        emulated = _fabric_profile(fabric).get("emulate") is not None
        arms.append(Arm(_label(a.get("label", fabric), f"arms[{i}].label"), fabric,
                        _overrides(a.get("overrides"), f"arms[{i}].overrides"), bool(a.get("baseline")),
                        emulated=emulated))
    if pending:
        raise TuneFirst(list(dict.fromkeys(pending)), len(refs))  # two arms may share one tune
    for j, arm in _tuned_arms(tuned_at).items():
        arms[j] = arm
    if sum(a.baseline for a in arms) > 1:
        raise UsageError("arms: more than one has baseline: true; mark exactly one")
    if not any(a.baseline for a in arms):
        arms[0] = Arm(**{**arms[0].__dict__, "baseline": True})  # the first arm, as compare's default
    if control:
        b = next(a for a in arms if a.baseline)
        arms.append(Arm(b.label + CONTROL_SUFFIX, b.fabric, b.overrides, False, True, b.emulated, b.tuned_keys))
    labels = [a.label for a in arms]
    if len({lab.replace("~", "-") for lab in labels}) < len(labels):  # run ids spell ~ as -
        raise UsageError(f"arms: labels must be unique (with ~ read as -), got {labels}")
    if len(arms) < 2:
        raise UsageError("a study needs two arms to compare (or one arm with control: true for an A/A study)")
    return tuple(arms)


def _tune_output(ref: str, output_root: str) -> tuple[Path, str | None]:
    """(the tune's output, the tune file) of a tuned arm's `tuned:`: a tune's folder or its
    tuned.yaml (no tune file), or a tune spec (a path, or a name from conf/tune/), whose output
    is `<the study's output root>/<tune id>`."""
    import yaml

    p = Path(ref)
    if not p.is_file() and (Path(REPO_ROOT) / "conf" / "tune" / f"{ref}.yaml").is_file():
        p = Path(REPO_ROOT) / "conf" / "tune" / f"{ref}.yaml"
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError:
            doc = None
        if isinstance(doc, Mapping) and "arm" in doc and "settings" not in doc:  # a tune spec, not its output
            return Path(output_root) / str(doc.get("id") or doc.get("name") or p.stem), str(p)
    return Path(ref), None


def _tuned_arms(at: Mapping[int, tuple[Mapping[str, Any], int, Path]]) -> dict[int, Arm]:
    """Arms at their tunes' confirmed best: `{tuned: results/<tune id>, label: ..., baseline: ...}`
    (the fabric and settings come from the tune's tuned.yaml; workloads/study/tuned.py). Several
    tunes are one family: their winners stand only where Holm over the tunes' p-values keeps them
    (workloads/study/tunepower.py); the others run at their default, and the plan says so."""
    from workloads.study import tuned, tunepower

    read = {}
    for j, (a, i, folder) in at.items():
        if set(a) - {"tuned", "label", "baseline"}:
            raise UsageError(f"arms[{i}]: a tuned arm has tuned:, label: and baseline: only (its fabric and settings "
                             "are the tune's); tune again to change them")
        read[j] = tuned.read(str(folder), f"arms[{i}].tuned")
    tunes = list(dict.fromkeys(t.path for t in read.values()))
    first = {t.path: t for t in read.values()}
    ps = [float(first[p].tune.get("p", 0.0 if first[p].settings else 1.0)) for p in tunes]
    alpha = min((float(first[p].tune.get("alpha", 0.05)) for p in tunes), default=0.05)
    keep = dict(zip(tunes, tunepower.family_keep(ps, alpha)))
    out = {}
    for j, t in read.items():
        a, i, _ = at[j]
        note = tunepower.note(t.tune, len(tunes), bool(t.settings) and not keep[t.path])
        if t.settings and not keep[t.path]:
            t = tuned.at_default(t)
        fabric = _label(t.fabric, f"arms[{i}].tuned's fabric")
        out[j] = Arm(_label(a.get("label", t.label), f"arms[{i}].label"), fabric, t.overrides, bool(a.get("baseline")),
                     emulated=_fabric_profile(fabric).get("emulate") is not None, tuned_keys=tuple(t.keys),
                     tune_note=note)
    return out


def fraction(value: Any, what: str, low: float = 0.0, high: float = 1.0) -> float:
    """'2%', 2% written as 0.02, or a number: a fraction in (low, high); a UsageError naming `what` otherwise."""
    text = str(value).strip()
    try:
        f = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        f = math.nan
    if isinstance(value, bool) or not low < f < high:
        raise UsageError(f"{what}={value!r}: write a percentage such as 5% (or the fraction 0.05), "
                         f"between {100 * low:g}% and {100 * high:g}%")
    return f


def _primary(value: Any, what: str, entry: str) -> tuple[str | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, str):
        value = {"metric": value}
    if not isinstance(value, Mapping) or set(value) - {"metric", "point"}:
        raise UsageError(f"{what} is {{metric: <record metric>, point: <load point, e.g. c8>}}")
    if value.get("point") is not None and not catalog.get(entry).served:
        raise UsageError(f"{what}.point: only inference sweeps have load points; remove it")
    metric = None if value.get("metric") is None else str(value["metric"])
    if metric is not None:
        from analysis.compare import direction

        direction(metric) if not any(ch in metric for ch in "*?[") else None  # a metric with no direction is refused now
    return metric, None if value.get("point") is None else str(value["point"])


def _workloads(raw: Any) -> tuple[StudyWorkload, ...]:
    from workloads.core.config import expand_sweep

    if not isinstance(raw, list) or not raw:
        raise UsageError("workloads: give a list, e.g. [{name: ar, entry: collectives, overrides: [...]}]")
    out = []
    for i, w in enumerate(raw):
        if not isinstance(w, Mapping) or catalog.get(str(w.get("entry"))) is None:
            raise UsageError(f"workloads[{i}].entry must be one of {', '.join(catalog.CATALOG)}")
        unknown = sorted(set(w) - {"name", "entry", "overrides", "primary", "cv"})
        if unknown:
            raise UsageError(f"workloads[{i}]: unknown field(s) {', '.join(unknown)}; a workload has name, entry, "
                             "overrides, primary, cv")
        name = _label(w.get("name", w["entry"]), f"workloads[{i}].name")
        metric, point = _primary(w.get("primary"), f"workloads[{i}].primary", str(w["entry"]))
        cv = None if w.get("cv") is None else fraction(w["cv"], f"workloads[{i}].cv")
        points = expand_sweep(list(_overrides(w.get("overrides"), f"workloads[{i}].overrides")))
        for k, point_overrides in enumerate(points):
            out.append(StudyWorkload(name if len(points) == 1 else f"{name}-p{k}", catalog.get(str(w["entry"])).name,
                                     tuple(point_overrides),
                                metric, point, cv))
    names = [w.name for w in out]
    if len(set(names)) < len(names):
        raise UsageError(f"workloads: names must be unique, got {names}")
    return tuple(out)


def read_yaml(path: str | Path, kind: str, fields: str) -> tuple[Path, Mapping]:
    """(file, mapping) of a study or tune YAML: a path, or a name from conf/<kind>/
    (`fabricbench study emu-ab`); UsageError naming the file and the fix otherwise."""
    import yaml

    p = Path(path)
    if not p.is_file() and (Path(REPO_ROOT) / "conf" / kind / f"{path}.yaml").is_file():
        p = Path(REPO_ROOT) / "conf" / kind / f"{path}.yaml"
    if not p.is_file():
        raise UsageError(f"no {kind} file {path}; give a YAML path or a name from conf/{kind}/")
    try:
        raw = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise UsageError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, Mapping):
        raise UsageError(f"{p}: a {kind} is a mapping with {fields}")
    return p, raw


def load_spec(path: str | Path, study_id: str | None = None, output_root: str | None = None) -> StudySpec:
    """Read and check a study YAML. Raises UsageError naming the field and the fix."""
    from workloads.study.words import modernise

    p, raw = read_yaml(path, "study", "name, arms, workloads, blocks")
    raw = modernise(raw, p, "study")
    fields = ("name", "id", "arms", "workloads", "blocks", "design", "seed", "control", "output_root", "timeout_s",
              "detect", "margin", "cv", "alpha", "window", "world")
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise UsageError(f"{p}: unknown field(s) {', '.join(unknown)}; a study has {', '.join(fields)}")
    name = _label(raw.get("name", p.stem), "name")
    blocks = raw.get("blocks")
    if blocks is not None and (not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 2):
        raise UsageError(f"blocks={blocks!r} must be an integer >= 2 (each arm runs once per block; leave it out and "
                         "the plan chooses the fewest that can call the study's `detect`)")
    design = str(raw.get("design", "abba"))
    if design not in DESIGNS:
        raise UsageError(f"design={design!r}; use abba (2 arms; Williams for 3 or more), williams (balanced for "
                         "carry-over) or permuted (seeded, within blocks)")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UsageError(f"seed={seed!r} must be an integer")
    timeout = raw.get("timeout_s", 1800)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"timeout_s={timeout!r} must be a positive number of seconds (the most one run may take, "
                         "e.g. timeout_s: 1800)")
    root = str(output_root or raw.get("output_root") or "results")
    arms = _arms(raw.get("arms"), bool(raw.get("control", False)), root)
    window = str(raw.get("window", "fixed"))
    if window not in ("fixed", "auto"):
        raise UsageError(f"window={raw.get('window')!r}: use auto (the plan sizes each run's measured window from "
                         "earlier runs) or fixed (each workload's own steps); pin one workload's window with its "
                         "overrides, e.g. train.steps=60")
    world = raw.get("world")
    if world is not None and (not isinstance(world, int) or isinstance(world, bool) or world < 1):
        raise UsageError(f"world={world!r} must be a positive integer: the ranks each run has (nodes x GPUs per "
                         "node, e.g. world: 16 for 2 nodes of 8 GPUs)")
    if design == "abba" and len(arms) > 2:
        # ABBA reversal does not balance carry-over over 3+ arms (the middle arm is never first
        # and never follows itself); Williams' square is its generalisation and equals ABBA for 2
        design = "williams"
    return StudySpec(name=name, id=_label(study_id or raw.get("id") or name, "id"), arms=arms,
                     workloads=_workloads(raw.get("workloads")), blocks=blocks or 0, design=design, seed=seed,
                     output_root=root, timeout_s=float(timeout),
                     source=str(p), detect=fraction(raw.get("detect", "10%"), "detect", 0.0, 10.0),
                     margin=fraction(raw.get("margin", "2%"), "margin", 0.0, 10.0),
                     cv=None if raw.get("cv") is None else fraction(raw["cv"], "cv"),
                     blocks_given=blocks is not None, alpha=fraction(raw.get("alpha", 0.05), "alpha", 0.0, 0.5),
                     window=window, world=world)
