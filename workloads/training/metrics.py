"""Training metrics, exactly as GPT-NeoX's megatron/logging.py reports them.

The formulas are written once, in docs/metrics.md ("Training metrics"); these pure
functions implement them and tests/training/test_metrics.py pins them with worked values.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# bf16 dense peak TFLOPS per device. Users override or extend it with
# `metrics.peak_tflops=<number>` (see conf/config.yaml).
# Blackwell: NVIDIA's Blackwell datasheet figures as tabulated at
# https://glennklockwood.com/garden/processors/B200 (BF16 dense "Matrix" column): HGX B200 at
# 1000 W 2250, the GB200 variant at 1200 W 2500 (the "5 PFLOPS" in spec sheets is with sparsity).
# MI325X: the MI300X's CDNA 3 die (304 CUs, ROCm's GPU-specs table) with HBM3E, so the MI300X peak.
# MI355X: 256 CUs x 8192 FP8 FLOP/clock/CU (AMD at ISSCC 2026) x 2.4 GHz = 5033 FP8, BF16 half:
# 2516.6. Not every figure is a vendor datasheet line; metrics.peak_tflops overrides any of them.
PEAK_TFLOPS_BF16: dict[str, float] = {
    "A100": 312.0,
    "H100": 989.0,  # SXM
    "H200": 989.0,
    "B200": 2250.0,  # HGX B200
    "GB200": 2500.0,
    "MI300X": 1300.0,
    "MI325X": 1300.0,
    "MI355X": 2516.6,
}


def flops_per_iteration(
    *,
    global_batch: int,
    seq_length: int,
    num_layers: int,
    hidden_size: int,
    padded_vocab: int,
    checkpoint_activations: bool,
) -> float:
    """24·f·B·s·L·h²·(1 + s/(6h) + V/(16·L·h)); f = 4 with activation checkpointing
    (the forward runs twice), else 3 (forward + 2× for backward)."""
    f = 4 if checkpoint_activations else 3
    B, s, L, h, V = global_batch, seq_length, num_layers, hidden_size, padded_vocab
    return 24.0 * f * B * s * L * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * L * h))


def moe_flops_per_iteration(*, num_experts: int, top_k: int, expert_ffn_size: int, gated: bool, **shape) -> float:
    """Active-expert FLOPs: f·B·s·[L·(8h² + 4sh + 2·m·k·h·F + 2·h·E) + 1.5·h·V].

    Per token and layer, forward: attention 8h² (QKV 6h², output 2h²) + 4sh (scores and
    values); the k experts a token is routed to, each m matrices of h×F (m = 2, or 3 for
    SwiGLU) at 2 FLOPs per multiply-add; the router 2·h·E. The logit layer is GPT-NeoX's
    1.5·h·V (its V/(16·L·h) term). f as for dense models. With k = 1, E = 0, m = 2 and F = 4h
    this is GPT-NeoX's dense formula exactly. Experts count at k per token whether or not the
    capacity dropped an assignment (as Megatron-LM's num_floating_point_operations)."""
    f, B, s, L, h, V = _shape(**shape)
    m = 3 if gated else 2
    per_layer = 8.0 * h * h + 4.0 * s * h + 2.0 * m * top_k * h * expert_ffn_size + 2.0 * h * num_experts
    return float(f) * B * s * (L * per_layer + 1.5 * h * V)


def _shape(*, global_batch: int, seq_length: int, num_layers: int, hidden_size: int, padded_vocab: int,
           checkpoint_activations: bool) -> tuple[int, ...]:
    """(f, B, s, L, h, V) of flops_per_iteration's keywords, for the MoE formula."""
    return 4 if checkpoint_activations else 3, global_batch, seq_length, num_layers, hidden_size, padded_vocab


def moe_flops_args(model: dict) -> dict | None:
    """The MoE terms of a model dict (a record's `model`, NeoXConfig.to_dict()); None: dense."""
    moe = model.get("moe")
    if not moe:
        return None
    ffn = moe.get("expert_ffn_size") or model.get("intermediate_size") or 4 * int(model["hidden_size"])
    return {"num_experts": int(moe["num_experts"]), "top_k": int(moe["top_k"]), "expert_ffn_size": int(ffn),
            "gated": moe.get("activation") == "swiglu"}


def model_flops(*, moe: dict | None = None, **shape) -> float:
    """FLOPs per iteration of a dense (moe None) or MoE model (moe: moe_flops_args)."""
    return moe_flops_per_iteration(**shape, **moe) if moe else flops_per_iteration(**shape)


def tflops_per_gpu(flops_per_iter: float, iteration_time_s: float, world_size: int) -> float:
    return flops_per_iter / (iteration_time_s * world_size) / 1e12


# Board variants whose peak differs from the table's SXM/OAM figure (H100 PCIe is 756,
# not 989): rather than report a wrong MFU, report none unless the user gives the peak.
_OTHER_VARIANTS = ("PCIE", "NVL")


def peak_tflops_for(device_name: str, override: float | None = None, precision: str = "bf16") -> float | None:
    """Peak bf16 TFLOPS for a device name such as 'NVIDIA H100 80GB HBM3' or 'AMD Instinct
    MI300X'. None when unknown (MFU is then not reported rather than guessed), and for
    fp32 runs: the table holds bf16/fp16 dense peaks, and an fp32 run divided by them
    would read as a meaningless few percent (a user override is taken as meant)."""
    if override:
        return float(override)
    if precision not in ("bf16", "fp16"):
        return None
    family = gpu_family(device_name)
    return None if family is None else PEAK_TFLOPS_BF16[family]


def gpu_family(device_name: str) -> str | None:
    """The peak table's key for a device name ('NVIDIA H200' -> 'H200'); None for a GPU not in
    it, and for the H100/H200 board variants (NVL, PCIe) whose peak differs from the SXM row."""
    upper = device_name.upper()
    for key in sorted(PEAK_TFLOPS_BF16, key=len, reverse=True):
        if key in upper:
            if key in ("H100", "H200") and any(v in upper for v in _OTHER_VARIANTS):
                return None
            return key
    return None


@dataclass(frozen=True)
class TrainingSummary:
    iteration_time_s: float
    iteration_time_std_s: float
    samples_per_sec: float
    tokens_per_sec: float
    tflops_per_gpu: float
    mfu: float | None
    peak_tflops: float | None
    comm_share: float | None
    measured_steps: int

    def as_metrics(self) -> dict[str, float | int | None]:
        # Keys carry units so a W&B panel or a CSV column is never ambiguous.
        return {
            "iteration_time(s)": self.iteration_time_s,
            "iteration_time_std(s)": self.iteration_time_std_s,
            "samples_per_sec": self.samples_per_sec,
            "tokens_per_sec": self.tokens_per_sec,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "mfu_peak(TFLOPS)": self.peak_tflops,
            "comm_share": self.comm_share,
            "measured_steps": self.measured_steps,
        }


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs formulas read of a model and a batch: flops_per_iteration's keywords, and
    the MoE terms (moe_flops_args; None: dense)."""

    global_batch: int
    seq_length: int
    num_layers: int
    hidden_size: int
    padded_vocab: int
    checkpoint_activations: bool
    moe: dict | None = None

    def flops(self, checkpoint_activations: bool | None = None) -> float:
        """FLOPs per iteration; `checkpoint_activations=False`: the model's useful FLOPs alone
        (MFU's: recomputation is not useful work)."""
        ckpt = self.checkpoint_activations if checkpoint_activations is None else checkpoint_activations
        return model_flops(global_batch=self.global_batch, seq_length=self.seq_length, num_layers=self.num_layers,
                           hidden_size=self.hidden_size, padded_vocab=self.padded_vocab,
                           checkpoint_activations=ckpt, moe=self.moe)


def summarize_training(
    *,
    step_times_s: list[float],
    warmup_steps: int,
    shape: ModelShape,
    world_size: int,
    peak_tflops: float | None,
    comm_times_s: list[float] | None = None,
) -> TrainingSummary:
    """Summarise every step after warm-up. `comm_times_s[i]` is the wall time step i
    had at least one gradient collective in flight."""
    timed = step_times_s[warmup_steps:]
    if not timed:
        raise ValueError(
            f"no timed steps: {len(step_times_s)} steps with {warmup_steps} warm-up; "
            "raise train.steps above train.warmup_steps"
        )
    it = statistics.fmean(timed)
    std = statistics.stdev(timed) if len(timed) > 1 else 0.0
    sps = shape.global_batch / it
    mfu = None
    if peak_tflops:
        # MFU counts model FLOPs only: recomputation is not useful work, so f = 3.
        mfu = tflops_per_gpu(shape.flops(checkpoint_activations=False), it, world_size) / peak_tflops
    comm_share = None
    if comm_times_s is not None and len(comm_times_s) == len(step_times_s):
        comm_share = sum(comm_times_s[warmup_steps:]) / sum(timed)
    return TrainingSummary(
        iteration_time_s=it,
        iteration_time_std_s=std,
        samples_per_sec=sps,
        tokens_per_sec=sps * shape.seq_length,
        tflops_per_gpu=tflops_per_gpu(shape.flops(), it, world_size),
        mfu=mfu,
        peak_tflops=peak_tflops,
        comm_share=comm_share,
        measured_steps=len(timed),
    )


def alltoall_busbw(nbytes: float, seconds: float, ep_size: int) -> float | None:
    """GB/s on the bus for all-to-all traffic, as nccl-tests defines alltoall: algbw = bytes /
    time, busbw = algbw x (n-1)/n (the 1/n a rank sends itself never crosses the fabric)."""
    if not seconds or ep_size < 1:
        return None
    return nbytes / seconds / 1e9 * (ep_size - 1) / ep_size


def summarize_moe(steps: list[dict], step_times_s: list[float], warmup_steps: int, ep_size: int,
                  rank_mean: dict | None = None) -> dict:
    """The MoE figures of the timed steps. `steps[i]` is MoEStats.take() of step i (this rank's
    dispatch and combine seconds, the payload bytes it sent, the routing skew and dropped share
    of its forwards); `rank_mean` (dispatch_s, combine_s, bytes totals over the timed steps,
    averaged over ranks) replaces this rank's totals when given."""
    timed, times = steps[warmup_steps:], step_times_s[warmup_steps:]
    n, total_t = len(timed), sum(times)
    sums = {k: sum(s[k] for s in timed) for k in ("dispatch_s", "combine_s", "bytes")}
    sums |= rank_mean or {}
    a2a = sums["dispatch_s"] + sums["combine_s"]
    skews = [s["skew_mean"] for s in timed if s.get("skew_mean") is not None]
    dropped = [s["dropped"] for s in timed if s.get("dropped") is not None]
    return {
        "alltoall_share": a2a / total_t if total_t else None,
        "dispatch_share": sums["dispatch_s"] / total_t if total_t else None,
        "combine_share": sums["combine_s"] / total_t if total_t else None,
        "alltoall_time_per_step(s)": a2a / n if n else None,
        "alltoall_bytes_per_step(B)": sums["bytes"] / n if n else None,
        "alltoall_busbw(GB/s)": alltoall_busbw(sums["bytes"], a2a, ep_size),
        "routing_skew": sum(skews) / len(skews) if skews else None,
        "routing_skew_max": max((s["skew"] for s in timed if s.get("skew") is not None), default=None),
        "dropped_fraction": sum(dropped) / len(dropped) if dropped else None,
        "expert_parallel": ep_size,
    }
