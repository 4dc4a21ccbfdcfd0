"""Loggers: the same metric dicts fanned out to tracking backends; none computes anything.

The console summary and the JSON record are written by the workload itself; this module
adds optional trackers chosen by `logger=` (conf/logger/*.yaml):

    none   nothing (the default)
    wandb  Weights & Biases, rank 0 only; offline (files under WANDB_DIR) unless an API
           key is set. A W&B failure warns once and is then ignored: it never fails the
           workload, and the local record is written before W&B is told anything.

It also owns the W&B layout of a record (`record_to_wandb` / `record_from_wandb`), so
analysis/ reads runs back from W&B through the exact inverse of what was written.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from workloads import catalog
from workloads.core.errors import UsageError
from workloads.core.records import SEP, flatten, unflatten
from workloads.core.redact import redact

# Record sections that describe a run (identity, to the W&B config); metrics go to the summary.
IDENTITY_SECTIONS = ("workload", "record_id", "run_id", "status", "error", "overrides", "config", "model", "fabric", "world",
                     "batch", "fingerprint", "collectives", "server", "point", "arrival")
# Per-size tables that analysis plots (busbw vs size, p2p latency vs size): kept whole in
# the summary under these keys, and put back where a record has them.
TABLE_SECTIONS = ("rows", "p2p")
TABLE = "table"  # summary prefix of those (W&B reserves keys that start with "_")


def record_to_wandb(record: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config, summary) for W&B: identity sections flattened and redacted; metrics as
    summary keys unchanged (units in the names); the verified transport under
    `transport/...`."""
    ident = {k: record[k] for k in IDENTITY_SECTIONS if k in record}
    config = flatten(redact(ident))  # redact also hides secret-looking `key=value` overrides
    summary = {k: v for k, v in dict(record.get("metrics") or {}).items() if isinstance(v, (int, float)) or v is None}
    summary |= {f"{TABLE}{SEP}{k}": record[k] for k in TABLE_SECTIONS if record.get(k)}
    return config, summary


def record_from_wandb(config: Mapping[str, Any], summary: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The inverse of `record_to_wandb`: a record analysis/ can read like a local one."""
    rec = unflatten({k: v for k, v in config.items() if not str(k).startswith("_")})
    rec.setdefault("schema", "fabricbench.record/1")
    rec["metrics"] = {k: v for k, v in summary.items() if not str(k).startswith(("_", TABLE + SEP))}
    for k in TABLE_SECTIONS:
        table = summary.get(f"{TABLE}{SEP}{k}")
        if table:
            rec[k] = list(table)
    rec["_path"] = source
    return rec


class Logger:
    """The no-op logger: what `logger=none` and every rank but 0 get."""

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def log_summary(self, record: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class Loggers(list):
    """A list of loggers that is itself a logger: one call fans out to all."""

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        for lg in self:
            lg.log_step(step, metrics)

    def log_summary(self, record: Mapping[str, Any]) -> None:
        for lg in self:
            lg.log_summary(record)

    def close(self) -> None:
        for lg in self:
            lg.close()


def _tag(s: str) -> str:
    return str(s)[:64]  # W&B rejects tags longer than 64 characters


# Set once a W&B call failed in this process: later loggers do not try again.
_DOWN: list[str] = []


class WandbLogger(Logger):
    """Weights & Biases on rank 0.

    With `live: false` (the default) per-step metrics are kept in a list and W&B is
    started only after the timed loop, in `log_summary`: its background service then
    never competes for CPU with the steps being timed. `live: true` starts it at build
    time and logs every step as it happens (for long runs you want to watch).
    Every call into wandb goes through `_guard`: the first failure warns once and turns
    the logger into a no-op — for the rest of this process too (`_DOWN`): a sweep makes one
    logger per point, and an unreachable W&B must cost one init timeout, not one per point.
    """

    def __init__(self, settings: Mapping[str, Any], init_config: dict[str, Any], name: str,
                 group: str, job_type: str, tags: list[str], wandb_module: Any = None):
        self.s = dict(settings)
        self.init_config, self.name, self.group, self.job_type, self.tags = init_config, name, group, job_type, tags
        self._wandb = wandb_module
        self._run = None
        self._dead = False
        self._pending: list[tuple[int, dict[str, Any]]] = []
        if _DOWN:
            self._dead = True
        elif self.s.get("live"):
            self._guard("init", self._start)

    def _guard(self, what: str, fn: Callable[[], Any]) -> Any:
        if self._dead:
            return None
        try:
            return fn()
        except BaseException as e:  # noqa: BLE001 - W&B must never take the workload down
            if isinstance(e, KeyboardInterrupt):
                raise
            self._dead = True
            _DOWN.append(what)
            msg = f"W&B {what} failed ({type(e).__name__}: {e}); W&B logging is off for the rest of this run, the local record is unaffected"
            print(f"warning: {msg}", file=sys.stderr, flush=True)
            return None

    def mode(self) -> str:
        explicit = self.s.get("mode") or os.environ.get("WANDB_MODE")
        if explicit:
            return str(explicit)
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"

    def _start(self) -> None:
        if self._run is not None:
            return
        if self._wandb is None:
            import wandb

            self._wandb = wandb
        wb = self._wandb
        self._run = wb.init(
            entity=self.s.get("entity"), project=self.s.get("project") or "fabricbench",
            dir=self.s.get("dir") or os.environ.get("WANDB_DIR") or None,
            name=self.name, group=self.group, job_type=self.job_type, tags=self.tags,
            config=self.init_config, mode=self.mode(), reinit="finish_previous",
            settings=wb.Settings(init_timeout=float(self.s.get("init_timeout_s") or 30), silent=True,
                                 x_disable_stats=not self.s.get("live"), disable_git=True, console="off",
                                 # metadata carries sys.argv, and argv can carry a secret override
                                 x_disable_meta=True),
        )

    def log_step(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self._dead:
            return
        if self._run is None:
            self._pending.append((step, dict(metrics)))
            return
        self._guard("log", lambda: self._run.log(dict(metrics), step=step))

    def log_summary(self, record: Mapping[str, Any]) -> None:
        def send():
            self._start()
            for step, m in self._pending:
                self._run.log(m, step=step)
            self._pending.clear()
            config, summary = record_to_wandb(record)
            self._run.config.update(config, allow_val_change=True)
            for k, v in summary.items():
                self._run.summary[k] = v
            self._run.summary["status"] = record.get("status")

        self._guard("summary", send)

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            self._guard("finish", lambda: run.finish(exit_code=0))


@dataclass(frozen=True)
class Tracking:
    """What the trackers need of a run, taken once from its resolved config at the entry
    (`from_config`), so no logger reads a Hydra config: which tracker and its settings, the
    names a W&B run, group and tags are made of, and the config W&B is started with."""

    logger: str                      # logger.name: a key of LOGGERS
    settings: Mapping[str, Any]      # the logger: section (conf/logger/*.yaml)
    workload: str
    fabric: str
    model: str | None                # None: the config has no model: section
    parallel: str                    # "none" without a parallel: section, or where it does not apply
    server: str                      # "none" without a server: section
    micro_batch: int | None          # train.micro_batch_size, in a training run's W&B name
    run_id: str | None
    config: Mapping[str, Any]        # the whole resolved config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Tracking:
        """From the resolved config as a plain dict (OmegaConf.to_container(cfg, resolve=True))."""
        logger = config.get("logger")
        train = config.get("train")
        return cls(
            logger=str(logger["name"]) if logger is not None and "name" in logger else "none",
            settings=dict(logger or {}), workload=str(config["workload"]["name"]),
            fabric=str(config["fabric"]["name"]),
            model=str(config["model"]["name"]) if "model" in config else None,
            # every workload's config composes the root's parallel group; served inference,
            # collectives and link measure nothing with it (the catalog's not_applicable)
            parallel=str(config["parallel"]["name"]) if "parallel" in config and "parallel" not in
            catalog.field(str(config["workload"]["name"]), "not_applicable", ()) else "none",
            server=str(config["server"]["name"]) if "server" in config else "none",
            micro_batch=train.get("micro_batch_size") if train is not None else None,
            run_id=os.path.basename(str(config.get("run_id") or "")) or None, config=config)


def _default_group(t: Tracking, world: int) -> str:
    """Runs of one comparison share everything but the fabric: group them by that."""
    pattern = catalog.field(t.workload, "group", catalog.Workload.group)
    return pattern.format(workload=t.workload, model=t.model or "none", server=t.server, parallel=t.parallel,
                          world=world)


def _wandb_logger(t: Tracking, info: Any, label: str | None = None) -> Logger:
    world = int(info.world_size)
    group = t.settings.get("group") or _default_group(t, world)
    name = "-".join(str(p) for p in (t.fabric, t.model, t.parallel, f"mb{t.micro_batch}" if t.micro_batch is not None
                                     else None, label, t.run_id) if p)
    tags = [_tag(x) for x in (f"fabric:{t.fabric}", f"model:{t.model}", f"parallel:{t.parallel}",
                              *(t.settings.get("tags") or []))]
    init_config = flatten(redact({"workload": t.workload, "config": t.config,
                                  "world": {"world_size": world, "nodes": info.nodes}}))
    return WandbLogger(t.settings, init_config, name, group, t.workload, tags)


LOGGERS: dict[str, Callable[..., Logger | None]] = {
    "none": lambda tracking, info, label=None: None,
    "wandb": _wandb_logger,
}


def build_loggers(tracking: Tracking, info: Any, label: str | None = None) -> Loggers:
    """The trackers `tracking.logger` (logger.name) selects, on rank 0 only (other ranks: none).
    `info` needs is_main, world_size and nodes; `label` names a sweep point in the run name."""
    name = tracking.logger
    if name not in LOGGERS:
        raise UsageError(f"logger.name={name!r}; use one of {', '.join(LOGGERS)} (logger=<name>)")
    if not info.is_main:
        return Loggers()
    try:
        lg = LOGGERS[name](tracking, info, label)
    except Exception as e:  # a tracker must never take the workload down
        print(f"warning: logger {name} not started ({type(e).__name__}: {e}); the local record is unaffected",
              file=sys.stderr, flush=True)
        lg = None
    return Loggers([lg] if lg is not None else [])
