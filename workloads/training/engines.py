"""Training engines, one per `parallel.engine`: DDP and DeepSpeed ZeRO 1/2/3.

Each takes plain arguments (the model, a `TrainSettings`, the device) rather than the
whole config, and exposes one method: `step(micro_batches) -> loss`, which runs forward
and backward for every micro-batch (gradient accumulation) and one optimizer step.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from workloads.core.errors import UsageError
from workloads.models import moe
from workloads.models.neox import PRECISIONS
from workloads.training.commtimer import CommTimer


@dataclass(frozen=True)
class TrainSettings:
    micro_batch_size: int
    grad_accum_steps: int
    lr: float
    weight_decay: float
    grad_clip: float
    precision: str
    activation_checkpointing: bool


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def _adamw(model: nn.Module, s: TrainSettings) -> torch.optim.Optimizer:
    # GPT-NeoX's Adam betas; fused/foreach chosen by torch for the device.
    return torch.optim.AdamW(model.parameters(), lr=s.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=s.weight_decay)


class DDPEngine:
    def __init__(self, model: nn.Module, s: TrainSettings, device: torch.device, bucket_cap_mb: float = 25,
                 groups: moe.ExpertGroups | None = None):
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.s = s
        self.device = device
        self.module, self.groups = model, groups or moe.ExpertGroups()
        self.experts = bool(moe.expert_parameter_names(model))
        model.to(device)
        if self.experts:  # each rank holds other experts: reduced over their replicas, not the world
            DDP._set_params_and_buffers_to_ignore_for_model(model, moe.expert_parameter_names(model))
        self.model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb)
        self.model.register_comm_hook(None, CommTimer.ddp_hook)
        self.opt = _adamw(model, s)
        self.dtype = PRECISIONS[s.precision]
        self.scaler = torch.amp.GradScaler(device.type) if s.precision == "fp16" else None

    def _autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        n = len(micro_batches)
        for i, (x, y) in enumerate(micro_batches):
            # Only the last micro-batch all-reduces; the others accumulate locally.
            sync = contextlib.nullcontext() if i == n - 1 else self.model.no_sync()
            with sync:
                with self._autocast():
                    loss = (lm_loss(self.model(x), y) + moe.aux_loss(self.module)) / n
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        if self.experts:
            moe.reduce_expert_grads(self.module, self.groups)
        if self.scaler:
            self.scaler.unscale_(self.opt)
        if self.s.grad_clip and self.experts:
            moe.clip_grad_norm(self.module, self.s.grad_clip, self.groups)
        elif self.s.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.s.grad_clip)
        if self.scaler:
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return total


class DeepSpeedEngine:
    def __init__(self, model: nn.Module, s: TrainSettings, device: torch.device, zero_stage: int, **zero_opts):
        import deepspeed

        _skip_inference_shm_op()
        ds_config = {
            "train_micro_batch_size_per_gpu": s.micro_batch_size,
            "gradient_accumulation_steps": s.grad_accum_steps,
            "gradient_clipping": s.grad_clip or 0.0,
            "zero_optimization": {"stage": zero_stage, **zero_opts},
            "bf16": {"enabled": s.precision == "bf16"},
            "fp16": {"enabled": s.precision == "fp16", "loss_scale": 0},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        model.to(device)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=_adamw(model, s), config=ds_config)
        self.device, self.module = device, model

    def step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for x, y in micro_batches:
            # DeepSpeed scales the loss by 1/accum itself and steps at the boundary.
            loss = lm_loss(self.engine(x), y) + moe.aux_loss(self.module)  # EP = 1 here (run.validate)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach() / len(micro_batches)
        return total


def _skip_inference_shm_op() -> None:
    """DeepSpeed's CPU backend JIT-compiles a shared-memory all_reduce at init (a C++
    compiler and a minute on a fresh machine). Training never calls it (it serves
    `inference_all_reduce` only), so mark it unavailable; gradients go through the
    process group like every other engine's."""
    import deepspeed.ops

    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


ENGINES: dict[str, Callable[..., object]] = {"ddp": DDPEngine, "deepspeed": DeepSpeedEngine}


def build_engine(parallel: dict, model: nn.Module, s: TrainSettings, device: torch.device,
                 groups: moe.ExpertGroups | None = None):
    name = parallel.get("engine")
    if name not in ENGINES:
        raise UsageError(f"parallel.engine={name!r}; use one of {', '.join(ENGINES)}")
    if name == "ddp":
        return DDPEngine(model, s, device, bucket_cap_mb=parallel.get("bucket_cap_mb", 25), groups=groups)
    opts = {k: parallel[k] for k in ("overlap_comm", "reduce_bucket_size", "allgather_bucket_size") if k in parallel}
    if int(parallel["zero_stage"]) == 3:
        opts.pop("allgather_bucket_size", None)  # stage 3 gathers by prefetch buckets instead
    return DeepSpeedEngine(model, s, device, zero_stage=int(parallel["zero_stage"]), **opts)
