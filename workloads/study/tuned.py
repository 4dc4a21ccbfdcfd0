"""A tune's result as an arm: the derived arm file `fabricbench tune` writes, and what a study
reads from it (`arms: [{tuned: results/my-tune/tuned.yaml}]`).

    # tuned.yaml
    tune: {name: cc, id: cc, source: conf/tune/x.yaml, outcome: winner, candidate: cc-bbr,
           chosen_among: 3, verdict: "winner cc-bbr: ..."}
    label: cc-bbr                   # the arm's label in a study (default)
    fabric: emu-100m
    overrides: [...]                # the tuned arm's own overrides, then the settings as Hydra overrides
    settings: {env: {...}, overrides: {...}, sysctls: {...}}   # what the tune chose ({} when it kept the default)

Settings are the confirmed winner's only when the confirmation called it ahead of the default;
otherwise the file holds the default's (empty) settings, and says why (`outcome`). Every run of
the arm carries `tuned={tune, candidate, settings}` in its config, which the record copies into
its fingerprint (workloads/core/records.py, with_tuned).

Beside it, when the settings pin NCCL's algorithm or protocol, `nccl-tuner.conf`: the CSV read by
NCCL's example tuner plugin (NVIDIA/nccl plugins/tuner/example/nccl_tuner.conf and plugin.c, read
from NCCL_TUNER_CONFIG_FILE): `colltype,minbytes,maxbytes,algorithm,protocol,channels,nNodes,
nRanks,numPipeOps,regBuff`, -1 meaning "any" (or NCCL's default channels).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from workloads.core.config import hydra_value
from workloads.core.errors import UsageError

KINDS = ("env", "overrides", "sysctls")
FILE = "tuned.yaml"
NCCL_FILE = "nccl-tuner.conf"


def settings_overrides(settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Hydra overrides that apply `settings` ({env: {NAME: v}, overrides: {key: v}, sysctls: {name: v}})
    to an arm: the environment through the fabric profile (its names are checked when the run
    starts: fabric/profile.py), sysctls through the emulator (fabric/netns.py), the rest as given."""
    out = [f"++fabric.env.{k}={hydra_value(v)}" for k, v in sorted((settings.get("env") or {}).items())]
    out += [f"{k}={hydra_value(v)}" for k, v in sorted((settings.get("overrides") or {}).items())]
    sysctls = settings.get("sysctls") or {}
    if sysctls:
        out.append("++fabric.emulate.sysctls={" + ",".join(f"{k}:{hydra_value(v)}" for k, v in sorted(sysctls.items()))
                   + "}")
    return out


def stamp(tune: str, candidate: str, settings: Mapping[str, Mapping[str, Any]]) -> str:
    """The `tuned=` override every run of a candidate or a tuned arm carries (its fingerprint's `tuned`)."""
    body = ",".join(f"{kind}:{{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in sorted(settings[kind].items())) + "}"
                    for kind in KINDS if settings.get(kind))
    return f"tuned={{tune:{hydra_value(tune)},candidate:{hydra_value(candidate)},settings:{{{body}}}}}"


def varied_keys(settings: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Record keys (analysis/guard.py identity) the settings change outside the fabric block,
    which the guard does not ignore by itself: the stamp, and each Hydra override both where the
    config holds it and where the record repeats it in a section of its own (a run of
    collectives.op=max records config.collectives.op and collectives.op: allowing only the
    first left the confirmation of every collectives override without a comparable pair).
    The environment and sysctls live in the fabric block, which the guard never compares."""
    from analysis.guard import SECTIONS

    keys = [k.lstrip("+~") for k in sorted(settings.get("overrides") or {})]
    return ["config.tuned", *(f"config.{k}" for k in keys),
            *(k for k in keys if k.split(".", 1)[0] in SECTIONS and k.split(".", 1)[0] != "config")]


@dataclass(frozen=True)
class TunedArm:
    path: str
    label: str
    fabric: str
    overrides: tuple[str, ...]       # the arm's overrides with the settings applied, and the stamp
    settings: dict
    tune: dict
    base: tuple[str, ...] = ()       # the arm's own overrides, before the settings

    @property
    def keys(self) -> list[str]:
        return varied_keys(self.settings)


def at_default(t: TunedArm) -> TunedArm:
    """The arm as it is, without its tune's settings (a winner a study's correction across its
    tunes does not keep): stamped as the tune's default, so its records say so."""
    return TunedArm(t.path, t.label, t.fabric, (*t.base, stamp(str(t.tune.get("id")), "default", {})), {}, t.tune,
                    t.base)


def write(folder: Path, tune: Mapping[str, Any], label: str, fabric: str, arm_overrides: list[str],
          settings: Mapping[str, Mapping[str, Any]], collectives: list[str] | None = None) -> list[Path]:
    """Write tuned.yaml (and nccl-tuner.conf where NCCL's tuner format fits); returns what was written."""
    import yaml

    clean = {k: {str(n): v for n, v in (settings.get(k) or {}).items()} for k in KINDS if settings.get(k)}
    doc = {"tune": dict(tune), "label": label, "fabric": fabric, "overrides": list(arm_overrides), "settings": clean}
    head = (f"# written by `fabricbench tune` (tune {tune.get('id')}, from {tune.get('source')}); a study names it as an "
            f"arm: {{tuned: {folder / FILE}}}\n")
    out = [folder / FILE]
    (folder / FILE).write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    csv = nccl_tuner_lines(clean.get("env") or {}, collectives)
    if csv:
        (folder / NCCL_FILE).write_text("".join(line + "\n" for line in csv))
        out.append(folder / NCCL_FILE)
    else:
        (folder / NCCL_FILE).unlink(missing_ok=True)
    return out


# NCCL's names (ncclAlgoStr / ncclProtoStr, src/init.cc, what NCCL_ALGO accepts) -> the tuner
# CSV's (parseAlgorithm / parseProtocol in NVIDIA/nccl plugins/tuner/example/plugin.c, v2.30.7-1;
# ext-tuner/example up to 2.28). The CSV spellings collnet_direct, nvls_tree are not NCCL_ALGO's.
_ALGOS = {"Tree": "tree", "Ring": "ring", "CollNetDirect": "collnet_direct", "CollNetChain": "collnet_chain",
          "NVLS": "nvls", "NVLSTree": "nvls_tree", "PAT": "pat"}
_PROTOS = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}
# fabricbench's collective names -> NCCL's functions; the CSV's collective type is the lower-cased function
_COLLS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
          "broadcast": "Broadcast", "reduce": "Reduce"}
MAX_BYTES = 4294967295  # the example's upper bound: every size


def nccl_tuner_lines(env: Mapping[str, Any], collectives: list[str] | None = None) -> list[str]:
    """The tuner-plugin CSV for settings that pin, per collective, one algorithm and one protocol
    (NCCL_ALGO and NCCL_PROTO as NCCL parses them, function prefixes included; channels too when
    NCCL_MIN_NCHANNELS equals NCCL_MAX_NCHANNELS), one line per collective type measured (all
    five when none is known) that is pinned, every size, node count and rank count. [] when none
    is: the example plugin needs both an algorithm and a protocol on every line (an unknown name
    becomes ring or simple there), and a list such as Ring,Tree or a `^` exclusion is a choice
    NCCL makes per call."""
    from workloads.fabric import ncclvalues

    v = ncclvalues.runtime_version() or ncclvalues.table().versions[-1]
    a, p = str(env.get("NCCL_ALGO") or ""), str(env.get("NCCL_PROTO") or "")
    if not a or not p:
        return []
    try:
        algos = ncclvalues.parse_list(a, ncclvalues.algos(v), v, "NCCL_ALGO")
        protos = ncclvalues.parse_list(p, ncclvalues.PROTOS, v, "NCCL_PROTO")
    except ValueError:
        return []
    lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    channels = str(lo) if lo is not None and str(lo) == str(hi) else "-1"
    funcs = [_COLLS[c] for c in collectives or [] if c in _COLLS] or list(_COLLS.values())
    lines = [f"{f.lower()},0,{MAX_BYTES},{_ALGOS[next(iter(algos[f]))]},{_PROTOS[next(iter(protos[f]))]},"
             f"{channels},-1,-1,-1,-1" for f in dict.fromkeys(funcs) if len(algos[f]) == 1 and len(protos[f]) == 1]
    if not lines:
        return []
    return ["# NCCL tuner plugin config (NVIDIA/nccl plugins/tuner/example format), written by fabricbench tune",
            "# colltype,minbytes,maxbytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff", *lines]


def read(path: str | Path, what: str) -> TunedArm:
    """A study arm's `tuned:`: a tuned.yaml, or the tune's folder holding one. UsageError naming
    `what` and the fix otherwise."""
    import yaml

    p = Path(path)
    if p.is_dir():
        p = p / FILE
    if not p.is_file():
        raise UsageError(f"{what}={path}: no tune output there ({p} is missing); run `fabricbench tune <spec>` first, "
                         f"and name its {FILE} (or its folder)")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise UsageError(f"{what}={path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, Mapping) or not {"fabric", "settings", "tune"} <= set(doc):
        raise UsageError(f"{what}={path}: not a tune's {FILE} (it needs tune, fabric, settings); name the file "
                         "`fabricbench tune` wrote")
    settings = {k: dict(v) for k, v in (doc.get("settings") or {}).items() if k in KINDS and v}
    tune = dict(doc["tune"])
    overrides = [*map(str, doc.get("overrides") or []), *settings_overrides(settings),
                 stamp(str(tune.get("id")), str(tune.get("candidate") or "default"), settings)]
    return TunedArm(str(p), str(doc.get("label") or doc["fabric"]), str(doc["fabric"]), tuple(overrides), settings, tune,
                    tuple(map(str, doc.get("overrides") or [])))
