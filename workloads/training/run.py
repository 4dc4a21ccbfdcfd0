"""The training workload: validate, apply the fabric, init, train, measure, record.

`run_training(cfg)` is called once per sweep point by launch/train.py. Order matters:
the fabric's environment is exported before the process group exists; everything that
can be checked without a process group is checked before it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from workloads.core import dist as fdist
from workloads.core import session
from workloads.training.commtimer import CommTimer, comm_dtypes
from workloads.training.data import synthetic_batches, token_file_batches
from workloads.training.engines import PRECISIONS, TrainSettings, build_engine
from workloads.core.errors import UsageError
from workloads.fabric.profile import FabricProfile
from workloads.models.hf import load_hf, load_hf_config
from workloads.core.loggers import build_loggers
from workloads.training.metrics import flops_per_iteration, peak_tflops_for, summarize_training, tflops_per_gpu
from workloads.models.neox import GPTNeoX, NeoXConfig
from workloads.fabric.nic import NicSampler, rails_for
from workloads.fabric.preflight import preflight
from workloads.core.records import check_writable, fingerprint
from workloads.fabric.verify import check_transport


@dataclass(frozen=True)
class BatchLayout:
    """Who processes how much of a global batch: the one place the degrees are checked."""

    micro_batch_size: int
    grad_accum_steps: int
    data_parallel: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch_size * self.grad_accum_steps * self.data_parallel

    @classmethod
    def resolve(cls, micro: int, accum: int, global_batch: int | None, world: int) -> BatchLayout:
        if micro is None or int(micro) <= 0:
            raise UsageError(f"train.micro_batch_size must be a positive integer, got {micro}")
        if accum is None or int(accum) <= 0:
            raise UsageError(f"train.grad_accum_steps must be a positive integer, got {accum}")
        if global_batch is not None:
            g = int(global_batch)
            if g <= 0:
                raise UsageError(f"train.global_batch_size must be positive, got {g}")
            per_step = int(micro) * world
            if g % per_step:
                raise UsageError(
                    f"train.global_batch_size={g} is not divisible by micro_batch_size ({micro}) "
                    f"x world size ({world}) = {per_step}; choose a multiple of {per_step}"
                )
            accum = g // per_step
        return cls(int(micro), int(accum), world)


def model_config(cfg: DictConfig) -> NeoXConfig:
    if cfg.init.get("checkpoint"):
        return load_hf_config(cfg.init.checkpoint)
    shape = ("num_layers", "hidden_size", "num_attention_heads", "seq_length")
    missing = [k for k in shape if cfg.model.get(k) is None]
    if missing:
        raise UsageError(
            f"model={cfg.model.get('name')} has no GPT-NeoX shape ({', '.join(missing)} missing): it describes a "
            "served model for launch/infer.py; train neox-tiny, neox-125m ... neox-6.7b, pythia-160m or pythia-1.4b"
        )
    return NeoXConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))


# Every key of the `train:` section (conf/workload/pretrain.yaml); a `+train.<typo>=` override
# would otherwise be accepted and silently ignored.
TRAIN_KEYS = frozenset({"micro_batch_size", "grad_accum_steps", "global_batch_size", "seq_length", "steps",
                        "warmup_steps", "lr", "weight_decay", "grad_clip", "precision", "activation_checkpointing"})


def _int(name: str, value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"{name}={value!r} must be an integer") from None


def validate(cfg: DictConfig, world: int) -> tuple[NeoXConfig, BatchLayout, FabricProfile]:
    """Everything checkable before a process group exists. Raises UsageError."""
    fabric = FabricProfile.from_config(OmegaConf.to_container(cfg.fabric, resolve=True))
    if cfg.workload.name == "finetune" and OmegaConf.is_missing(cfg.init, "checkpoint"):
        raise UsageError("workload=finetune needs init.checkpoint=<local Hugging Face GPT-NeoX directory>")
    mcfg = model_config(cfg)
    t = cfg.train
    unknown = sorted(set(t) - TRAIN_KEYS)
    if unknown:
        import difflib

        hints = [f"train.{k}" + (f" (did you mean train.{m[0]}?)" if (m := difflib.get_close_matches(k, TRAIN_KEYS, 1))
                                 else "") for k in unknown]
        raise UsageError(f"unknown setting {', '.join(hints)}; the train settings are {', '.join(sorted(TRAIN_KEYS))}")
    for key in ("micro_batch_size", "grad_accum_steps", "steps", "warmup_steps"):
        _int(f"train.{key}", t[key])
    if t.global_batch_size is not None:
        _int("train.global_batch_size", t.global_batch_size)
    layout = BatchLayout.resolve(t.micro_batch_size, t.grad_accum_steps, t.global_batch_size, world)
    seq = _int("train.seq_length", t.seq_length)
    if seq <= 0:
        raise UsageError(f"train.seq_length must be positive, got {seq}")
    if seq > mcfg.max_position_embeddings:
        raise UsageError(
            f"train.seq_length={seq} exceeds the model's max_position_embeddings="
            f"{mcfg.max_position_embeddings}; use train.seq_length<={mcfg.max_position_embeddings}"
        )
    if int(t.warmup_steps) < 1 or int(t.steps) <= int(t.warmup_steps):
        raise UsageError(
            f"train.steps={t.steps} must exceed train.warmup_steps={t.warmup_steps}, and warm-up must be at "
            "least 1 step: step 0 builds communicators and DDP buckets, and only steps after warm-up are timed"
        )
    if t.precision not in PRECISIONS:
        raise UsageError(f"train.precision={t.precision!r}; use one of {', '.join(PRECISIONS)}")
    if fabric.backend == "gloo" and t.precision == "fp16":
        raise UsageError("train.precision=fp16 needs a GPU; on CPU use fp32 or bf16")
    if cfg.parallel.engine not in ("ddp", "deepspeed"):
        raise UsageError(f"parallel.engine={cfg.parallel.engine!r}; use ddp or deepspeed")
    if cfg.data.kind == "tokens":
        from workloads.training.data import check_token_file

        check_token_file(cfg.data.path, cfg.data.dtype)
    elif cfg.data.kind != "synthetic":
        raise UsageError(f"data.kind={cfg.data.kind!r}; use synthetic or tokens")
    fabric.check_backend_usable()
    preflight(fabric)  # sysfs: the HCAs, GID and interfaces the profile names exist and are up
    check_writable(cfg.output_root)
    return mcfg, layout, fabric


def _transport_line(transport: dict | None) -> str:
    """One line of what verification saw: Gloo's interfaces, or NCCL's networks and devices."""
    if not transport:
        return "not verified"
    s = transport.get("summary") or {}
    networks = [s["network"]] if s.get("network") else list(s.get("networks") or [])
    where = s.get("interfaces") or [f"{d['name']}:{d.get('port')}/{d.get('link_layer')}" for d in s.get("devices") or []]
    channels = ", ".join(f"{k} x{v}" for k, v in (s.get("channels") or {}).items())
    seen = " ".join(x for x in (",".join(networks), ",".join(where), f"[{channels}]" if channels else "") if x)
    return f"{transport.get('verdict')}: {seen or 'no evidence'}"


def _print_summary(record: dict, info: fdist.DistInfo, layout: BatchLayout, cfg: DictConfig, path: Path) -> None:
    metrics = record["metrics"]

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    rows = [
        ("fabric", f"{cfg.fabric.name} ({info.backend})"),
        ("transport", _transport_line(record["fabric"].get("transport"))),
        ("model", f"{cfg.model.name}, {cfg.parallel.name}, {cfg.train.precision}"),
        ("world", f"{info.world_size} ranks on {info.nodes} node(s)"),
        ("global batch", f"{layout.global_batch} = {layout.micro_batch_size} x {layout.grad_accum_steps} x {layout.data_parallel}"),
        ("iteration time", f"{fmt(metrics['iteration_time(s)'], '.4f')} s  (std {fmt(metrics['iteration_time_std(s)'], '.4f')}, {metrics['measured_steps']} steps)"),
        ("samples/s", fmt(metrics["samples_per_sec"], ".2f")),
        ("tokens/s", fmt(metrics["tokens_per_sec"], ".1f")),
        ("TFLOPS/GPU", fmt(metrics["tflops_per_gpu"], ".4f")),
        ("MFU", fmt(metrics["mfu"], ".2%")),
        ("comm share", fmt(metrics["comm_share"], ".1%")),
        ("record", str(path)),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows), flush=True)


def run_training(cfg: DictConfig, overrides: list[str] | None = None) -> Path | None:
    """Run one measured point. Returns the record path on rank 0, None elsewhere."""
    _, world, _, _ = fdist.launch_env()
    mcfg, layout, fabric = validate(cfg, world)
    info, run_dir, applied_env = session.start(cfg, fabric)
    loggers = build_loggers(cfg, info)  # rank 0's trackers (W&B); a no-op list elsewhere
    record = session.base_record(
        cfg.workload.name, cfg, fabric, applied_env, run_dir.name, overrides,
        model=mcfg.to_dict() | {"padded_vocab": mcfg.padded_vocab, "name": cfg.model.name},
        world={"world_size": info.world_size, "nodes": info.nodes, "local_world_size": info.local_world_size},
        batch={"micro_batch_size": layout.micro_batch_size, "grad_accum_steps": layout.grad_accum_steps,
               "global_batch_size": layout.global_batch, "seq_length": int(cfg.train.seq_length)},
        fingerprint=fingerprint(),
        metrics={},
        samples={},
    )
    stem = f"{cfg.workload.name}-{fabric.name}-{cfg.model.name}-{cfg.parallel.name}-mb{layout.micro_batch_size}"
    recorded = session.Recorded(record, run_dir / "records", stem, write=info.is_main)
    try:
        with recorded:
            _measure(cfg, mcfg, layout, fabric, info, run_dir, record, loggers)
    finally:
        if info.is_main:
            if record["status"] == "ok":
                _print_summary(record, info, layout, cfg, recorded.path)
            else:
                print(f"run failed; record with the error: {recorded.path}", flush=True)
            loggers.log_summary(record)  # after the local record is safely written
        loggers.close()
    return recorded.path


def _measure(cfg: DictConfig, mcfg: NeoXConfig, layout: BatchLayout, fabric: FabricProfile,
             info: fdist.DistInfo, run_dir: Path, record: dict, loggers) -> None:
    """Build, warm up, time every step; fill the record's metrics and samples."""
    t = cfg.train
    torch.manual_seed(int(cfg.seed))  # the same initial weights on every rank
    model = load_hf(cfg.init.checkpoint) if cfg.init.get("checkpoint") else GPTNeoX(mcfg)
    model.checkpoint_activations = bool(t.activation_checkpointing)
    settings = TrainSettings(layout.micro_batch_size, layout.grad_accum_steps, float(t.lr), float(t.weight_decay),
                             float(t.grad_clip), str(t.precision), bool(t.activation_checkpointing))
    seq, warmup, accum = int(t.seq_length), int(t.warmup_steps), layout.grad_accum_steps
    data_kw = dict(seed=int(cfg.seed), rank=info.rank, vocab=min(mcfg.vocab_size, mcfg.padded_vocab),
                   micro_batch=layout.micro_batch_size, seq=seq, device=info.device)
    if cfg.data.kind == "tokens":
        pool = token_file_batches(path=cfg.data.path, dtype=cfg.data.dtype, world=info.world_size, **data_kw)
    else:
        pool = synthetic_batches(**data_kw)
    timer = CommTimer(info.device)
    engine = build_engine(OmegaConf.to_container(cfg.parallel, resolve=True), model, settings, info.device)
    flops = flops_per_iteration(global_batch=layout.global_batch, seq_length=seq, num_layers=mcfg.num_layers,
                                hidden_size=mcfg.hidden_size, padded_vocab=mcfg.padded_vocab,
                                checkpoint_activations=bool(t.activation_checkpointing))
    nic = NicSampler()
    step_times, comm_times, losses, comm_bytes = [], [], [], []
    with timer.active():
        for step in range(int(t.steps)):
            micro = [pool[(step * accum + i) % len(pool)] for i in range(accum)]
            fdist.synchronize(info.device)
            if step >= warmup:
                nic.begin_step()  # counter reads stay outside the timed window
            timer.begin_step()
            t0 = time.perf_counter()
            loss = engine.step(micro)
            fdist.synchronize(info.device)
            step_times.append(time.perf_counter() - t0)
            comm_times.append(timer.end_step())
            comm_bytes.append(dict(timer.step_bytes))
            if step >= warmup:
                nic.end_step()
            if step == 0:  # after the first collectives, before anything is timed for the summary
                record["fabric"]["transport"] = check_transport(fabric, run_dir, info)
            losses.append(float(loss))
            dt = step_times[-1]  # W&B buffers these unless logger.live
            loggers.log_step(step, {"step_time(s)": dt, "samples_per_sec": layout.global_batch / dt,
                                    "tflops_per_gpu": tflops_per_gpu(flops, dt, info.world_size),
                                    "loss": losses[-1], "warmup": step < warmup})
    summary = summarize_training(
        step_times_s=step_times, warmup_steps=warmup, global_batch=layout.global_batch, seq_length=seq,
        num_layers=mcfg.num_layers, hidden_size=mcfg.hidden_size, padded_vocab=mcfg.padded_vocab,
        checkpoint_activations=bool(t.activation_checkpointing), world_size=info.world_size,
        peak_tflops=peak_tflops_for(record["fingerprint"].get("gpu") or "", cfg.metrics.get("peak_tflops"),
                                    str(t.precision)),
        comm_times_s=comm_times,
    )
    record["nic"] = nic.summary(rails_for(fabric, os.environ, record["fabric"].get("transport")))
    record["metrics"] = summary.as_metrics() | {"final_loss": losses[-1]}
    record["comm"] = comm_dtypes(comm_bytes, warmup)  # which dtype the gradient collectives moved
    record["samples"] = {"step_time_s": step_times, "comm_time_s": comm_times, "loss": losses,
                         "warmup_steps": warmup}
