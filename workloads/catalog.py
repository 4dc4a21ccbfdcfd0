"""What a workload is, in one place: every table that used to name the workloads reads this.

The launcher finds a workload's validator here, the W&B logger its default group, a study
its entry script and expected noise, the emulator whether its ranks cross the emulated link,
analysis its primary and secondary metrics, display name and the identity fields that
do not apply to it. A new workload is one package under workloads/ (its run module, with its
`declare.py`), a launch script, a conf/workload/<name>.yaml and one `register` call.

A workload declares its typed config keys (`KEYS`) and its metrics (`METRICS`: name, unit,
direction) beside its code, in the module `declares` names: the config check (core/schema.py)
and the verdict's direction (analysis/compare.py) ask the catalog, never a table of workloads.
The catalog names modules by string and imports nothing above it, so it stands on the
ground floor: `core/` may read it without knowing any workload's code. Metric names follow
docs/metrics.md (units in the key, as the records write them).

MoE training (model=neox-moe-*) is a model of pretrain and finetune, not a workload of its
own: its records are training records, judged on samples/s like any other.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Callable, Iterable


def named(metric: str) -> Callable[[Iterable[str]], str | None]:
    """A primary metric that is one record key, when the record has it."""
    return lambda names: metric if metric in set(names) else None


def _collectives_primary(names: Iterable[str]) -> str | None:
    """The bus bandwidth of all_reduce (else the first op) at its largest message size; the
    record's blended avg_busbw(GB/s) averages unlike ops, so it is no op's bandwidth."""
    names = sorted(set(names))
    ops = sorted({n.split("/")[0] for n in names if n.endswith("(GB/s)") and "/" in n and "busbw" in n})
    if not ops:
        return None
    op = "all_reduce" if "all_reduce" in ops else ops[0]
    sized = [n for n in names if n.startswith(f"{op}/busbw@")]
    if sized:
        return max(sized, key=lambda n: int(n.split("@")[1].split("(")[0]))
    return f"{op}/avg_busbw(GB/s)" if f"{op}/avg_busbw(GB/s)" in names else None


def _link_primary(names: Iterable[str]) -> str | None:
    """What arrived over the link: iperf3's received throughput, else perftest's average
    bandwidth (ib_write_bw) or typical latency (ib_read_lat)."""
    names = set(names)
    return next((m for m in ("throughput_received(Gbit/s)", "bw_average(Gbit/s)", "lat_typical(us)") if m in names),
                None)


@dataclass(frozen=True)
class Metric:
    """One metric a workload writes, declared beside the code that computes it. `name` is the
    record's key or an fnmatch pattern over keys ("routing_skew*"); `higher`: whether more is
    better; `word`: the verdict's word ("faster" for times and rates, "better" for the rest: a
    smaller share or loss is not speed); `counted`: a count per run, judged by the blocks' raw
    differences (a ratio of small counts is mostly noise)."""

    name: str
    unit: str
    higher: bool
    word: str = "better"
    counted: bool = False

    def matches(self, metric: str) -> bool:
        return metric == self.name or fnmatchcase(metric, self.name)


@dataclass(frozen=True)
class Workload:
    name: str                     # the record's `workload`, conf/workload/<name>.yaml
    display: str                  # how the report names it
    script: str                   # the entry point, relative to the checkout
    overrides: tuple[str, ...] = ()   # what choosing this workload on the script's command line takes
    validator: str | None = None  # module whose validate(cfg, world) checks a job before any rank starts
    primary: Callable[[Iterable[str]], str | None] = lambda names: None  # the metric judged on, among names
    primary_text: str = ""        # the same, in words, for a study's plan
    headline: tuple[str, ...] = ()    # the report's headline metrics (fnmatch): primary first, then secondary
    not_applicable: tuple[str, ...] = ()  # run identity fields that measured nothing here (read as None)
    group: str = "{workload}-{model}-{parallel}-ws{world}"  # W&B default group: runs that differ only by fabric
    training: bool = False        # records are training records (batch, samples/s, loss)
    served: bool = False          # the script is a load generator: it starts a server, one record per load point
    crosses_link: bool = True     # its ranks (a served workload: its server's) span emulated nodes
    # the word a study's `entry:` took before it took the workload's name (train, infer): still read
    # for a release, with a deprecation line (workloads/study/words.py)
    old_entry: str = ""
    default_cv: float = 0.05      # a study's expected run-to-run noise when nothing else says
    # (steps key, warm-up steps key) when a study may size the measured window (`window: auto`,
    # workloads/study/window.py): the records carry per-step, per-iteration or per-request samples. The
    # warm-up key is None when the steps key counts the measured ones alone (collectives.iters,
    # load.num_requests), else the steps key counts the warm-up too (train.steps)
    window: tuple[str, str | None] | None = None
    # module (by name, like `validator`) whose KEYS (dotted config key -> core.schema kind) and
    # METRICS (Metric, ...) this workload declares
    declares: str | None = None
    sweep_keys: tuple[str, ...] = ()  # config keys listing the points one run sweeps (not a point's identity)
    # the NCCL functions its ranks call through torch.distributed, in NCCL_ALGO's names, which a
    # function-prefixed NCCL_ALGO/NCCL_PROTO must leave an algorithm for (workloads/fabric/ncclvalues.py);
    # None: all five (DDP and DeepSpeed broadcast at start, ZeRO and FSDP gather and scatter)
    nccl_functions: tuple[str, ...] | None = None


CATALOG: dict[str, Workload] = {}


def register(w: Workload) -> Workload:
    CATALOG[w.name] = w
    return w


def unregister(name: str) -> None:
    CATALOG.pop(name, None)


def get(word: str) -> Workload | None:
    """The workload a record's name (or a study's entry word before it was the name) means; None for neither."""
    word = str(word)
    return CATALOG.get(word) or next((w for w in CATALOG.values() if w.old_entry == word), None)


def field(word: str, name: str, default=None):
    """One field of the workload `word` names, or `default` for a word the catalog does not
    know (records of another version, a typo): the lookup every table of workloads made."""
    known = get(word)
    return getattr(known, name) if known else default


def _declared(name: str) -> tuple[dict[str, Any], tuple[Metric, ...]]:
    module = importlib.import_module(name)
    return dict(getattr(module, "KEYS", {})), tuple(getattr(module, "METRICS", ()))


def _declarations() -> list[tuple[dict[str, Any], tuple[Metric, ...]]]:
    return [_declared(m) for m in dict.fromkeys(w.declares for w in CATALOG.values() if w.declares)]


def keys() -> dict[str, Any]:
    """Every registered workload's typed config keys (a key absent from a config is not checked)."""
    return {k: v for declared, _ in _declarations() for k, v in declared.items()}


def metrics() -> tuple[Metric, ...]:
    """Every registered workload's declared metrics, in catalog order."""
    return tuple(m for _, declared in _declarations() for m in declared)


def metric(name: str) -> Metric | None:
    """The declaration a metric name matches (first in catalog order), or None."""
    return next((m for m in metrics() if m.matches(name)), None)


def chooses_workload(overrides: Iterable[str]) -> bool:
    """Whether a command line's overrides choose the workload themselves (workload=, +, ~ forms);
    otherwise an entry point adds its own."""
    return any(str(o).lstrip("+~").startswith("workload=") for o in overrides)


def for_script(path: str) -> tuple[Workload, ...]:
    """The workloads an entry point runs, matched by its file name (train.py: pretrain, finetune)."""
    base = str(path).rsplit("/", 1)[-1]
    return tuple(w for w in CATALOG.values() if w.script.rsplit("/", 1)[-1] == base)


def scripts(**having) -> tuple[str, ...]:
    """Entry points, each once, in catalog order."""
    return tuple(dict.fromkeys(w.script for w in CATALOG.values()
                               if all(getattr(w, k) == v for k, v in having.items())))


# Expected noise: a quiet cluster gives ~1-2% for training and 2-5% for bus bandwidth and
# serving throughput; these sit above that, so a default plan does not promise what the
# machine cannot deliver.
_TRAINING = dict(script="launch/train.py", validator="workloads.training.run", primary=named("samples_per_sec"),
                 primary_text="samples_per_sec", headline=("samples_per_sec", "alltoall_share"), training=True,
                 default_cv=0.03, window=("train.steps", "train.warmup_steps"), declares="workloads.training.declare")
register(Workload("pretrain", "Pre-training", old_entry="train", **_TRAINING))
register(Workload("finetune", "Fine-tuning", overrides=("workload=finetune",), **_TRAINING))
register(Workload("collectives", "Collectives", "launch/collectives.py", overrides=("workload=collectives",),
                  validator="workloads.collectives.run", primary=_collectives_primary, declares="workloads.collectives.declare",
                  primary_text="all_reduce bus bandwidth at the largest size", headline=("*/avg_busbw(GB/s)",),
                  window=("collectives.iters", None),
                  not_applicable=("model", "parallel"), group="collectives-ws{world}"))
# the served model applies; the training parallel strategy does not
register(Workload("inference", "Inference", "launch/infer.py", overrides=("workload=inference",), primary=named("request_throughput"),
                  primary_text="request_throughput at the heaviest load point",
                  # server=vllm-pd adds the KV transfer's time and its share of TTFT (absent elsewhere)
                  headline=("request_throughput", "median_ttft_ms", "p99_ttft_ms", "kv_xfer_ms_mean", "kv_ttft_share"),
                  not_applicable=("parallel",),
                  group="inference-{model}-{server}-tp{world}", served=True, old_entry="infer",
                  window=("load.num_requests", None),
                  declares="workloads.inference.declare", sweep_keys=("load.points",),
                  # tensor-parallel serving all-reduces and all-gathers; the engines broadcast at load
                  nccl_functions=("AllReduce", "AllGather", "Broadcast")))
# what the wire gives before any framework: one server and one client, no model or parallel layout;
# iperf3 on a quiet link repeats to ~1-2%
register(Workload("link", "Raw link", "launch/link.py", overrides=("workload=link",), validator="workloads.link.run",
                  declares="workloads.link.declare",
                  primary=_link_primary, primary_text="received TCP throughput (iperf3), or perftest's average "
                  "bandwidth / typical latency", headline=("throughput_received(Gbit/s)", "throughput(%payload)",
                                                           "bw_average(Gbit/s)", "lat_typical(us)"),
                  not_applicable=("model", "parallel"), group="link", default_cv=0.03,
                  nccl_functions=()))  # iperf3/perftest, no NCCL
# a captured run's collectives alone (a training record's trace or a Flight Recorder dump): the job's own
# communication pattern without its compute; lower is faster
register(Workload("replay", "Communication replay", "launch/replay.py", overrides=("workload=replay",),
                  validator="workloads.replay.run", primary=named("comm_time_per_step(s)"), declares="workloads.replay.declare",
                  primary_text="communication time per replayed step",
                  headline=("comm_time_per_step(s)", "replay_vs_original"),
                  not_applicable=("model", "parallel"), group="replay-ws{world}"))
