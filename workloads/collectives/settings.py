"""Pure pieces of a collective sweep: the checked settings, sizes, traffic patterns, formatting.

`Settings.from_config` checks the collectives: section once and returns one frozen plan,
nested by reader (Sweep, Timing, Checks, Grouping, P2P, External, Faults), so each module
receives the parts it uses. No process group here, so everything is checkable before one
exists (and unit-tested).
Option names and meanings follow nccl-tests' flags (-b -e -i -f -n -w -d -o -r -c -a).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from workloads.collectives import ops
from workloads.core.errors import UsageError

AVERAGES = ("rank0", "mean", "min", "max")  # nccl-tests -a 0/1/2/3; mean is its default
PATTERNS = ("all", "one_per_node", "pairs")
P2P_TESTS = ("latency", "bw", "bibw")


def parse_size(value: Any, key: str) -> int:
    """Bytes from 1024, "1K", "32M", "1G" (binary units, as nccl-tests' parsesize)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[iI]?[bB]?\s*", str(value))
    if not m:
        raise UsageError(f"{key}={value!r} is not a size; write bytes or a number with K, M or G (e.g. 32M)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def sweep_sizes(minbytes: int, maxbytes: int, stepbytes: int | None, stepfactor: int | None) -> list[int]:
    """nccl-tests' loop: from min to max inclusive, multiplying by the factor when it is
    above 1, else adding the fixed step."""
    if minbytes <= 0:
        raise UsageError(f"collectives.minbytes must be positive, got {minbytes}")
    if minbytes > maxbytes:
        raise UsageError(f"collectives.minbytes ({minbytes}) > collectives.maxbytes ({maxbytes}): sizes are out "
                         "of order; give minbytes <= maxbytes")
    if stepbytes is not None and stepfactor is not None:
        raise UsageError("set only one of collectives.stepbytes and collectives.stepfactor (as nccl-tests' -i / -f)")
    if stepfactor is not None and int(stepfactor) < 1:
        raise UsageError(f"collectives.stepfactor must be >= 1, got {stepfactor}")
    if stepbytes is not None and int(stepbytes) <= 0 and minbytes != maxbytes:
        raise UsageError(f"collectives.stepbytes must be positive, got {stepbytes}")
    sizes, s = [], minbytes
    while s <= maxbytes:
        sizes.append(s)
        if stepfactor is not None and int(stepfactor) > 1:
            s *= int(stepfactor)
        elif stepbytes is not None and int(stepbytes) > 0:
            s += int(stepbytes)
        else:
            break
    return sizes


@dataclass(frozen=True)
class Sweep:
    """What each op is called with, at which sizes (nccl-tests' -b -e -i -f -d -o -r): the
    harness and the external binary run this same sweep."""
    ops: tuple[str, ...]
    sizes: tuple[int, ...]  # bytes, as asked (the harness rounds per op)
    datatype: str  # nccl-tests type name
    redop: str
    root: int
    out_of_place: bool
    in_place: bool


@dataclass(frozen=True)
class Timing:
    """How each cell is timed: `warmup_iters` calls, then `iters` calls timed as one block,
    the ranks' times combined by `average` (nccl-tests' -w -n -a); after every headline row,
    `sample_iters` calls per size timed one by one (stability.py; 0 = none), at sizes up to
    `sample_maxbytes` (None: every size)."""
    iters: int
    warmup_iters: int
    average: str
    sample_iters: int = 0
    sample_maxbytes: int | None = None


@dataclass(frozen=True)
class Checks:
    """What makes a measured run fail: a wrong element (nccl-tests' -c, counted when
    `elements`) or an op's average busbw below 0.9 x `min_busbw` GB/s (NCCL_TESTS_MIN_BW)."""
    elements: bool
    min_busbw: float | None = None


@dataclass(frozen=True)
class Grouping:
    """Which ranks share a communicator (pattern_groups); `ranks_per_node` None = torchrun's."""
    pattern: str
    ranks_per_node: int | None


@dataclass(frozen=True)
class P2P:
    """The osu-style point-to-point tests (p2p.py), between `ranks` (None = auto)."""
    tests: tuple[str, ...]
    ranks: tuple[int, int] | None
    sizes: tuple[int, ...]
    iters: int
    warmup: int
    window: int


@dataclass(frozen=True)
class External:
    """nccl-tests' own binary on the same sweep (nccltests.py)."""
    mode: str  # auto | on | off
    binary: str
    prefix: tuple[str, ...]  # a launcher, its placeholders unfilled (launch_prefix)
    timeout_s: float


@dataclass(frozen=True)
class Faults:
    """The test hooks (environment only, see CORRUPT_ENV below); none in a real measurement."""
    corrupt: tuple[int, str] | None = None  # (world rank, op): one output element made wrong there
    slow_rank: tuple[int, float] | None = None  # (world rank, seconds slept before each sampled call)


@dataclass(frozen=True)
class Settings:
    """The collectives: section, checked once (from_config) and grouped by what reads it: the
    harness gets sweep, timing, checks and faults; p2p.py its P2P; nccltests.py the sweep,
    timing, checks, grouping and External it reproduces."""
    sweep: Sweep
    timing: Timing
    checks: Checks
    grouping: Grouping
    p2p: P2P
    external: External
    faults: Faults

    @classmethod
    def from_config(cls, c: Mapping[str, Any], world: int, env: Mapping[str, str] | None = None) -> Settings:
        # The checks run in this order (the first bad value is the one named); the messages
        # are pinned word for word (tests/collectives/test_settings.py).
        names = [c["ops"]] if isinstance(c["ops"], str) else list(c["ops"] or [])
        if names == ["all"]:
            names = list(ops.REGISTRY)
        op_names = tuple(ops.get(n).name for n in names)
        step_b = None if c.get("stepbytes") is None else parse_size(c["stepbytes"], "collectives.stepbytes")
        step_f = None if c.get("stepfactor") is None else int(c["stepfactor"])
        sizes = sweep_sizes(parse_size(c["minbytes"], "collectives.minbytes"),
                            parse_size(c["maxbytes"], "collectives.maxbytes"), step_b, step_f)
        dtype = ops.dtype_name(c["datatype"])
        redop = str(c["op"]).lower()
        if redop not in ops.REDOPS:
            raise UsageError(f"collectives.op={c['op']!r} is unknown; use one of {', '.join(ops.REDOPS)}")
        if redop == "avg" and not ops.DTYPES[dtype].is_floating_point:
            raise UsageError(f"collectives.op=avg needs a floating-point datatype, not {dtype}")
        if int(c["iters"]) <= 0:
            raise UsageError(f"collectives.iters must be positive, got {c['iters']}")
        if int(c["warmup_iters"]) < 0:
            raise UsageError(f"collectives.warmup_iters must be >= 0, got {c['warmup_iters']}")
        average = str(c["average"])
        if average not in AVERAGES:
            raise UsageError(f"collectives.average={average!r}; use one of {', '.join(AVERAGES)}")
        pattern = str(c["pattern"])
        if pattern not in PATTERNS:
            raise UsageError(f"collectives.pattern={pattern!r}; use one of {', '.join(PATTERNS)}")
        if not (c["out_of_place"] or c["in_place"]):
            raise UsageError("collectives.out_of_place and collectives.in_place are both false: nothing to measure")
        p2p, p2p_ranks = _p2p_tests(c, world)
        if not op_names and not p2p:
            raise UsageError("collectives.ops is empty and collectives.p2p is empty: nothing to run")
        p2p_sizes = tuple(sweep_sizes(parse_size(c["p2p_minbytes"], "collectives.p2p_minbytes"),
                                      parse_size(c["p2p_maxbytes"], "collectives.p2p_maxbytes"), None, 2))
        ext = _external_mode(c.get("external", "auto"))
        env = os.environ if env is None else env
        corrupt = _corrupt(env.get(CORRUPT_ENV), world)
        rpn = c.get("ranks_per_node")
        sample_iters = int(c.get("sample_iters") or 0)
        if sample_iters < 0:
            raise UsageError(f"collectives.sample_iters must be >= 0, got {sample_iters}")
        return cls(
            sweep=Sweep(ops=op_names, sizes=tuple(sizes), datatype=dtype, redop=redop, root=int(c["root"]),
                        out_of_place=bool(c["out_of_place"]), in_place=bool(c["in_place"])),
            timing=Timing(iters=int(c["iters"]), warmup_iters=int(c["warmup_iters"]), average=average,
                          sample_iters=sample_iters,
                          sample_maxbytes=None if c.get("sample_maxbytes") is None
                          else parse_size(c["sample_maxbytes"], "collectives.sample_maxbytes")),
            checks=Checks(elements=bool(c["check"]),
                          min_busbw=None if c.get("min_busbw") is None else float(c["min_busbw"])),
            grouping=Grouping(pattern=pattern, ranks_per_node=None if rpn is None else int(rpn)),
            p2p=P2P(tests=p2p, ranks=p2p_ranks, sizes=p2p_sizes, iters=int(c["p2p_iters"]),
                    warmup=int(c["p2p_warmup"]), window=int(c["p2p_window"])),
            external=External(mode=ext, binary=str(c["external_binary"]),
                              prefix=_checked_prefix(c.get("external_prefix")),
                              timeout_s=float(c["external_timeout_s"])),
            faults=Faults(corrupt=corrupt, slow_rank=_slow_rank(env.get(SLOW_RANK_ENV), world)),
        )

    def record_block(self, ranks_per_node: int) -> dict[str, Any]:
        """The record's `collectives` block (before the measured `groups` join it), keys in the
        order every stored record has them: analysis reads these names."""
        sw, t, f = self.sweep, self.timing, self.faults
        return {**({"test_hooks": {"corrupt": f.corrupt, "slow_rank": f.slow_rank}} if f.corrupt or f.slow_rank
                   else {}),
                "ops": list(sw.ops), "pattern": self.grouping.pattern, "ranks_per_node": ranks_per_node,
                "datatype": sw.datatype, "op": sw.redop, "root": sw.root, "iters": t.iters,
                "warmup_iters": t.warmup_iters, "average": t.average, "check": self.checks.elements,
                "min_busbw": self.checks.min_busbw}


def _external_mode(value: Any) -> str:
    """collectives.external as auto, on or off (YAML's true/false/null read as on/off/off)."""
    ext = str(value).lower()
    ext = {"true": "on", "false": "off", "none": "off"}.get(ext, ext)
    if ext not in ("auto", "on", "off"):
        raise UsageError(f"collectives.external={value!r}; use auto, on or off")
    return ext


def _checked_prefix(value: Any) -> tuple[str, ...]:
    """The prefix as given, refused here (on every rank, before anything runs) when one of its
    placeholders is unknown, not on rank 0 alone when the binary is about to start."""
    prefix = tuple(str(x) for x in (value or []))
    launch_prefix(prefix, 1, 1, 1)
    return prefix


# Test hooks, set in the environment (the tests' launches set them), not in the config a user
# edits: a measurement's config cannot carry one by accident, and a record says when one was on
# (`collectives.test_hooks`).
CORRUPT_ENV = "FABRICBENCH_TEST_CORRUPT"      # "<world rank>:<op>": add 1 to one output element there
SLOW_RANK_ENV = "FABRICBENCH_TEST_SLOW_RANK"  # "<world rank>:<ms>": that rank sleeps before each sampled call


def _corrupt(value: Any, world: int) -> tuple[int, str] | None:
    if value in (None, ""):
        return None
    rank_s, _, op_s = str(value).partition(":")
    if not rank_s.isdigit() or not 0 <= int(rank_s) < max(world, 1):
        raise UsageError(f"{CORRUPT_ENV}={value!r}; write <rank>:<op> with a rank in [0, {world}), e.g. 1:all_gather")
    return int(rank_s), ops.get(op_s).name


def _slow_rank(value: Any, world: int) -> tuple[int, float] | None:
    """Test hook "<world rank>:<ms>": that rank sleeps before each sampled call."""
    if value in (None, ""):
        return None
    rank_s, _, ms_s = str(value).partition(":")
    try:
        rank, ms = int(rank_s), float(ms_s)
    except ValueError:
        rank, ms = -1, -1.0
    if not 0 <= rank < max(world, 1) or ms < 0:
        raise UsageError(f"{SLOW_RANK_ENV}={value!r}; write <rank>:<milliseconds> with a rank in "
                         f"[0, {world}), e.g. 1:5")
    return rank, ms / 1e3


def _p2p_tests(c: Mapping[str, Any], world: int) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """The osu-style tests asked for, and the pair of ranks they run between (None = auto)."""
    p2p = tuple(str(t) for t in (c.get("p2p") or []))
    for t in p2p:
        if t not in P2P_TESTS:
            raise UsageError(f"collectives.p2p names {t!r}; use any of {', '.join(P2P_TESTS)}")
    pr = c.get("p2p_ranks")
    p2p_ranks = None if pr is None else tuple(int(x) for x in pr)
    if p2p and p2p_ranks is not None:
        if len(p2p_ranks) != 2 or p2p_ranks[0] == p2p_ranks[1] or not all(0 <= x < world for x in p2p_ranks):
            raise UsageError(f"collectives.p2p_ranks={list(p2p_ranks)} must be two different ranks in [0, {world})")
    if p2p and world < 2:
        raise UsageError("collectives.p2p needs at least 2 ranks; launch 2 or more")
    return p2p, p2p_ranks


def pattern_groups(pattern: str, world: int, ranks_per_node: int) -> list[list[int]]:
    """The world split into communicators that run side by side (nccl-tests'
    NCCL_TESTS_SPLIT: a color per rank, one communicator per color).

    all           one group of every rank
    one_per_node  color = rank % ranks_per_node ("MOD <gpus per node>"): each group has
                  one rank per node, so only the network carries its traffic
    pairs         color = rank % (world / 2): rank r with r + world/2, i.e. across the
                  two halves of the job (across nodes when there are two)
    """
    if pattern == "all":
        return [list(range(world))]
    if pattern == "one_per_node":
        if ranks_per_node <= 0 or world % ranks_per_node:
            raise UsageError(f"pattern=one_per_node: world size {world} is not a whole number of nodes of "
                             f"{ranks_per_node} ranks; set collectives.ranks_per_node")
        if world // ranks_per_node < 2:
            raise UsageError(f"pattern=one_per_node needs 2 or more nodes; this job has {world} ranks on one "
                             f"node of {ranks_per_node} (set collectives.ranks_per_node to emulate nodes)")
        mod = ranks_per_node
    elif pattern == "pairs":
        if world < 2 or world % 2:
            raise UsageError(f"pattern=pairs needs an even world size, got {world}")
        mod = world // 2
    else:
        raise UsageError(f"collectives.pattern={pattern!r}; use one of {', '.join(PATTERNS)}")
    return [[r for r in range(world) if r % mod == color] for color in range(mod)]


def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: 2 decimals while they fit the column, then fewer, then
    scientific notation."""
    power, v = 0, 1
    while value >= v:
        power += 1
        v *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}"


# Placeholders collectives.external_prefix may carry, filled from the job, so one prefix fits
# every job size (nccltests.py runs the binary one process per GPU under it).
PREFIX_FIELDS = ("world", "nodes", "ranks_per_node")


def launch_prefix(prefix: tuple[str, ...] | list[str], world: int, nodes: int, ranks_per_node: int) -> list[str]:
    """collectives.external_prefix with {world}, {nodes} and {ranks_per_node} filled in."""
    values = {"world": world, "nodes": nodes, "ranks_per_node": ranks_per_node}
    try:
        return [str(arg).format(**values) for arg in prefix]
    except (KeyError, IndexError, ValueError) as e:
        raise UsageError(f"collectives.external_prefix={list(prefix)} has a placeholder other than "
                         f"{', '.join('{' + f + '}' for f in PREFIX_FIELDS)} ({e}); use only those") from None
