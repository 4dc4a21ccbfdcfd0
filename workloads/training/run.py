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

from workloads import session
from workloads.core import dist as fdist
from workloads.core.errors import UsageError
from workloads.core.fingerprint import fingerprint
from workloads.core.loggers import build_loggers
from workloads.fabric import faults
from workloads.fabric.linerate import node_line_rate
from workloads.fabric.nic import NicSampler, gather_summaries, rails_for, summary_rows
from workloads.fabric.profile import FabricProfile
from workloads.fabric.verify import check_transport
from workloads.models import moe
from workloads.models.hf import load_hf, load_hf_config
from workloads.models.neox import PRECISIONS, GPTNeoX, NeoXConfig
from workloads.training.commtimer import CommTimer, comm_dtypes, dump_flight_recorder
from workloads.training.data import synthetic_batches, token_file_batches
from workloads.training.engines import TrainSettings, build_engine
from workloads.training.metrics import (
    ModelShape,
    moe_flops_args,
    peak_tflops_for,
    summarize_moe,
    summarize_training,
    tflops_per_gpu,
)


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


@dataclass(frozen=True)
class TrainPlan:
    """One training point, validated once before any rank starts; everything below the
    entry function reads this, never the Hydra config."""

    workload: str            # pretrain | finetune
    model: NeoXConfig
    model_name: str
    layout: BatchLayout
    fabric: FabricProfile
    settings: TrainSettings
    seq_length: int
    steps: int
    warmup_steps: int
    seed: int
    checkpoint: str | None   # finetune: the local HF directory the weights come from
    data: dict               # kind (synthetic | tokens), path, dtype
    parallel: dict           # conf/parallel/*.yaml as a plain dict (name, engine, ZeRO stage ...)
    peak_tflops: float | None
    run: session.RunContext  # output root, run id, timeout, the config the record carries, the trackers' names
    experts: moe.ExpertLayout | None = None  # an MoE model's EP x TP x DP layout; None: dense

    @property
    def stem(self) -> str:
        return f"{self.workload}-{self.fabric.name}-{self.model_name}-{self.parallel['name']}-mb{self.layout.micro_batch_size}"


def _check_train_keys(t) -> None:
    unknown = sorted(set(t) - TRAIN_KEYS)
    if unknown:
        import difflib

        hints = [f"train.{k}" + (f" (did you mean train.{m[0]}?)" if (m := difflib.get_close_matches(k, TRAIN_KEYS, 1))
                                 else "") for k in unknown]
        raise UsageError(f"unknown setting {', '.join(hints)}; the train settings are {', '.join(sorted(TRAIN_KEYS))}")


def _check_steps(t, mcfg: NeoXConfig, fabric: FabricProfile) -> int:
    seq = int(t.seq_length)  # a positive integer (core/schema.py)
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
    return seq


def validate(cfg: DictConfig, world: int) -> TrainPlan:
    """Everything checkable before a process group exists. Raises UsageError."""
    fabric = session.prepare(cfg)
    if cfg.workload.name == "finetune" and OmegaConf.is_missing(cfg.init, "checkpoint"):
        raise UsageError("workload=finetune needs init.checkpoint=<local Hugging Face GPT-NeoX directory>")
    mcfg = model_config(cfg)
    t = cfg.train
    _check_train_keys(t)
    layout = BatchLayout.resolve(t.micro_batch_size, t.grad_accum_steps, t.global_batch_size, world)
    seq = _check_steps(t, mcfg, fabric)
    if cfg.parallel.engine not in ("ddp", "deepspeed"):
        raise UsageError(f"parallel.engine={cfg.parallel.engine!r}; use ddp or deepspeed")
    if cfg.data.kind == "tokens":
        from workloads.training.data import check_token_file

        check_token_file(cfg.data.path, cfg.data.dtype)
    elif cfg.data.kind != "synthetic":
        raise UsageError(f"data.kind={cfg.data.kind!r}; use synthetic or tokens")
    experts = _expert_layout(cfg, mcfg, world)
    settings = TrainSettings(layout.micro_batch_size, layout.grad_accum_steps, float(t.lr), float(t.weight_decay),
                             float(t.grad_clip), str(t.precision), bool(t.activation_checkpointing))
    peak = cfg.metrics.get("peak_tflops")
    return TrainPlan(
        workload=str(cfg.workload.name), model=mcfg, model_name=model_label(cfg), layout=layout, fabric=fabric,
        settings=settings, seq_length=seq, steps=int(t.steps), warmup_steps=int(t.warmup_steps), seed=int(cfg.seed),
        checkpoint=cfg.init.get("checkpoint") or None,
        data={"kind": str(cfg.data.kind), "path": cfg.data.get("path"), "dtype": cfg.data.get("dtype")},
        parallel=OmegaConf.to_container(cfg.parallel, resolve=True), peak_tflops=None if peak is None else float(peak),
        run=session.context(cfg), experts=experts)


def _expert_layout(cfg: DictConfig, mcfg: NeoXConfig, world: int) -> moe.ExpertLayout | None:
    """EP x TP x DP = world, experts divisible over EP; ZeRO only without expert parallelism
    (DeepSpeed would average different experts' gradients over the world)."""
    p = cfg.parallel
    ep = p.get("expert_parallel") or 1
    if mcfg.moe is None:
        if int(ep) != 1:
            raise UsageError(f"parallel.expert_parallel={ep} needs a mixture-of-experts model (model=neox-moe-tiny ...)")
        return None
    layout = moe.ExpertLayout.resolve(mcfg.moe.num_experts, ep, p.get("tensor_parallel"), p.get("data_parallel"), world)
    if layout.ep > 1 and p.engine != "ddp":
        raise UsageError(f"parallel={p.name} with parallel.expert_parallel={layout.ep}: expert parallelism runs under "
                         "parallel=ddp; under DeepSpeed ZeRO use parallel.expert_parallel=1")
    return layout


def model_label(cfg: DictConfig) -> str:
    """The name of what actually runs: a checkpoint's directory name (its config gave the
    shape), else the model= profile's name."""
    ckpt = cfg.init.get("checkpoint")
    return Path(str(ckpt).rstrip("/")).name if ckpt else str(cfg.model.name)


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


def _print_summary(record: dict, info: fdist.DistInfo, plan: TrainPlan, path: Path) -> None:
    metrics, layout = record["metrics"], plan.layout

    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    rows = [
        ("fabric", f"{plan.fabric.name} ({info.backend})"),
        ("transport", _transport_line(record["fabric"].get("transport"))),
        ("model", f"{plan.model_name}, {plan.parallel['name']}, {plan.settings.precision}"),
        ("world", f"{info.world_size} ranks on {info.nodes} node(s)"),
        ("global batch", f"{layout.global_batch} = {layout.micro_batch_size} x {layout.grad_accum_steps} x {layout.data_parallel}"),
        ("iteration time", f"{fmt(metrics['iteration_time(s)'], '.4f')} s  (std {fmt(metrics['iteration_time_std(s)'], '.4f')}, {metrics['measured_steps']} steps)"),
        ("samples/s", fmt(metrics["samples_per_sec"], ".2f")),
        ("tokens/s", fmt(metrics["tokens_per_sec"], ".1f")),
        ("TFLOPS/GPU", fmt(metrics["tflops_per_gpu"], ".4f")),
        ("MFU", fmt(metrics["mfu"], ".2%")),
        ("comm share", fmt(metrics["comm_share"], ".1%")),
        *_moe_rows(metrics, fmt),
        *summary_rows(record.get("nic")),
        ("record", str(path)),
    ]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"  {k:<{width}}  {v}" for k, v in rows), flush=True)


def _moe_rows(m: dict, fmt) -> list[tuple[str, str]]:
    if "alltoall_share" not in m:
        return []
    return [("all-to-all", f"{fmt(m['alltoall_share'], '.1%')} of step time (dispatch "
                           f"{fmt(m['dispatch_share'], '.1%')}, combine {fmt(m['combine_share'], '.1%')}), "
                           f"{fmt(m['alltoall_bytes_per_step(B)'], '.0f')} B/step, busbw "
                           f"{fmt(m['alltoall_busbw(GB/s)'], '.4f')} GB/s, EP={m['expert_parallel']}"),
            ("routing skew", f"{fmt(m['routing_skew'], '.2f')} max/mean tokens per expert "
                             f"(worst {fmt(m['routing_skew_max'], '.2f')}), dropped {fmt(m['dropped_fraction'], '.1%')}")]


def run_training(cfg: DictConfig, overrides: list[str] | None = None) -> Path | None:
    """Run one measured point. Returns the record path on rank 0, None elsewhere."""
    _, world, _, _ = fdist.launch_env()
    plan = validate(cfg, world)
    info, run_dir, applied_env = session.start(plan.run, plan.fabric)
    loggers = build_loggers(plan.run.tracking, info)  # rank 0's trackers (W&B); a no-op list elsewhere
    layout, mcfg = plan.layout, plan.model
    record = session.base_record(
        plan.workload, plan.run, plan.fabric, applied_env, run_dir.name, overrides,
        model=mcfg.to_dict() | {"padded_vocab": mcfg.padded_vocab, "name": plan.model_name},
        world={"world_size": info.world_size, "nodes": info.nodes, "local_world_size": info.local_world_size},
        batch={"micro_batch_size": layout.micro_batch_size, "grad_accum_steps": layout.grad_accum_steps,
               "global_batch_size": layout.global_batch, "seq_length": plan.seq_length},
        fingerprint=fingerprint(),
        metrics={},
        samples={},
    )
    def summarize(record: dict, path: Path) -> None:
        if record["status"] == "ok":
            _print_summary(record, info, plan, path)
        else:
            print(f"run {record['status']}; record with the error: {path}", flush=True)

    return session.run_point(session.Point(record, run_dir / "records", plan.stem, info),
                             lambda: _measure(plan, info, run_dir, record, loggers), plan.run.tracking, loggers,
                             summarize)


def _build_model(plan: TrainPlan, info: fdist.DistInfo):
    """(model, expert groups or None, its MoE statistics): the same initial weights on every rank."""
    groups = moe.ExpertGroups.build(plan.experts.ep) if plan.experts else None
    torch.manual_seed(plan.seed)
    model = load_hf(plan.checkpoint) if plan.checkpoint else GPTNeoX(plan.model, groups)
    moe_stats = moe.MoEStats(cuda=info.device.type == "cuda")
    moe.attach_stats(model, moe_stats)
    model.checkpoint_activations = plan.settings.activation_checkpointing
    return model, groups, moe_stats


def _measure(plan: TrainPlan, info: fdist.DistInfo, run_dir: Path, record: dict, loggers) -> None:
    """Build, warm up, time every step; fill the record's metrics and samples."""
    mcfg, layout, settings = plan.model, plan.layout, plan.settings
    model, groups, moe_stats = _build_model(plan, info)
    seq, warmup, accum = plan.seq_length, plan.warmup_steps, layout.grad_accum_steps
    pool = _batches(plan, info)
    timer = CommTimer(info.device)
    engine = build_engine(plan.parallel, model, settings, info.device, groups)
    shape = ModelShape(layout.global_batch, seq, mcfg.num_layers, mcfg.hidden_size, mcfg.padded_vocab,
                       settings.activation_checkpointing, moe_flops_args(mcfg.to_dict()))
    flops = shape.flops()
    nic = NicSampler(enabled=info.local_rank == 0)  # one reader per host; rank 0 gathers every node's
    step_times, comm_times, losses, comm_bytes, moe_steps, calls = [], [], [], [], [], []
    # each step's start on the run's clock (seconds since FB_T0, else since the first step): what a
    # fault schedule's events are timed on (workloads/fabric/faults.py)
    starts, t_launch = [], float(os.environ.get("FB_T0") or time.time())
    with timer.active():
        for step in range(plan.steps):
            micro = [pool[(step * accum + i) % len(pool)] for i in range(accum)]
            fdist.synchronize(info.device)
            if step >= warmup:
                nic.begin_step()  # counter reads stay outside the timed window
            if step == warmup and info.rank == 0:
                faults.window_started(time.time())  # a fault schedule counts from the first timed step
            starts.append(time.time() - t_launch)
            timer.begin_step()
            t0 = time.perf_counter()
            loss = engine.step(micro)
            fdist.synchronize(info.device)
            step_times.append(time.perf_counter() - t0)
            comm_times.append(timer.end_step())
            comm_bytes.append(dict(timer.step_bytes))
            calls.append(timer.step_calls())
            moe_steps.append(moe_stats.take())
            if step >= warmup:
                nic.end_step()
            if step == 0:  # after the first collectives, before anything is timed for the summary
                record["fabric"]["transport"] = check_transport(plan.fabric, run_dir, info)
            losses.append(float(loss))
            dt = step_times[-1]  # W&B buffers these unless logger.live
            loggers.log_step(step, {"step_time(s)": dt, "samples_per_sec": layout.global_batch / dt,
                                    "tflops_per_gpu": tflops_per_gpu(flops, dt, info.world_size),
                                    "loss": losses[-1], "warmup": step < warmup})
    summary = summarize_training(
        step_times_s=step_times, warmup_steps=warmup, shape=shape, world_size=info.world_size,
        peak_tflops=peak_tflops_for(record["fingerprint"].get("gpu") or "", plan.peak_tflops, settings.precision),
        comm_times_s=comm_times,
    )
    record["nic"] = _nic(plan, info, record, nic, comm_times[warmup:])
    record["metrics"] = summary.as_metrics() | {"final_loss": losses[-1]}
    if plan.experts:
        record["metrics"] |= summarize_moe(moe_steps, step_times, warmup, plan.experts.ep,
                                           _rank_mean(moe_steps[warmup:], info))
        record["samples"]["moe"] = moe_steps
    record["comm"] = _comm(plan, info, run_dir, comm_bytes, moe_steps, warmup)
    record["samples"] = record.get("samples", {}) | {"step_time_s": step_times, "comm_time_s": comm_times,
                                                     "step_start_s": [round(s, 4) for s in starts],
                                                     "loss": losses, "warmup_steps": warmup,
                                                     # what `launch/replay.py replay.trace=<this record>` replays
                                                     "comm_calls": calls[warmup:][:MAX_TRACED_STEPS]}


def _comm(plan: TrainPlan, info: fdist.DistInfo, run_dir: Path, comm_bytes: list[dict], moe_steps: list[dict],
          warmup: int) -> dict:
    """The record's comm section: which dtype the gradient collectives moved, the Flight
    Recorder's dump, the MoE all-to-alls' dtype."""
    comm = comm_dtypes(comm_bytes, warmup)
    # every rank's own, when TORCH_FR_BUFFER_SIZE was set (fabric.env): rank 0's path is recorded
    comm["flight_recorder"] = dump_flight_recorder(run_dir / "flight_recorder", info.rank)
    if plan.experts:  # the autocast dtype: moe.wire_dtype
        comm["alltoall_dtype"] = next((st["dtype"] for st in moe_steps if st.get("dtype")), None)
    return comm


def _nic(plan: TrainPlan, info: fdist.DistInfo, record: dict, nic: NicSampler, timed_comm: list) -> dict:
    """Every node's NIC counters over the timed steps, against the rails' line rate."""
    rails = rails_for(plan.fabric, os.environ, record["fabric"].get("transport"))
    window = sum(timed_comm) if timed_comm and all(c is not None for c in timed_comm) else None
    return gather_summaries(nic, rails, node_line_rate(rails, plan.fabric.emulate)["rails"], info, window)


MAX_TRACED_STEPS = 50  # a long run's record keeps the collectives of its first 50 timed steps


def _rank_mean(timed: list[dict], info: fdist.DistInfo) -> dict:
    """This rank's all-to-all totals over the timed steps, averaged over every rank (with skew
    each rank sends a different share; one all_reduce after the timed loop)."""
    keys = ("dispatch_s", "combine_s", "bytes")
    t = torch.tensor([float(sum(s[k] for s in timed)) for k in keys], dtype=torch.float64, device=info.device)
    if torch.distributed.is_initialized() and info.world_size > 1:
        torch.distributed.all_reduce(t)
        t /= info.world_size
    return dict(zip(keys, t.tolist()))


def _batches(plan: TrainPlan, info: fdist.DistInfo) -> list:
    """This rank's pool of micro-batches: synthetic tokens, or its shard of a token file."""
    mcfg = plan.model
    data_kw = dict(seed=plan.seed, rank=info.rank, vocab=min(mcfg.vocab_size, mcfg.padded_vocab),
                   micro_batch=plan.layout.micro_batch_size, seq=plan.seq_length, device=info.device)
    if plan.data["kind"] == "tokens":
        return token_file_batches(path=plan.data["path"], dtype=plan.data["dtype"], world=info.world_size, **data_kw)
    return synthetic_batches(**data_kw)
