"""NCCL's variables checked the way the NCCL that will run reads them: whether this release reads
the name at all (nccl_versions.tsv, from each release's NCCL_PARAM / ncclGetEnv sites; see
tools/nccl_env_table.py), and whether NCCL_ALGO / NCCL_PROTO leave every collective the
workload runs an algorithm and protocol NCCL can use.

The grammar, from NVIDIA/nccl src/graph/tuning.cc:
- 2.24 and later (`parseList`, v2.24.3-1 onwards, unchanged to v2.30.7-1): `[Func:]list[;Func:list]`,
  `^` before a list excludes it, names compared case-insensitively with `ncclFuncStr` /
  `ncclAlgoStr` / `ncclProtoStr` (src/init.cc). A prefixless entry sets all five functions, and
  only the first entry may lack a prefix ("All entries except the first must have a prefix").
  An unknown name fails communicator init ("Unrecognized element token", ncclInvalidUsage).
- before 2.24 (v2.5.7-1 .. v2.23.4-1): one list for every function, `^` excludes, and an unknown
  name is skipped without a word, so `allreduce:tree` there enables nothing.

What each algorithm can run (`ncclTopoTuneModel`, v2.30.7-1 tuning.cc:294-303; the same since
v2.23.4-1, AllGather/ReduceScatter Ring-only up to v2.18.6-1 and Ring/NVLS/CollNetDirect in
v2.19-v2.22): Broadcast and Reduce only Ring; AllGather and ReduceScatter Ring, NVLS,
CollNetDirect and PAT; AllReduce everything but PAT. NVLS, NVLSTree, PAT and CollNet run only
the Simple protocol. And what it needs (`ncclTopoTuneModel`'s disable loop, v2.30.7-1 :499-510):
CollNetDirect/CollNetChain need CollNet (a CollNet plugin, e.g. SHARP, and NCCL_COLLNET_ENABLE=1),
CollNetDirect an NVSwitch; NVLS across nodes needs CollNet too (NVLink SHARP within the node,
SHARP between); NVLSTree needs more than one node; PAT one GPU per node (tuning.cc:220).
A function left with nothing fails its first call: "No algorithm/protocol available for
function ..." (src/enqueue.cc).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

from workloads import catalog

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
PROTOS = ("LL", "LL128", "Simple")
SIMPLE_ONLY = {"NVLS", "NVLSTree", "PAT", "CollNetDirect", "CollNetChain"}
TABLE = Path(__file__).with_name("nccl_versions.tsv")
VERSION_ENV = "FB_NCCL_VERSION"   # the NCCL the runs load, when it is not this Python's (an image's)

Version = tuple[int, int, int]


def algos(v: Version) -> tuple[str, ...]:
    base = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree")
    return (*base, "PAT") if v >= (2, 23, 0) else base


def can_run(func: str, algo: str, v: Version) -> bool:
    if func in ("Broadcast", "Reduce"):
        return algo == "Ring"
    if func in ("AllGather", "ReduceScatter"):
        if v < (2, 19, 0):
            return algo == "Ring"
        return algo in ("Ring", "NVLS", "CollNetDirect") or (algo == "PAT" and v >= (2, 23, 0))
    return algo != "PAT"


def parse_version(text: str) -> Version | None:
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?", text.strip())
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def show(v: Version) -> str:
    return ".".join(map(str, v))


@functools.lru_cache(maxsize=1)
def runtime_version() -> Version | None:
    """The NCCL the runs will load: FB_NCCL_VERSION if set (an image's NCCL), else the
    nvidia-nccl wheel this environment's torch loads, else torch's own (a source build)."""
    from importlib import metadata

    if os.environ.get(VERSION_ENV):
        return parse_version(os.environ[VERSION_ENV])
    for dist in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        try:
            return parse_version(metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

        got = torch.cuda.nccl.version()
        return tuple(got) if isinstance(got, tuple) else None
    except Exception:  # noqa: BLE001 - a CPU-only or ROCm build has no NCCL to ask
        return None


@dataclass(frozen=True)
class Table:
    versions: tuple[Version, ...]
    read: dict[str, tuple[bool, ...]]
    kind: dict[str, str]

    def column(self, v: Version) -> int:
        """The release the table has for v: the same minor's nearest at or below it (NCCL
        does not add or drop variables within a minor), the newest past the table's end."""
        same = [i for i, t in enumerate(self.versions) if t[:2] == v[:2]]
        if same:
            below = [i for i in same if self.versions[i] <= v]
            return below[-1] if below else same[0]
        older = [i for i, t in enumerate(self.versions) if t < v]
        return older[-1] if older else 0


@functools.lru_cache(maxsize=1)
def table() -> Table:
    rows = [line.rstrip("\n").split("\t") for line in TABLE.read_text().splitlines() if not line.startswith("#")]
    versions = tuple(parse_version(c) for c in rows[0][2:])
    return Table(versions, {r[0]: tuple(c == "+" for c in r[2:]) for r in rows[1:]}, {r[0]: r[1] for r in rows[1:]})


def name_problem(name: str, v: Version | None) -> str | None:
    """Why NCCL v would not read this name (None: it does, or the table does not know it)."""
    t = table()
    if name not in t.read or v is None:
        return None
    i, read = t.column(v), t.read[name]
    if read[i]:
        return None
    seen = [j for j, r in enumerate(read) if r]
    if max(seen) < i:
        gone = show(t.versions[max(seen) + 1])
        return (f"NCCL {show(v)} does not read it: no release from {gone} on reads it (last read by "
                f"{show(t.versions[max(seen)])}), so it would be ignored; remove it")
    return (f"NCCL {show(v)} does not read it yet (of the releases checked, {show(t.versions[min(seen)])} is the "
            "first that does), so it would be ignored; remove it, or run a newer NCCL (FB_NCCL_VERSION names "
            "the one an image holds)")


def int_problem(name: str, value: str) -> str | None:
    """An NCCL_PARAM is read with strtoll(value, NULL, 0): trailing text is dropped and a value
    with no digits reads as 0, with no warning (src/misc/param.cc ncclLoadParam)."""
    if table().kind.get(name) != "int" or value == "":
        return None
    if re.fullmatch(r"\s*[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", value):
        return None
    m = re.match(r"\s*[+-]?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9][0-9]*)", value)
    read = m.group(0).strip() if m else "0"
    return (f"NCCL reads {value!r} as the integer {read} (strtoll drops the rest, without a warning); "
            "give a plain integer, e.g. bytes rather than 4M")


@dataclass(frozen=True)
class Context:
    """What the check knows about the runs: the NCCL functions the workloads call, and the
    shape of the job (None: not known; only what holds for every shape is refused)."""
    functions: frozenset[str] = frozenset(FUNCS)
    nodes: int | None = None
    ranks_per_node: int | None = None
    collnet: bool = False            # NCCL_COLLNET_ENABLE=1 in the same environment


def parse_list(value: str, elems: tuple[str, ...], v: Version, var: str) -> dict[str, set[str]]:
    """{function: enabled elements}, as NCCL v's parseList leaves them; ValueError with NCCL's
    own reason where NCCL would fail or silently enable nothing."""
    enabled = {f: set(elems) for f in FUNCS}
    low = {e.lower(): e for e in elems}
    if v < (2, 24, 0):
        body = value
        exclude = body.startswith("^")
        body = body[1:] if exclude else body
        toks = [t for t in body.split(",") if t]
        bad = [t for t in toks if t.lower() not in low]
        if bad:
            hint = (f"; function prefixes ({bad[0]}) came in NCCL 2.24, and {show(v)} reads one list for every "
                    "function" if ":" in bad[0] else "")
            raise ValueError(f"NCCL {show(v)} skips the unknown name {bad[0]!r} without a word (names: "
                             f"{', '.join(elems)}){hint}")
        chosen = {low[t.lower()] for t in toks}
        return {f: (set(elems) - chosen) if exclude else chosen for f in FUNCS}
    entries = [e for e in value.split(";") if e]
    for k, entry in enumerate(entries):
        parts = [p for p in entry.split(":") if p]
        if len(parts) > 2:
            raise ValueError(f"{entry!r} has two ':'; NCCL reads only up to the second and drops the rest; write "
                             f"Func:{elems[0]},...")
        if len(parts) == 1:
            if k:
                raise ValueError(f"{entry!r} has no function prefix, and NCCL refuses that after the first entry "
                                 "(\"All entries except the first must have a prefix\"); write e.g. AllReduce:"
                                 f"{parts[0]}")
            prefix, items = None, parts[0]
        else:
            prefix, items = parts
        if prefix is not None and prefix.lower() not in {f.lower() for f in FUNCS}:
            raise ValueError(f"NCCL fails init on the function {prefix!r} (\"Unrecognized prefix token\"); "
                             f"functions: {', '.join(FUNCS)}")
        exclude = items.startswith("^")
        toks = [t for t in (items[1:] if exclude else items).split(",") if t]
        bad = [t for t in toks if t.lower() not in low]
        if bad:
            near = {"nvls_tree": "NVLSTree", "collnet_direct": "CollNetDirect", "collnet_chain": "CollNetChain"}
            fix = f" ({bad[0]!r} is the tuner file's spelling; NCCL_ALGO's is {near[bad[0].lower()]})" \
                if bad[0].lower() in near else ""
            raise ValueError(f"NCCL fails init on {bad[0]!r} (\"Unrecognized element token\"){fix}; names: "
                             f"{', '.join(elems)}")
        chosen = {low[t.lower()] for t in toks}
        for f in FUNCS:
            if prefix is None or prefix.lower() == f.lower():
                enabled[f] = (set(elems) - chosen) if exclude else chosen
    return enabled


def _usable(algo: str, func: str, ctx: Context, v: Version) -> str | None:
    """Why algo cannot run func here (None: it can, as far as the context knows)."""
    if not can_run(func, algo, v):
        return f"NCCL has no {algo} {func}"
    if algo.startswith("CollNet") and not ctx.collnet:
        return f"{algo} needs CollNet (a CollNet/SHARP plugin and NCCL_COLLNET_ENABLE=1)"
    if algo == "NVLS" and (ctx.nodes or 1) > 1 and not ctx.collnet:
        return "NVLS across nodes needs CollNet (SHARP) besides the NVSwitch"
    if algo == "NVLSTree" and ctx.nodes == 1:
        return "NVLSTree needs more than one node"
    if algo == "PAT" and ctx.ranks_per_node is not None and ctx.ranks_per_node > 1:
        return "PAT runs only with one GPU per node"
    return None


def algo_proto_problem(env: dict[str, str], ctx: Context, v: Version | None) -> str | None:
    """The first reason NCCL_ALGO / NCCL_PROTO in env would fail or be ignored, in one line."""
    v = v or table().versions[-1]
    a_val, p_val = env.get("NCCL_ALGO"), env.get("NCCL_PROTO")
    try:
        algo_on = parse_list(a_val, algos(v), v, "NCCL_ALGO") if a_val else None
    except ValueError as e:
        return f"NCCL_ALGO={a_val}: {e}"
    try:
        proto_on = parse_list(p_val, PROTOS, v, "NCCL_PROTO") if p_val else None
    except ValueError as e:
        return f"NCCL_PROTO={p_val}: {e}"
    for func in (f for f in FUNCS if f in ctx.functions):
        algs = algo_on[func] if algo_on else set(algos(v))
        protos = proto_on[func] if proto_on else set(PROTOS)
        if not protos:
            return f"NCCL_PROTO={p_val} enables no protocol for {func}, so its first call fails; keep one"
        why = {a: _usable(a, func, ctx, v) for a in sorted(algs) if can_run(func, a, v)}
        ok = [a for a, w in why.items() if w is None and (a not in SIMPLE_ONLY or "Simple" in protos)]
        if not ok:
            runs = [a for a in algos(v) if can_run(func, a, v)]
            reasons = "; ".join([*([f"NCCL runs {func} only as {', '.join(runs)}"] if set(algs) - set(runs) else []),
                                 *(w or f"{a} runs only the Simple protocol" for a, w in why.items())])
            what = f"NCCL_ALGO={a_val}" if a_val else f"NCCL_PROTO={p_val}"
            fix = f"AllReduce:{a_val}" if a_val and ":" not in a_val and ";" not in a_val and func != "AllReduce" \
                else "an algorithm it can run"
            return (f"{what} leaves {func} no algorithm ({reasons}), so NCCL {show(v)} fails its first {func} "
                    f"(\"No algorithm/protocol available\"); the workloads run {', '.join(sorted(ctx.functions))}: "
                    f"write {fix}")
    return None


def problems(env: dict[str, str], ctx: Context | None = None, v: Version | None = None) -> list[str]:
    """Every NCCL_* setting in env NCCL v would reject or ignore, one line each ('NAME=value: why')."""
    ctx = ctx or Context()
    collnet = str(env.get("NCCL_COLLNET_ENABLE") or "0").strip()
    if collnet not in ("", "0") and not ctx.collnet:
        from dataclasses import replace

        ctx = replace(ctx, collnet=True)
    out = []
    for name, value in sorted(env.items()):
        if not name.startswith("NCCL_") or value is None:
            continue
        if why := name_problem(name, v):
            out.append(f"{name}: {why}")
        elif why := int_problem(name, str(value)):
            out.append(f"{name}={value}: {why}")
    if why := algo_proto_problem({k: str(x) for k, x in env.items() if x is not None}, ctx, v):
        out.append(why)
    return out


# collectives' ops in NCCL_ALGO's names; what every other workload calls is the catalog's
# (Workload.nccl_functions). alltoall and send/recv are NCCL P2P, which NCCL_ALGO does not steer.
OP_FUNCS = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
            "broadcast": "Broadcast", "reduce": "Reduce"}


def workload_functions(entry: str, overrides: tuple[str, ...] | list[str]) -> frozenset[str]:
    if entry == "collectives":
        ops = ["all_reduce"]  # conf/workload/collectives.yaml's default
        for o in overrides:
            m = re.fullmatch(r"\+*collectives\.ops=\[?([^\]]*)\]?", o)
            if m:
                ops = [x.strip() for x in m[1].split(",") if x.strip()]
        if "all" in ops:
            ops = list(OP_FUNCS)
        # the harness's barrier and job-wide averages are all_reduces; average=rank0 broadcasts
        extra = {"AllReduce"} | ({"Broadcast"} if any(re.fullmatch(r"\+*collectives\.average=rank0", o)
                                                      for o in overrides) else set())
        return frozenset({OP_FUNCS[o] for o in ops if o in OP_FUNCS} | extra)
    called = catalog.field(entry, "nccl_functions")
    return frozenset(FUNCS if called is None else called)
