"""Result records: one JSON file per measured point, written atomically, never overwritten.

The record is the contract between workloads and analysis/: the config, the fabric
environment as applied, the transport seen, the hardware/software fingerprint, metrics,
raw samples and status. Secrets never enter it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from workloads import REPO_ROOT, catalog
from workloads.core.errors import RecordNotWritten, UsageError

SCHEMA = "fabricbench.record/1"
REDACTED = "<redacted>"
# A key names a secret when its LAST word does (WANDB_API_KEY, HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, password, Authorization, --api-key): a metric
# such as total_token_throughput or a setting such as max_tokens ends in another word.
_SECRET_LAST = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS",
                "AUTHORIZATION", "AUTH", "COOKIE"}
# Values that are credentials wherever they appear (a command line, a header, an error):
# Hugging Face, OpenAI-style, GitHub, Slack and AWS access keys, and HTTP auth schemes.
_SECRET_VALUES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16})\b"
    r"|(?<=Bearer )[A-Za-z0-9._~+/\-]+=*|(?<=Basic )[A-Za-z0-9+/]+=*"
    r"|(?i:(?<=authorization: ))\S+|(?i:(?<=authorization=))\S+")


def is_secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", str(name).upper()) if w]
    return bool(words) and words[-1] in _SECRET_LAST


_ASSIGNMENT = re.compile(r"^([+~]*[A-Za-z0-9_.\-/]+)=(.*)$", re.S)


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


def redact_text(text: str, values: Sequence[str] = ()) -> str:
    """Known credential values replaced wherever they occur in free text; also each of
    `values` (see `secret_values`), whatever its shape, replaced literally."""
    for v in values:
        text = text.replace(v, REDACTED)
    return _SECRET_VALUES.sub(REDACTED, text)


def secret_values(environ: Mapping[str, str], shortest: int = 8) -> list[str]:
    """The values of an environment's secret-named variables (HF_TOKEN, WANDB_API_KEY, ...)
    for `redact_text`: a process's own output (an engine's traceback, a dump of its config)
    can carry them verbatim in any shape. Values shorter than `shortest` (a flag such as
    "1") would blank ordinary text, so they are left; longest first, so a value containing
    another is hidden whole."""
    return sorted({v for k, v in environ.items() if is_secret_name(k) and len(v.strip()) >= shortest},
                  key=len, reverse=True)


def _hide(value: Any) -> Any:
    """A secret-named value is hidden unless it cannot be a credential: empty, or a number
    or boolean (a metric or a flag is never a key)."""
    if value is None or value == "" or isinstance(value, (bool, int, float)):
        return value
    return REDACTED


def redact(obj: Any) -> Any:
    """The one redaction of fabricbench: records, W&B config, the server log's command line
    and Hydra's error line all go through it. Hides the value of a mapping key, a `key=value`
    string (a Hydra override such as `+fabric.env.HF_TOKEN=...`) or a `--flag value` pair
    whose name is a secret's, and any known credential value in any string. Numbers stay."""
    if isinstance(obj, dict):
        return {k: (_hide(v) if is_secret_name(k) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [redact(v) for v in obj]
        for i in range(len(out) - 1):  # argv: --hf-token <value>
            flag = obj[i]
            if isinstance(flag, str) and flag.startswith("-") and "=" not in flag and is_secret_name(flag):
                out[i + 1] = _hide(obj[i + 1])
        return out
    if isinstance(obj, str):
        m = _ASSIGNMENT.match(obj.lstrip("-") if obj.startswith("--") else obj)
        if m and is_secret_name(m.group(1).rsplit(".", 1)[-1]) and m.group(2):
            return obj[: obj.index("=")] + "=" + REDACTED
        return redact_text(obj)
    return obj


def redact_argv(argv: Sequence[str]) -> str:
    """A command line as one printable, redacted string."""
    return " ".join(redact(list(argv)))


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


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@lru_cache(maxsize=1)
def git_commit() -> dict[str, Any]:
    """The code a run measured: the commit, and a hash of the uncommitted changes to tracked
    files (`dirty_hash`, None when there are none). A commit alone would pool a run of an
    edited checkout with the clean runs of the same commit; the hash makes the edit identity
    (analysis/guard.py), as a commit is. Untracked files are not code git knows of: results,
    caches and local configs lie there."""
    commit = _run(["git", "rev-parse", "HEAD"], REPO_ROOT)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO_ROOT)
    diff = _run(["git", "diff", "HEAD", "--binary", "--no-ext-diff", "--no-color"], REPO_ROOT) if dirty else None
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None,
            "dirty_hash": hashlib.sha256(diff.encode()).hexdigest()[:16] if diff else None}


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return None


def cpu_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None  # not Linux


def container_identity(root: str = "/") -> dict[str, Any] | None:
    """The container this process runs in, as its runtime announces it, or None on a host: a
    record made in a container must say so (its devices, limits and /dev/shm are the
    container's, docs/cluster.md). podman writes /run/.containerenv (engine, name, image when
    run as root), docker /.dockerenv, Apptainer sets APPTAINER_CONTAINER (the image), and
    podman, systemd-nspawn and enroot set `container`. Always the same keys (runtime, image, name),
    unknown ones null, so records from different runtimes have one shape."""
    r = Path(root)
    image = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if image:
        return {"runtime": "apptainer", "image": image, "name": None}
    try:
        text = (r / "run" / ".containerenv").read_text()
    except OSError:
        text = None
    if text is not None:
        kv = dict(re.findall(r'^(\w+)="([^"]*)"$', text, re.M))
        return {"runtime": kv.get("engine", "podman"), "image": kv.get("image") or None, "name": kv.get("name") or None}
    if (r / ".dockerenv").exists():
        return {"runtime": "docker", "image": None, "name": None}
    if os.environ.get("container"):
        return {"runtime": os.environ["container"], "image": None, "name": None}
    return None


@lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """Hardware and software this process runs on. Cached: it does not change mid-run."""
    import torch

    cpu = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    fp: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": cpu_affinity(),  # CPUs this process may run on (a Slurm task may get one)
        "container": container_identity(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "fabricbench": _version("fabricbench"),
        "git": git_commit(),
        "gpu": None,
        "gpu_count": 0,
        "driver": None,
        "nccl": None,
    }
    if torch.cuda.is_available():
        fp["gpu"] = torch.cuda.get_device_name(0)
        fp["gpu_count"] = torch.cuda.device_count()
        try:
            fp["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        fp["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if fp["driver"]:
            fp["driver"] = fp["driver"].splitlines()[0]
    return fp


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
        rec["fingerprint"] = with_tuned(rec["fingerprint"], fields.get("config"))
    return rec


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
