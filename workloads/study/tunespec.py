"""A tune, read from YAML and checked once before anything runs: one arm, the workloads it is
tuned on, and the settings searched.

    name: cc-delay
    arm: {fabric: emu-100m, overrides: ["fabric.emulate.latency=5ms"]}   # what is tuned; as it is, it is "the default"
    workloads:                       # as a study's: entry (a workload's name), overrides, primary, cv
      - {name: iperf, entry: link, overrides: [link.duration_s=2]}
    space:                           # every combination of these values is a candidate
      sysctls: {net.ipv4.tcp_congestion_control: [reno, cubic, bbr]}   # emulated fabrics: per-namespace TCP
      overrides: {link.streams: [1, 4]}                                # Hydra overrides
      # env: {NCCL_ALGO: ["AllReduce:Ring", "AllReduce:Tree"]}         # NCCL workloads: names and values checked
    candidates:                      # and/or named ones (settings in the same three kinds)
      - {name: small-buffers, sysctls: {net.ipv4.tcp_rmem: "4096 8192 8192"}}
    search: {runs: 12}               # successive halving's budget (default: one block per candidate per round)
    confirm: {blocks: 4}             # the winner against the default on fresh blocks (default: the fewest that call `detect`)
    detect: 10%
    margin: 2%                       # the margin within which the winner and the default are called equivalent
    cv: 5%                           # expected noise (default: per workload, workloads/catalog.py)
    seed: 0

Every problem is one line naming the field and the fix: an environment name no checker knows
or a misspelt one, an NCCL variable the NCCL that will run does not read or a value it would
fail on (a prefixless `NCCL_ALGO: Tree` leaves DDP's broadcast no algorithm), a sysctl on a fabric that is not emulated, an empty space, a search budget
that cannot give every candidate one run, a confirmation that cannot call `detect`.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from workloads.core.errors import UsageError
from workloads.study import tuned
from workloads.study.spec import Arm, StudyWorkload, _arms, _label, _overrides, _workloads, fraction, read_yaml

DEFAULT = "default"            # the arm as it is: the candidate every other must beat
MAX_CANDIDATES = 64
FIELDS = ("name", "id", "arm", "workloads", "space", "candidates", "search", "confirm", "detect", "margin",
          "cv", "alpha", "seed", "output_root", "timeout_s")


@dataclass(frozen=True)
class Candidate:
    name: str
    settings: dict                 # {env: {...}, overrides: {...}, sysctls: {...}}; {} for the default
    unchecked: tuple[str, ...] = ()   # environment names passed as deliberate (fabric.env_unchecked)

    def arm(self, base: Arm, tune_id: str, baseline: bool = False) -> Arm:
        extra = [f"++fabric.env_unchecked=[{','.join(self.unchecked)}]"] if self.unchecked else []
        return Arm(self.name, base.fabric, (*base.overrides, *tuned.settings_overrides(self.settings), *extra,
                                            tuned.stamp(tune_id, self.name, self.settings)),
                   baseline=baseline, emulated=base.emulated)

    def describe(self) -> str:
        parts = [f"{k}={v}" for kind in tuned.KINDS for k, v in sorted((self.settings.get(kind) or {}).items())]
        return ", ".join(parts) or "the arm as it is"


@dataclass(frozen=True)
class TuneSpec:
    name: str
    id: str
    arm: Arm                       # the arm tuned, as it is
    workloads: tuple[StudyWorkload, ...]
    candidates: tuple[Candidate, ...]   # the default first
    search_runs: int               # successive halving's budget in runs
    confirm_blocks: int            # blocks of the confirmation (winner against default)
    confirm_given: bool
    detect: float
    margin: float
    alpha: float
    cv: float                      # the noise the confirmation is sized on (the largest of its workloads')
    cv_source: str
    seed: int
    output_root: str
    timeout_s: float
    source: str

    @property
    def dir(self) -> Path:
        return Path(self.output_root) / self.id

    @property
    def default(self) -> Candidate:
        return self.candidates[0]

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)

    def as_dict(self) -> dict[str, Any]:
        """What defines the tune: a rerun under the same id must match it to resume."""
        return {"name": self.name, "id": self.id, "fabric": self.arm.fabric, "overrides": list(self.arm.overrides),
                "workloads": [{"name": w.name, "entry": w.entry, "overrides": list(w.overrides),
                               "primary_metric": w.primary_metric, "primary_point": w.primary_point}
                              for w in self.workloads],
                "candidates": [{"name": c.name, "settings": c.settings} for c in self.candidates],
                "search_runs": self.search_runs, "confirm_blocks": self.confirm_blocks, "detect": self.detect,
                "margin": self.margin, "alpha": self.alpha, "seed": self.seed}


def rounds(n: int) -> list[int]:
    """Candidates in each round of successive halving: n, ceil(n/2), ... down to 2."""
    out = []
    while n > 1:
        out.append(n)
        n = math.ceil(n / 2)
    return out


def round_blocks(n: int, workloads: int, budget: int) -> list[int]:
    """Blocks of each round: the budget split equally over the rounds, each round's share spread
    over its candidates (so the few left at the end are measured longest)."""
    sizes = rounds(n)
    share = budget // max(len(sizes), 1)
    return [share // (k * workloads) for k in sizes]


def search_runs_needed(n: int, workloads: int) -> int:
    """The smallest budget that gives every candidate of every round one block."""
    return len(rounds(n)) * n * workloads


def _values(raw: Any, what: str) -> list[Any]:
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise UsageError(f"{what}: an empty list of values; give at least one (or remove the name)")
    for v in vals:
        if isinstance(v, (dict, list)) or v is None:
            raise UsageError(f"{what}: {v!r} is not a value; give numbers or strings, e.g. [1, 25, 100]")
    return vals


def _check_setting(kind: str, name: str, what: str, arm: Arm, unchecked: set[str]) -> None:
    if kind == "env":
        from workloads.fabric.envnames import KNOWN
        from workloads.fabric.profile import check_env_name

        if name in unchecked:
            return
        if not any(name.upper().startswith(p) for p in KNOWN):
            raise UsageError(f"{what}.{name}: fabricbench checks only {', '.join(p + '*' for p in KNOWN)} names "
                             "(workloads/fabric/envnames.py), so a typo in this one would be tuned over silently; "
                             f"add it to space.env_unchecked: [{name}] if it is deliberate")
        try:
            check_env_name(name)
        except UsageError as e:
            raise UsageError(f"{what}.{name}: {str(e).split(': ', 1)[1]}") from None
        if name.startswith("NCCL_"):
            from workloads.fabric import ncclvalues

            if why := ncclvalues.name_problem(name, ncclvalues.runtime_version()):
                raise UsageError(f"{what}.{name}: {why} (a no-op axis)")
    elif kind == "sysctls":
        from workloads.fabric.netns import NODE_SYSCTLS

        if not arm.emulated:
            raise UsageError(f"{what}.{name}: sysctls are set in an emulated fabric's namespaces, and fabric "
                             f"{arm.fabric} is not emulated; tune an emu-* fabric, or remove sysctls")
        if name not in NODE_SYSCTLS:
            raise UsageError(f"{what}.{name}: not a per-namespace TCP setting the emulator sets; use one of "
                             f"{', '.join(NODE_SYSCTLS)}")
    else:
        key = name.lstrip("+~")
        if key.startswith("fabric."):
            raise UsageError(f"{what}.{name}: the fabric's settings are tuned through env: and sysctls:, and the "
                             "fabric itself is the arm; remove it from overrides")
        _overrides([f"{name}=x"], what)


def _settings(raw: Mapping[str, Any], what: str, arm: Arm, unchecked: set[str], lists: bool) -> dict:
    unknown = sorted(set(raw) - {*tuned.KINDS, "name", "env_unchecked"})
    if unknown:
        raise UsageError(f"{what}: unknown field(s) {', '.join(unknown)}; settings are env, overrides, sysctls")
    out = {}
    for kind in tuned.KINDS:
        block = raw.get(kind)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            raise UsageError(f"{what}.{kind} must be a mapping of name: {'[values]' if lists else 'value'}")
        for name, v in block.items():
            _check_setting(kind, str(name), f"{what}.{kind}", arm, unchecked)
            if not lists and isinstance(v, list):
                raise UsageError(f"{what}.{kind}.{name}: a named candidate takes one value; put lists of values "
                                 "under space:")
            if kind == "sysctls":
                from workloads.fabric.netns import _sysctls

                for value in _values(v, f"{what}.{kind}.{name}"):
                    try:  # a congestion control the kernel lacks, a value it refuses: here, before any run
                        _sysctls({str(name): value})
                    except UsageError as e:
                        raise UsageError(f"{what}.{kind}.{str(e).split('emulate.sysctls.', 1)[-1]}") from None
        out[kind] = {str(k): _values(v, f"{what}.{kind}.{k}") if lists else _values(v, f"{what}.{kind}.{k}")[0]
                     for k, v in block.items()}
    return out


def _short(value: Any) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(value)).strip("_") or "x"


def _space(raw: Any, arm: Arm, unchecked: set[str]) -> list[Candidate]:
    if raw is None:
        return []
    if not isinstance(raw, Mapping):
        raise UsageError("space: a mapping of env/overrides/sysctls, each name: [values]")
    axes = [(kind, name, vals) for kind, block in _settings(raw, "space", arm, unchecked, lists=True).items()
            for name, vals in block.items()]
    if not axes:
        return []  # product() of no axes is one empty combination: the default again, not a candidate
    out = []
    for combo in itertools.product(*(vals for _, _, vals in axes)):
        settings: dict[str, dict] = {}
        for (kind, name, _), v in zip(axes, combo):
            settings.setdefault(kind, {})[name] = v
        label = ".".join(f"{_short(name.rsplit('.', 1)[-1])}-{_short(v)}" for (_, name, _), v in zip(axes, combo))
        out.append(Candidate(label, settings, tuple(sorted(unchecked))))
    return out


def _named(raw: Any, arm: Arm, unchecked: set[str]) -> list[Candidate]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UsageError("candidates: a list of {name: ..., env: {...}, overrides: {...}, sysctls: {...}}")
    out = []
    for i, c in enumerate(raw):
        if not isinstance(c, Mapping) or "name" not in c:
            raise UsageError(f"candidates[{i}] needs name: and its settings (env:, overrides:, sysctls:)")
        out.append(Candidate(_label(c["name"], f"candidates[{i}].name"),
                             _settings(c, f"candidates[{i}]", arm, unchecked, lists=False), tuple(sorted(unchecked))))
    return out


def _count(raw: Any, key: str, what: str) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or set(raw) - {key}:
        raise UsageError(f"{what}: write {{{key}: N}}")
    v = raw.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise UsageError(f"{what}.{key}={v!r} must be a positive integer")
    return v


def load_tune(path: str | Path, tune_id: str | None = None, output_root: str | None = None) -> TuneSpec:
    """Read and check a tune YAML; UsageError (one line, exit 2) naming the field and the fix."""
    from workloads.study.words import modernise

    p, raw = read_yaml(path, "tune", "name, arm, workloads, space")
    raw = modernise(raw, p, "tune")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise UsageError(f"{p}: unknown field(s) {', '.join(unknown)}; a tune has {', '.join(FIELDS)}")
    name = _label(raw.get("name", p.stem), "name")
    arm, candidates = _arm_and_candidates(raw)
    workloads = _workloads(raw.get("workloads"))
    _check_nccl(arm, candidates, workloads)
    runs = _search_runs(raw, len(candidates), len(workloads))
    detect = fraction(raw.get("detect", "10%"), "detect", 0.0, 10.0)
    alpha = fraction(raw.get("alpha", 0.05), "alpha", 0.0, 0.5)
    blocks, cv, cv_source = _confirm_blocks(raw, workloads, detect, alpha)
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UsageError(f"seed={seed!r} must be an integer")
    timeout = raw.get("timeout_s", 1800)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise UsageError(f"timeout_s={timeout!r} must be a positive number of seconds (the most one run may take)")
    return TuneSpec(name=name, id=_label(tune_id or raw.get("id") or name, "id"), arm=arm, workloads=workloads,
                    candidates=candidates, search_runs=runs, confirm_blocks=blocks,
                    confirm_given=raw.get("confirm") is not None, detect=detect,
                    margin=fraction(raw.get("margin", "2%"), "margin", 0.0, 10.0), alpha=alpha, cv=cv,
                    cv_source=cv_source, seed=seed, output_root=str(output_root or raw.get("output_root") or "results"),
                    timeout_s=float(timeout), source=str(p))


def _arm_and_candidates(raw: Mapping[str, Any]) -> tuple[Arm, tuple[Candidate, ...]]:
    """The arm to tune and its candidates, the arm as it is (DEFAULT) first."""
    if not isinstance(raw.get("arm"), Mapping):
        raise UsageError("arm: the arm to tune, e.g. {fabric: emu-100m, overrides: [...]}")
    if set(raw["arm"]) - {"fabric", "overrides", "label"}:
        raise UsageError("arm: has fabric, overrides (and label); the settings to try go under space: or candidates:")
    arm = _arms([dict(raw["arm"], label=DEFAULT)], control=True)[0]  # control: _arms wants two arms to compare
    space = raw.get("space") if isinstance(raw.get("space"), Mapping) else raw.get("space")
    unchecked = {str(n) for n in ((space or {}).get("env_unchecked") or [])} if isinstance(space, Mapping) else set()
    cands = [*_space(space, arm, unchecked), *_named(raw.get("candidates"), arm, unchecked)]
    if not cands:
        raise UsageError("the search space is empty: give space: {env|overrides|sysctls: {name: [values]}} or "
                         "candidates: [{name: ..., <settings>}], at least one besides the arm as it is")
    if len(cands) + 1 > MAX_CANDIDATES:
        raise UsageError(f"the space has {len(cands)} candidates; at most {MAX_CANDIDATES - 1} (narrow the values)")
    names = [DEFAULT, *(c.name for c in cands)]
    if len({n.replace("~", "-") for n in names}) < len(names):
        raise UsageError(f"candidates: names must be unique and not {DEFAULT!r}, got {names}")
    return arm, (Candidate(DEFAULT, {}), *cands)


def _arm_env(arm: Arm) -> tuple[dict, int | None]:
    """The arm's fabric environment (its profile, then its fabric.env overrides) and node count."""
    from workloads.study.spec import _fabric_profile

    prof = _fabric_profile(arm.fabric)
    env = {str(k): None if v is None else str(v) for k, v in (prof.get("env") or {}).items()}
    for o in arm.overrides:
        m = re.fullmatch(r"[+~]*fabric\.env\.([A-Za-z0-9_]+)=(.*)", o)
        if m:
            env[m[1]] = None if o.startswith("~") or m[2] == "null" else m[2]
    nodes = (prof.get("emulate") or {}).get("nodes")
    return env, nodes if isinstance(nodes, int) else None


def _check_nccl(arm: Arm, candidates: tuple[Candidate, ...], workloads: tuple[StudyWorkload, ...]) -> None:
    """A candidate NCCL would fail on or ignore, refused before any run: NCCL_ALGO/NCCL_PROTO
    checked against the collectives these workloads call (workloads/fabric/ncclvalues.py)."""
    from workloads.fabric import ncclvalues

    base, nodes = _arm_env(arm)
    funcs = frozenset().union(*(ncclvalues.workload_functions(w.entry, w.argv) for w in workloads))
    ctx = ncclvalues.Context(functions=funcs, nodes=nodes)
    version = ncclvalues.runtime_version()
    for c in candidates[1:]:
        env = c.settings.get("env") or {}
        if not any(k.startswith("NCCL_") for k in env):
            continue
        if not funcs:
            raise UsageError(f"candidate {c.name}: sets {', '.join(sorted(env))}, and no workload of this tune "
                             f"calls an NCCL collective ({', '.join(w.entry for w in workloads)}): a no-op axis; "
                             "tune it on collectives or training workloads")
        merged = {**base, **{k: str(v) for k, v in env.items()}}
        got = ncclvalues.problems({k: v for k, v in merged.items() if k in env or k == "NCCL_COLLNET_ENABLE"
                                   or k in ("NCCL_ALGO", "NCCL_PROTO")}, ctx, version)
        if got:
            raise UsageError(f"candidate {c.name}: {got[0]}")


def _search_runs(raw: Mapping[str, Any], candidates: int, w: int) -> int:
    """search.runs, or the fewest that measure every candidate once a round."""
    need = search_runs_needed(candidates, w)
    runs = _count(raw.get("search"), "runs", "search") or need
    if runs < need:
        raise UsageError(f"search.runs={runs} is too small: successive halving over {candidates} candidates "
                         f"(the default included) x {w} workload point(s) takes {len(rounds(candidates))} rounds "
                         f"and needs at least {need} runs to measure each candidate once a round; set search: "
                         f"{{runs: {need}}} or more, or narrow the space")
    return runs


def _confirm_blocks(raw: Mapping[str, Any], workloads: tuple[StudyWorkload, ...], detect: float,
                    alpha: float) -> tuple[int, float, str]:
    """(confirm.blocks, the CV it is planned at, where that CV comes from): the blocks given, when
    they can call `detect`, else the fewest that can."""
    from analysis import stats

    w = len(workloads)
    declared = None if raw.get("cv") is None else fraction(raw["cv"], "cv")
    cvs = [(wl.cv, f"declared for {wl.name}") if wl.cv is not None else
           (declared, "declared for the tune") if declared is not None else
           (wl.kind.default_cv, f"default for {wl.entry}") for wl in workloads]
    cv, cv_source = max(cvs)
    blocks = _count(raw.get("confirm"), "blocks", "confirm")
    if blocks is None:
        blocks = stats.blocks_for(detect, w, cv, alpha)
        if blocks is None:
            raise UsageError(f"at CV {stats.pct(cv)} no confirmation up to 200 blocks can call a {stats.pct(detect)} "
                             "difference; raise detect: or tune on fewer workload points")
    elif (mde := stats.plan_mde(blocks, w, cv, alpha)) > detect:
        fix = stats.blocks_for(detect, w, cv, alpha)
        raise UsageError(f"confirm.blocks={blocks} is too small to confirm anything: at CV {stats.pct(cv)} ({cv_source}) "
                         f"the smallest difference {blocks} blocks call with 80% power is {stats.pct(mde)}, above detect "
                         f"{stats.pct(detect)}; set confirm: {{blocks: {fix}}}" + (" or more" if fix else "")
                         + ", or raise detect:")
    return blocks, cv, cv_source
