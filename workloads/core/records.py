"""Result records: one JSON file per measured point, written atomically, never overwritten.

The record is the contract between workloads and analysis/: the config, the fabric
environment as applied, the transport seen, the hardware/software fingerprint, metrics,
raw samples and status. Secrets never enter it (core/redact.py); the fingerprint is
core/fingerprint.py's.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from workloads import catalog
from workloads.core.errors import RecordNotWritten, UsageError
from workloads.core.redact import redact

SCHEMA = "fabricbench.record/1"


# Flat keys of nested sections: "config/train/micro_batch_size" (W&B's config, whose panels
# group by it); "." where a key reads like a dotted config path.
SEP = "/"


def flatten(obj: Mapping[str, Any], sep: str = SEP, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a/b": 1}. Lists stay values (W&B stores them as such)."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, sep, key))
        else:
            out[key] = v
    return out


def unflatten(flat: Mapping[str, Any], sep: str = SEP) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, v in flat.items():
        node = out
        *parents, leaf = str(key).split(sep)
        for p in parents:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[leaf] = v
    return out


def json_safe(v: Any, reasons: dict[str, str] | None = None, path: str = "") -> Any:
    """`v` with every NaN/Infinity replaced by None; each replaced path goes in `reasons`."""
    if isinstance(v, float) and not math.isfinite(v):
        if reasons is not None:
            reasons[path] = f"{v!r} is not a JSON number"
        return None
    if isinstance(v, dict):
        return {k: json_safe(x, reasons, f"{path}.{k}" if path else str(k)) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x, reasons, f"{path}[{i}]") for i, x in enumerate(v)]
    return v


def finite(record: dict[str, Any]) -> dict[str, Any]:
    """Strict JSON: every NaN/Infinity becomes null, and `null_reasons` names each such
    field (dotted path) with the value it stood for (e.g. a closed-loop point's arrival
    rate, inf)."""
    reasons: dict[str, str] = {}
    out = json_safe(record, reasons)
    if reasons:
        out["null_reasons"] = dict(out.get("null_reasons") or {}) | reasons
    return out


def not_writable(p: Path) -> str | None:
    """Why directory `p` (created if missing) cannot take a file, or None when it can."""
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return str(e.strerror)
    return None


def check_writable(root: str) -> None:
    p = Path(root)
    if (why := not_writable(p)) is not None:
        raise UsageError(f"output directory {p} is not writable ({why}); set output_root= to a writable path")


def new_record(workload: str, **fields: Any) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "schema": SCHEMA,
        "workload": workload,
        "status": "running",
        "error": None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rec.update(fields)
    if isinstance(rec.get("fingerprint"), dict):
        rec["fingerprint"] = with_site(with_tuned(rec["fingerprint"], fields.get("config")), fields.get("config"))
    return rec


def with_site(fp: dict[str, Any], config: Any) -> dict[str, Any]:
    """The fingerprint with `site` (core/fingerprint.py site_settings) for the run's fabric."""
    from workloads.core.fingerprint import site_settings

    fabric = (config.get("fabric") or {}).get("name") if isinstance(config, dict) else None
    site = site_settings(str(fabric) if fabric else None)
    return {**fp, "site": site} if site else fp


def with_tuned(fp: dict[str, Any], config: Any) -> dict[str, Any]:
    """The fingerprint with `tuned` (the tune and settings a run uses, config `tuned`) when set:
    the settings a tune chose are part of what ran, so a run of a tuned arm is never mistaken
    for the untuned fabric (docs/tune.md)."""
    tuned = config.get("tuned") if isinstance(config, dict) else None
    return {**fp, "tuned": tuned} if tuned else fp


# Config keys that are bookkeeping, not the point measured: two records that differ only
# here, in `trial` and in the keys listing the points their run swept (a workload's catalog
# `sweep_keys`) are the same trial of the same point.
_NOT_POINT = ("run_id", "output_root", "logger", "launcher", "hydra", "wandb", "study", "trial", "dist.timeout_s")


def trial_key(record: dict[str, Any]) -> tuple | None:
    """(point identity, trial) of a record: the workload, its sweep point, the study arm and
    fabric, and every config value but bookkeeping. None for a record without a config."""
    cfg = record.get("config")
    if not isinstance(cfg, dict):
        return None
    flat = flatten(json_safe(cfg), ".")  # as it will read back from disk
    skip = _NOT_POINT + tuple(catalog.field(record.get("workload"), "sweep_keys", ()))
    ident = tuple(sorted((k, repr(v)) for k, v in flat.items()
                         if not any(k == p or k.startswith(p + ".") for p in skip)))
    arm = (record.get("study") or {}).get("arm")
    fabric = (record.get("fabric") or {}).get("name")
    return (record.get("workload"), record.get("point"), arm, fabric, ident), cfg.get("trial", 0)


def iter_records(directory: str | os.PathLike, pattern: str = "*.json") -> Iterator[tuple[Path, dict[str, Any]]]:
    """(path, record) of every JSON object under `directory` matching `pattern` (a glob:
    "*.json" in a records folder, "**/*.json" below a results folder), in path order. A file
    that cannot be read or parsed, or holds no object (a temp file mid-write, another tool's
    JSON), is skipped: the one way every reader of records meets them."""
    for p in sorted(Path(directory).glob(pattern)):
        try:
            rec = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict):
            yield p, rec


def same_trial(directory: str | os.PathLike, record: dict[str, Any]) -> Path | None:
    """The ok record in `directory` that already holds this trial of this point, if any."""
    key = trial_key(record)
    if key is None:
        return None
    for p, other in iter_records(directory):
        if other.get("status") == "ok" and trial_key(other) == key:
            return p
    return None


def duplicate_message(path: Path, record: dict[str, Any]) -> str:
    trial = (record.get("config") or {}).get("trial", 0)
    return (f"trial={trial} of this point is already recorded in {path}; a second record would be counted "
            f"as another trial. Pass trial={int(trial) + 1} (or -m trial=...) for another trial, or a new run_id=")


def skipped_message(path: Path, record: dict[str, Any]) -> str:
    trial = (record.get("config") or {}).get("trial", 0)
    return (f"trial={trial} of this point is already recorded in {path}: skipped. Pass trial={int(trial) + 1} "
            "(or -m trial=...) for another trial, or a new run_id=")


def write_record(directory: str | os.PathLike, record: dict[str, Any], stem: str) -> Path:
    """Write `record` as <directory>/<stem>-<n>.json atomically: a temp file, fsync, then a
    hard link that fails if the name exists (so nothing is ever overwritten).

    Strict JSON (no NaN/Infinity: see `finite`), redacted. An ok record of a trial that an
    ok record in `directory` already holds (a rerun, or a concurrent run, of the same
    run_id and trial) is kept but written with status "duplicate", so no analysis counts
    it twice; the check and the link happen under one lock on the directory."""
    d = Path(directory)
    _flag_overlap(d, record)
    # The record's identity, whatever file it is later copied to: analysis counts a copied
    # run folder or a .bak of a record once (analysis/load.py), not as another trial.
    record.setdefault("record_id", uuid.uuid4().hex)
    try:
        return _write_here(d, record, stem)
    except OSError as e:  # a full disk, a read-only or over-quota filesystem: the measurement is kept elsewhere
        raise rescue(d, record, stem, e) from None


def _span(rec: dict[str, Any]) -> tuple | None:
    """(study id, process, start, end) of a study's record that says when it ran, else None."""
    st = rec.get("study")
    if not isinstance(st, dict) or not all(isinstance(st.get(k), (int, float)) for k in ("started", "ended")):
        return None
    return st.get("id"), (st.get("host"), st.get("pid")), st["started"], st["ended"]


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records of one study were measured at the same time by two processes (a run of
    an earlier attempt of the study still alive, a second study process): each measured the
    other's load, so neither is a trial of the fabric alone."""
    sa, sb = _span(a), _span(b)
    return bool(sa and sb and sa[0] == sb[0] and sa[1] != sb[1] and sa[2] < sb[3] and sb[2] < sa[3])


def overlapped(recs: Sequence[dict[str, Any]]) -> set[int]:
    """Indices of the records that overlap another (`overlap`), or that say so themselves."""
    out = {i for i, r in enumerate(recs) if isinstance(r.get("study"), dict) and r["study"].get("overlapped")}
    timed = [i for i, r in enumerate(recs) if _span(r)]
    for k, i in enumerate(timed):
        out |= {x for j in timed[k + 1:] if overlap(recs[i], recs[j]) for x in (i, j)}
    return out


def _flag_overlap(d: Path, record: dict[str, Any]) -> None:
    """A study's record about to be written: it ends now, and it names the study's records that
    another process measured meanwhile (`<study folder>/<run>/records/`), so that it says itself
    that it is no trial of the fabric alone."""
    st = record.get("study")
    if not isinstance(st, dict) or "started" not in st:
        return
    st.setdefault("ended", time.time())
    hits = [str(p) for p, other in iter_records(d.parent.parent, "*/records/*.json") if overlap(record, other)]
    if hits:
        st["overlapped"] = hits


def _write_here(d: Path, record: dict[str, Any], stem: str) -> Path:
    import fcntl

    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{stem}.{uuid.uuid4().hex}.tmp"
    try:
        with open(d / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if record.get("status") == "ok" and (held := same_trial(d, record)) is not None:
                record["status"], record["error"] = "duplicate", duplicate_message(held, record)
                print(f"warning: {record['error']}; this record is kept with status duplicate", flush=True)
            data = _dumps(record)
            with open(tmp, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            for n in range(100000):
                final = d / f"{stem}-{n:03d}.json"
                try:
                    os.link(tmp, final)
                    return final
                except FileExistsError:
                    continue
            raise RuntimeError(f"no free record name for {stem} in {d}")
    finally:  # also when the write itself failed half-way: no .tmp is left in records/
        tmp.unlink(missing_ok=True)


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(finite(redact(record)), indent=1, default=str, allow_nan=False)


RESCUE_ENV = "FABRICBENCH_RESCUE_DIR"


def rescue_dirs() -> list[Path]:
    """Where a record goes when its records/ folder refuses it, first that takes it: the
    user's choice, then the temp directory, then the home directory (usually other filesystems)."""
    import tempfile

    out = [Path(os.environ[RESCUE_ENV])] if os.environ.get(RESCUE_ENV) else []
    return out + [Path(tempfile.gettempdir()) / "fabricbench-rescued", Path.home() / ".fabricbench-rescued"]


def rescue(directory: Path, record: dict[str, Any], stem: str, error: OSError) -> RecordNotWritten:
    """Keep a record that `directory` refused in the first rescue folder that takes it, and
    the one-line error to raise: what failed, where the record is, what to do."""
    why = f"cannot write the record into {directory} ({error.strerror or error})"
    data = _dumps(record)
    for where in rescue_dirs():
        path = where / f"{stem}-{record['record_id']}.json"
        try:
            where.mkdir(parents=True, exist_ok=True)
            path.write_text(data)
        except OSError:
            path.unlink(missing_ok=True)
            continue
        return RecordNotWritten(f"{why}; this point's record (status {record.get('status')}) is kept at {path}: free "
                                f"space, move it into {directory}, and rerun the points not yet recorded", kept=path)
    return RecordNotWritten(f"{why}, nor into {', '.join(map(str, rescue_dirs()))}; this point's record is lost: "
                            f"free space (or set {RESCUE_ENV}=<a writable folder>) and rerun it")


def load_records(*dirs: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record under the given directories (recursively), each with its `_path`."""
    out = []
    for d in dirs:
        for p, rec in iter_records(d, "**/*.json"):
            # a "schema" that is not a string (a number, a list) is not ours: left for the
            # reader's unread-files warning, not a crash
            if str(rec.get("schema", "")).startswith("fabricbench.record"):
                rec["_path"] = str(p)
                out.append(rec)
    return out
