"""Result records -> one typed table of runs.

Sources: local directories (workloads.core.records.load_records, recursively) and W&B
projects (`entity/project`, filtered by group, tags or config keys). A W&B run is turned
back into a record by workloads.core.loggers.record_from_wandb, the exact inverse of what the
W&B logger wrote, so both sources share one reader. Readers are defensive: collectives
and inference records carry other sections than training ones, and a value that is not a
number (missing, None, "<redacted>") becomes None rather than an error.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from workloads import catalog
from workloads.core.errors import UsageError
from workloads.core.records import SCHEMA, load_records


def is_training(workload: str) -> bool:
    """Whether a record's workload writes training records (workloads/catalog.py)."""
    return bool(catalog.field(workload, "training", False))


def is_served(workload: str) -> bool:
    """Whether a record's workload is a served load sweep, one record per load point."""
    return bool(catalog.field(workload, "served", False))


def not_applicable(workload: str) -> tuple[str, ...]:
    """Run fields that do not apply to a workload: the Hydra tree still carries their defaults
    (a collectives run's config.model.name is neox-tiny, config.parallel.name ddp), which
    measured nothing, so they are read as None and shown as "—"."""
    return catalog.field(workload, "not_applicable", ())


def dig(obj: Any, path: str, default: Any = None) -> Any:
    """dig(rec, "config.train.micro_batch_size")"""
    for part in path.split("."):
        if not isinstance(obj, Mapping) or part not in obj:
            return default
        obj = obj[part]
    return obj


def num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _first(rec: Mapping, *paths: str) -> Any:
    for p in paths:
        v = dig(rec, p)
        if v is not None:
            return v
    return None


@dataclass
class Run:
    """One record: one trial of one point under one arm."""

    source: str                      # file path or wandb://entity/project/run_id
    workload: str
    # The label runs are grouped and compared by: the study arm (record["study"]["arm"]) when a
    # study ran it, else the fabric's name. An A/A study runs one fabric under two arm labels,
    # so grouping by the fabric would pool the control into the baseline.
    arm: str
    status: str
    run_id: str | None
    metrics: dict[str, float]        # numeric metrics only; units are in the keys
    coords: dict[str, float]         # sweep coordinates: global_batch, micro_batch, world_size, concurrency, rate, ...
    model: str | None
    parallel: str | None
    transport: dict | None           # record["fabric"]["transport"] from workloads/fabric/verify.py, if any
    rows: list[dict] = field(default_factory=list)   # collectives rows (nccl-tests columns)
    p2p: list[dict] = field(default_factory=list)    # point-to-point rows
    record: dict = field(default_factory=dict, repr=False)
    point: str | None = None         # inference: the sweep point's label ("c32", "poisson-r8")
    arrival: str | None = None       # inference: closed | poisson | gamma | burst
    fabric_name: str | None = None   # the fabric profile that ran (equal to `arm` outside a study)
    study: dict | None = None        # record["study"]: name, id, arm, baseline, control, block, position, design, ...

    @property
    def fabric(self) -> str:
        """The arm, by its name before `arm` (kept for a release; the profile is `fabric_name`)."""
        return self.arm

    @property
    def control(self) -> bool:
        """The arm is the study's A/A control: the baseline's fabric under a second label."""
        return bool((self.study or {}).get("control"))

    @property
    def noise(self) -> dict | None:
        """record["fabric"]["noise"]: the background traffic this trial ran under and its bytes
        meanwhile (workloads/fabric/noise.py); None for a trial on a quiet link."""
        fabric = self.record.get("fabric")
        loud = fabric.get("noise") if isinstance(fabric, dict) else None
        return loud if isinstance(loud, dict) else None

    @property
    def transport_verdict(self) -> str | None:
        t = self.transport or {}
        v = t.get("verdict", t.get("status"))
        return None if v is None else str(v)

    @property
    def transport_mismatch(self) -> bool:
        return self.transport_verdict in ("mismatch", "fail", "failed")

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)


def size_text(v: float) -> str:
    """A message size in bytes as nccl-tests' tables write it: 1048576 -> '1M'."""
    for unit, f in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if v >= f:
            return f"{v / f:g}{unit}"
    return f"{v:g}"


def cell_busbw(row: Mapping[str, Any]) -> list[float]:
    """busbw (GB/s) of a collectives row's reported cells, out-of-place and in-place (nccl-tests'
    two placements of one size; "N/A" cells, e.g. sendrecv in place, are absent)."""
    cells = (row.get(place) for place in ("out_of_place", "in_place"))
    return [f for c in cells if isinstance(c, Mapping) and (f := num(c.get("busbw"))) is not None]


def size_metrics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """`<op>/busbw@<bytes>(GB/s)` per (op, message size): the mean busbw of that size's cells, as
    `<op>/avg_busbw(GB/s)` averages every cell of the op. One test per size, so a study (or
    its A/A control) can be judged size by size: `compare --metric 'all_reduce/busbw@*'`. An op
    swept over one size gets none (its avg_busbw is that size)."""
    cells: dict[str, list[float]] = {}
    for row in rows:
        if row.get("op") and row.get("size"):
            cells.setdefault(f"{row['op']}/busbw@{int(row['size'])}(GB/s)", []).extend(cell_busbw(row))
    sizes: dict[str, int] = {}
    for k in cells:
        sizes[k.split("/busbw@")[0]] = sizes.get(k.split("/busbw@")[0], 0) + 1
    # An op measured at one size has that size's busbw as its avg_busbw already: a second,
    # identical test would only widen the correction.
    return {k: sum(v) / len(v) for k, v in cells.items() if v and sizes[k.split("/busbw@")[0]] > 1}


def run_from_record(rec: Mapping[str, Any]) -> Run:
    workload = str(rec.get("workload") or "unknown")
    metrics = {k: f for k, v in dict(rec.get("metrics") or {}).items() if (f := num(v)) is not None}
    rows = [r for r in rec.get("rows") or [] if isinstance(r, Mapping)]
    metrics.update({k: v for k, v in size_metrics(rows).items() if k not in metrics})
    if is_training(workload) and "tokens_per_sec" not in metrics:
        # tokens/s = sps x seq_length (docs/metrics.md); recomputed when the stored value is not a number
        sps, seq = metrics.get("samples_per_sec"), num(dig(rec, "batch.seq_length"))
        if sps is not None and seq is not None:
            metrics["tokens_per_sec"] = sps * seq
    arrival = dig(rec, "arrival") if isinstance(dig(rec, "arrival"), Mapping) else {}
    kind = arrival.get("kind")
    coords = {
        "global_batch": num(dig(rec, "batch.global_batch_size")),
        "micro_batch": num(dig(rec, "batch.micro_batch_size")),
        "seq_length": num(dig(rec, "batch.seq_length")),
        # inference: the server's GPUs. server.tp is the total tensor-parallel degree over
        # all nodes (SGLang --tp, vLLM --tensor-parallel-size), so nnodes is not a factor.
        "world_size": num(_first(rec, "world.world_size", "config.world_size", "server.tp")),
        "nodes": num(_first(rec, "world.nodes", "server.nnodes")),
        # inference: the load point, as workloads/inference/run.py records it. The config's
        # load section describes the whole sweep, not the point, so it is not read here.
        "concurrency": num(arrival.get("concurrency")) if kind == "closed" else None,
        "rate": num(arrival.get("rate")) if kind != "closed" else None,  # burst: inf -> absent
        "burstiness": num(arrival.get("burstiness")) if kind == "gamma" else None,
        "max_concurrency": num(arrival.get("max_concurrency")) if kind != "closed" else None,
    }
    fabric = dig(rec, "fabric") or {}
    na = not_applicable(workload)
    fabric_name = str(_first(rec, "fabric.name", "config.fabric.name") or "unknown")
    study = rec.get("study") if isinstance(rec.get("study"), Mapping) else None
    return Run(
        source=str(rec.get("_path") or ""),
        workload=workload,
        arm=str(study["arm"]) if study and study.get("arm") is not None else fabric_name,
        status=str(rec.get("status") or "unknown"),
        run_id=rec.get("run_id"),
        metrics=metrics,
        coords={k: v for k, v in coords.items() if v is not None},
        model=None if "model" in na else _first(rec, "model.name", "config.model.name"),
        parallel=None if "parallel" in na else _first(rec, "config.parallel.name"),
        transport=fabric.get("transport") if isinstance(fabric, Mapping) and isinstance(fabric.get("transport"), Mapping) else None,
        rows=rows,
        p2p=[r for r in rec.get("p2p") or [] if isinstance(r, Mapping)],
        record=dict(rec),
        point=str(rec["point"]) if rec.get("point") is not None else None,
        arrival=str(kind) if kind is not None else None,
        fabric_name=fabric_name,
        study=dict(study) if study else None,
    )


class Table(list):
    """A list of Runs with column access; typed: numbers as float arrays (NaN when absent)."""

    def column(self, name: str) -> np.ndarray:
        if name in ("workload", "fabric", "status", "run_id", "model", "parallel", "source"):
            return np.array([getattr(r, name) for r in self], dtype=object)
        vals = [r.coords.get(name, r.metrics.get(name)) for r in self]
        return np.array([np.nan if v is None else v for v in vals], dtype=float)

    def where(self, **eq: Any) -> Table:
        return Table(r for r in self if all(getattr(r, k) == v for k, v in eq.items()))

    def ok(self) -> Table:
        return Table(r for r in self if r.status == "ok")

    def not_ok(self) -> Table:
        """Failed or partial records: never analysed, always counted and named."""
        return Table(r for r in self if r.status != "ok")

    @property
    def arms(self) -> list[str]:
        return sorted({r.arm for r in self})

    @property
    def fabrics(self) -> list[str]:
        """`arms`, by its name before (kept for a release)."""
        return self.arms


def load_dirs(dirs: Iterable[str]) -> list[dict]:
    dirs = list(dirs)
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        raise UsageError(f"no such directory: {', '.join(missing)}; pass the run or results directories that hold records/")
    seen, out, malformed = set(), [], {}
    for rec in load_records(*dirs):
        real = Path(rec["_path"]).resolve()  # overlapping or symlinked directories: count each record once
        if real not in seen and rec.get("schema") == SCHEMA:
            if (why := _malformed(rec)) is not None:
                malformed[real] = why
                continue
            seen.add(real)
            out.append(rec)
    _warn_unread(dirs, seen, malformed)
    return without_overlaps(once(out))


def without_overlaps(recs: list[dict]) -> list[dict]:
    """A study's records measured at the same time as another run of the study (records.overlap)
    are read as status "overlapped": left out of every verdict, each named in one warning."""
    import sys

    from workloads.core.records import overlapped

    hit = sorted(overlapped(recs))
    for i in hit:
        recs[i]["status"] = "overlapped"
    if hit:
        print(f"warning: {len(hit)} record(s) of a study were measured while another run of the same study was running "
              "(each measured the other's load) and are left out of every verdict; rerun the study to measure them "
              "again: " + ", ".join(str(recs[i].get("_path")) for i in hit), file=sys.stderr)
    return recs


def record_identity(rec: Mapping[str, Any]) -> str:
    """What makes two files one record. Its `record_id` (written with every record since it
    was added), else a digest of its content: a copy (`cp -r results/tr results/tr-backup`, a
    .bak of a record) has the same content, while two measurements never do (each has its
    own creation time and raw samples). Where a record sits is not part of it."""
    import hashlib
    import json

    if isinstance(rec.get("record_id"), str) and rec["record_id"]:
        return "id:" + rec["record_id"]
    body = {k: v for k, v in rec.items() if k != "_path"}
    return "sha256:" + hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def once(recs: list[dict]) -> list[dict]:
    """Each record counted once however many copies were read: a copy counted again would be
    taken for another independent trial (n = 4 vs 4 read as 4 vs 8, a smaller p). The first
    read is kept; every copy is named in one warning."""
    import sys

    first: dict[str, str] = {}
    out, copies = [], []
    for rec in recs:
        key = record_identity(rec)
        if key in first:
            copies.append(f"{rec.get('_path')} (the same record as {first[key]})")
            continue
        first[key] = str(rec.get("_path"))
        out.append(rec)
    if copies:
        more = f"; and {len(copies) - 5} more" if len(copies) > 5 else ""
        print(f"warning: {len(copies)} record file(s) repeat a record already read and are not counted again: "
              f"{'; '.join(copies[:5])}{more}", file=sys.stderr)
    return out


# Sections every reader takes for a mapping (a hand-edited record with "metrics": "fast" crashed
# compare and report with a traceback): such a record is not read, and is named.
MAPPINGS = ("metrics", "config", "fabric", "study", "world", "batch", "fingerprint")


def _malformed(rec: Mapping[str, Any]) -> str | None:
    bad = [k for k in MAPPINGS if rec.get(k) is not None and not isinstance(rec[k], Mapping)]
    return None if not bad else f"{bad[0]} is {type(rec[bad[0]]).__name__} {rec[bad[0]]!r:.40}, not a mapping"


def _warn_unread(dirs: list[str], read: set[Path], why: Mapping[Path, str] | None = None) -> None:
    """Files in a records/ folder that were not read are counted and named, never dropped
    silently: a truncated record, one of another schema version, or one whose sections are not
    what they must be (`why`) is the user's to see."""
    import json
    import sys

    unread = dict(why or {})
    for d in dirs:
        for p in Path(d).rglob("*.json"):
            if "records" not in p.parent.parts or p.resolve() in read or p.resolve() in unread:
                continue
            try:
                schema = json.loads(p.read_text()).get("schema")
                unread[p.resolve()] = f"schema {schema!r}, this reader reads {SCHEMA!r}"
            except (OSError, ValueError, AttributeError) as e:
                unread[p.resolve()] = f"not a JSON record: {type(e).__name__}"
    if unread:
        named = "; ".join(f"{p} ({why})" for p, why in sorted(unread.items())[:5])
        more = f"; and {len(unread) - 5} more" if len(unread) > 5 else ""
        print(f"warning: {len(unread)} file(s) in records/ folders were not read: {named}{more}", file=sys.stderr)


def wandb_filters(group: str | None = None, tags: Iterable[str] = (), config: Mapping[str, Any] | None = None) -> dict:
    """MongoDB-style filters of wandb.Api().runs. Config keys are the logger's flat keys
    ("fabric/name", "config/train/micro_batch_size")."""
    f: dict[str, Any] = {}
    if group:
        f["group"] = group
    tags = list(tags)
    if tags:
        f["tags"] = {"$all": tags}
    for k, v in (config or {}).items():
        f[f"config.{k}"] = v
    return f


def load_wandb(path: str, group: str | None = None, tags: Iterable[str] = (), config: Mapping[str, Any] | None = None,
               api: Any = None) -> list[dict]:
    """Runs of W&B project `entity/project` as records. `api` is a wandb.Api (injectable)."""
    from workloads.core.loggers import record_from_wandb

    if path.count("/") != 1:
        raise UsageError(f"--wandb {path!r}: write entity/project")
    if api is None:
        try:
            import wandb

            api = wandb.Api(timeout=30)
        except Exception as e:
            raise UsageError(f"cannot reach W&B for {path} ({type(e).__name__}: {e}); set WANDB_API_KEY or read local records") from None
    out = []
    for run in api.runs(path, filters=wandb_filters(group, tags, config)):
        config_d = dict(run.config)
        summary = {k: run.summary[k] for k in list(run.summary.keys())} if hasattr(run.summary, "keys") else dict(run.summary)
        rec = record_from_wandb(config_d, summary, f"wandb://{path}/{run.id}")
        if "status" in summary:
            rec["status"] = summary["status"]
        rec.setdefault("status", "ok" if getattr(run, "state", "") == "finished" else str(getattr(run, "state", "unknown")))
        out.append(rec)
    return out


def load_table(dirs: Iterable[str] = (), wandb_path: str | None = None, group: str | None = None,
               tags: Iterable[str] = (), config: Mapping[str, Any] | None = None, api: Any = None) -> Table:
    recs = load_dirs(dirs)
    if wandb_path:  # a run both on disk and in W&B is one trial (its record_id)
        recs = once(recs + load_wandb(wandb_path, group, tags, config, api))
    return Table(run_from_record(r) for r in recs)


def records_root(table: Table) -> Path | None:
    """The folder every local record lies under, so that names are short but unambiguous: every
    run directory writes the same file names (pretrain-mb4.json in each). With one run
    directory, its parent, to keep the run id in the name. W&B sources are unique already."""
    local = {Path(r.source).parent for r in table if r.source and "://" not in r.source}
    if not local:
        return None
    root = Path(os.path.commonpath([str(p) for p in local]))
    if len(local) == 1:
        root = root.parent.parent if root.name == "records" else root.parent
    return root
