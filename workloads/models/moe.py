"""Mixture-of-experts MLP with expert parallelism, on plain `torch.distributed`.

    probs   = softmax(router(x))                      (N, E)   N tokens on this rank
    top-k   = the k most probable experts per token; gates renormalised over them (k > 1)
    keep    = the first C assignments of each expert, C = ceil(cf · k · N / E); first
              choices queue before second choices (GShard), the rest are dropped
    dispatch: all_to_all_single of the kept tokens to the ranks holding their experts,
              with the real per-rank counts (uneven splits: skew reaches the wire)
    experts : each rank runs its E / EP experts on the tokens it received
    combine : the reverse all_to_all_single; out[token] = sum of gate · expert output

The load-balancing loss is Switch/GShard's E · sum_e f_e · P_e, with f_e the share of all
k·N assignments routed to expert e and P_e the mean router probability of e (Megatron-Core's
`switch_load_balancing_loss`). f is counted over the whole data-parallel group (one
all_reduce of E counts per layer, Megatron-Core's global-batch balancing), so its value on
any layout equals the single-rank value for the same global batch; the gradient flows
through P only.

Why not DeepSpeed's `deepspeed.moe.layer.MoE`: it runs on Gloo/CPU here (2 ranks, EP=2,
k=2, once its shared-memory op is switched off), but its dispatch (`_AllToAll` in
deepspeed/moe/sharded_moe.py) sends an (E, capacity, h) buffer padded to the capacity with
equal splits, so the bytes on the wire are the same whatever the routing: skew never reaches
the fabric, which is what this workload measures. And under `parallel=ddp` DDP would average
different experts' weights together; DeepSpeed handles expert groups only in its own engine.

Expert weights are drawn per expert from a generator seeded from the global RNG, so a
1-rank model and an EP-rank model built after the same `torch.manual_seed` hold the same
experts (the single-rank vs EP test relies on it).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.core.errors import UsageError

ACTIVATIONS = ("gelu", "swiglu")  # gelu: GPT-NeoX's MLP; swiglu: Mixtral's (3 matrices)


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    expert_ffn_size: int | None = None  # None -> the model's ffn size (4·h)
    activation: str = "gelu"

    def __post_init__(self) -> None:
        if int(self.num_experts) < 1:
            raise UsageError(f"model.moe.num_experts must be positive, got {self.num_experts}")
        if not 1 <= int(self.top_k) <= int(self.num_experts):
            raise UsageError(f"model.moe.top_k={self.top_k} must be between 1 and model.moe.num_experts="
                             f"{self.num_experts}: a token cannot go to more experts than there are")
        if not float(self.capacity_factor) > 0:
            raise UsageError(f"model.moe.capacity_factor={self.capacity_factor} must be > 0 (1.0 = room for an "
                             "even share of the tokens per expert; 1.25 is Switch's default)")
        if float(self.aux_loss_coef) < 0:
            raise UsageError(f"model.moe.aux_loss_coef must be >= 0, got {self.aux_loss_coef}")
        if self.expert_ffn_size is not None and int(self.expert_ffn_size) <= 0:
            raise UsageError(f"model.moe.expert_ffn_size must be positive or null, got {self.expert_ffn_size}")
        if self.activation not in ACTIVATIONS:
            raise UsageError(f"model.moe.activation={self.activation!r}; use one of {', '.join(ACTIVATIONS)}")

    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"

    @classmethod
    def from_dict(cls, d) -> MoEConfig:
        if isinstance(d, MoEConfig):
            return d
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise UsageError(f"model.moe has unknown keys {', '.join(unknown)}; "
                             f"use {', '.join(cls.__dataclass_fields__)}")
        return cls(**dict(d))


def capacity(tokens: int, moe: MoEConfig) -> int:
    """Slots per expert for `tokens` tokens on one rank: ceil(cf · k · N / E), at least 1."""
    return max(1, math.ceil(moe.capacity_factor * moe.top_k * tokens / moe.num_experts))


@dataclass(frozen=True)
class ExpertLayout:
    """The expert-parallel layout, checked before any rank starts: EP × TP × DP = world, where
    EP ranks split the experts, DP ranks hold replicas of one EP shard (expert data parallel)
    and TP is the tensor-parallel degree (1: training has no tensor parallelism here)."""

    ep: int
    tp: int
    dp: int

    @classmethod
    def resolve(cls, num_experts: int, ep, tp, dp, world: int) -> ExpertLayout:
        ep, tp = int(ep or 1), int(tp or 1)
        if ep < 1 or tp < 1 or (dp is not None and int(dp) < 1):
            raise UsageError(f"parallel.expert_parallel={ep}, parallel.tensor_parallel={tp} and "
                             f"parallel.data_parallel={dp} must be positive")
        if tp != 1:
            raise UsageError(f"parallel.tensor_parallel={tp}: training has no tensor parallelism (the inference "
                             "engine does); use parallel.tensor_parallel=1")
        if dp is None:
            if world % (ep * tp):
                raise UsageError(f"parallel.expert_parallel={ep} x tensor_parallel={tp} does not divide the world "
                                 f"size {world}; EP x TP x DP must equal the world")
            dp = world // (ep * tp)
        if ep * tp * int(dp) != world:
            raise UsageError(f"parallel.expert_parallel={ep} x tensor_parallel={tp} x data_parallel={dp} = "
                             f"{ep * tp * int(dp)}, not the world size {world}; EP x TP x DP must equal the world")
        if num_experts % ep:
            raise UsageError(f"model.moe.num_experts={num_experts} does not divide over parallel.expert_parallel="
                             f"{ep} ranks; choose an expert-parallel degree that divides the expert count")
        return cls(ep, tp, int(dp))


@dataclass
class ExpertGroups:
    """Live process groups of one rank: `ep` the ranks that exchange tokens (contiguous blocks
    of EP ranks), `replicas` the ranks holding the same experts (strided), `dense` the whole
    data-parallel group (None in a single process: no communication)."""

    ep_size: int = 1
    ep_rank: int = 0
    world: int = 1
    ep: object = None
    replicas: object = None
    dense: object = None

    @classmethod
    def build(cls, ep_size: int) -> ExpertGroups:
        if not dist.is_initialized():
            return cls()
        world, rank = dist.get_world_size(), dist.get_rank()
        ep_groups = [dist.new_group(list(range(b, b + ep_size))) for b in range(0, world, ep_size)]
        replica_groups = [dist.new_group(list(range(i, world, ep_size))) for i in range(ep_size)]
        return cls(ep_size=ep_size, ep_rank=rank % ep_size, world=world, ep=ep_groups[rank // ep_size],
                   replicas=replica_groups[rank % ep_size], dense=dist.group.WORLD)


@dataclass
class MoEStats:
    """One step's all-to-all time per phase (seconds), the payload bytes this rank sent, and
    the routing figures of every MoE forward (every layer, every micro-batch)."""

    cuda: bool = False
    seconds: dict = field(default_factory=lambda: {"dispatch": 0.0, "combine": 0.0})
    bytes_sent: int = 0
    dtype: str | None = None  # what the all-to-alls moved (the autocast dtype under autocast)
    skews: list = field(default_factory=list)      # max / mean tokens per expert, global, per forward
    dropped: list = field(default_factory=list)    # fraction of this rank's assignments over capacity
    _events: list = field(default_factory=list)

    @contextlib.contextmanager
    def timed(self, phase: str, nbytes: int):
        self.bytes_sent += nbytes
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((phase, start, end))
            return
        t0 = time.perf_counter()
        yield  # Gloo's all_to_all_single blocks until this rank's part is done
        self.seconds[phase] += time.perf_counter() - t0

    def take(self) -> dict:
        """This step's figures, and a fresh start; call after synchronising the device."""
        for phase, start, end in self._events:
            self.seconds[phase] += start.elapsed_time(end) / 1e3
        out = {"dispatch_s": self.seconds["dispatch"], "combine_s": self.seconds["combine"],
               "bytes": self.bytes_sent, "dtype": self.dtype, "skew": max(self.skews) if self.skews else None,
               "skew_mean": sum(self.skews) / len(self.skews) if self.skews else None,
               "dropped": sum(self.dropped) / len(self.dropped) if self.dropped else None}
        self.seconds = {"dispatch": 0.0, "combine": 0.0}
        self.bytes_sent, self.skews, self.dropped, self._events = 0, [], [], []
        return out


def _a2a(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group, stats: MoEStats | None,
         phase: str) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    if stats:
        stats.dtype = str(x.dtype).removeprefix("torch.")
    with stats.timed(phase, x.numel() * x.element_size()) if stats else contextlib.nullcontext():
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _AllToAllV(torch.autograd.Function):
    """all_to_all_single with uneven splits; its gradient is the reverse exchange (timed under
    the same phase: the dispatch's backward is part of what dispatching costs)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, stats, phase):
        ctx.args = (out_splits, in_splits, group, stats, phase)
        return _a2a(x, out_splits, in_splits, group, stats, phase)

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits, group, stats, phase = ctx.args
        return _a2a(g, in_splits, out_splits, group, stats, phase), None, None, None, None, None


def wire_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the token all-to-alls move: autocast's (bf16) when it is on for x's device,
    else x's own. Under autocast the dispatched tokens come from a LayerNorm, which autocast
    runs in fp32 (aten autocast_mode.h AT_FORALL_FP32 lists layer_norm), and a gelu expert's
    output is a bf16 matmul plus an fp32 bias, promoted back to fp32: without the cast a "bf16"
    MoE moves 4 bytes an element, twice what Megatron's or DeepSpeed's bf16 all-to-all moves."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def route(probs: torch.Tensor, moe: MoEConfig, cap: int):
    """Top-k routing with a per-expert capacity, pure and deterministic.

    probs (N, E) -> (expert, token, gate) of the kept assignments, sorted by expert (stable:
    within an expert, first choices before second, tokens in order), and the counts (E,) of
    all k·N assignments before the capacity cut."""
    N, E = probs.shape
    top_p, top_e = probs.topk(moe.top_k, dim=-1)  # (N, k)
    gates = top_p / top_p.sum(-1, keepdim=True) if moe.top_k > 1 else top_p
    flat_e = top_e.t().reshape(-1)  # (k·N,), choice-major: every first choice queues before any second
    flat_tok = torch.arange(N, device=probs.device).repeat(moe.top_k)
    flat_gate = gates.t().reshape(-1)
    counts = torch.bincount(flat_e, minlength=E)
    position = F.one_hot(flat_e, E).cumsum(0).gather(1, flat_e[:, None]).squeeze(1) - 1  # place in its queue
    keep = position < cap
    e, tok, gate = flat_e[keep], flat_tok[keep], flat_gate[keep]
    order = torch.argsort(e, stable=True)
    return e[order], tok[order], gate[order], counts


def balance_loss(probs: torch.Tensor, global_counts: torch.Tensor, global_tokens: int, top_k: int) -> torch.Tensor:
    """E · sum_e f_e · P_e (Switch, eq. 4; Megatron-Core switch_load_balancing_loss):
    f_e = global assignments to e / (k · global tokens), P_e = this rank's mean probability."""
    E = probs.shape[1]
    f = global_counts.to(probs.dtype) / (top_k * global_tokens)
    return E * torch.sum(f * probs.mean(0))


def skew(counts: torch.Tensor) -> float:
    """Routing skew: max / mean tokens per expert (1.0 = perfectly balanced)."""
    mean = counts.double().mean()
    return float(counts.max() / mean) if mean > 0 else 1.0


class MoEMLP(nn.Module):
    """The MoE block in place of GPT-NeoX's MLP: (B, T, h) -> (B, T, h); `aux_loss` holds the
    scaled balancing loss of the last forward."""

    def __init__(self, hidden_size: int, ffn_size: int, moe: MoEConfig, groups: ExpertGroups | None = None):
        super().__init__()
        self.moe, self.groups = moe, groups or ExpertGroups()
        E, g = moe.num_experts, self.groups
        self.local = E // g.ep_size
        self.first = g.ep_rank * self.local  # global index of this rank's first expert
        F_ = moe.expert_ffn_size or ffn_size
        self.router = nn.Linear(hidden_size, E, bias=False)
        # Per expert: in (h -> F, or h -> 2F gate|up for SwiGLU) and out (F -> h). GPT-NeoX's
        # MLP has biases; Mixtral's SwiGLU experts have none.
        width = 2 * F_ if moe.gated else F_
        self.w_in = nn.Parameter(torch.empty(self.local, hidden_size, width))
        self.w_out = nn.Parameter(torch.empty(self.local, F_, hidden_size))
        self.b_in = None if moe.gated else nn.Parameter(torch.zeros(self.local, width))
        self.b_out = None if moe.gated else nn.Parameter(torch.zeros(self.local, hidden_size))
        std = math.sqrt(2.0 / (5.0 * hidden_size))  # GPT-NeoX's small_init, as every other Linear
        seed = int(torch.randint(0, 2**62, ()))  # from the global RNG: the same on every rank and layout
        with torch.no_grad():
            for i in range(self.local):
                gen = torch.Generator().manual_seed(seed + self.first + i)
                self.w_in[i].copy_(torch.randn(hidden_size, width, generator=gen) * std)
                self.w_out[i].copy_(torch.randn(F_, hidden_size, generator=gen) * std)
        for p in self.expert_parameters():
            p.expert = True  # engines: not all-reduced over the world (reduce_expert_grads)
        self.stats: MoEStats | None = None
        self.aux_loss = torch.zeros(())

    def expert_parameters(self) -> list[nn.Parameter]:
        return [p for p in (self.w_in, self.w_out, self.b_in, self.b_out) if p is not None]

    def _expert(self, i: int, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w_in[i]
        if self.moe.gated:
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h + self.b_in[i])
        y = h @ self.w_out[i]
        return y if self.b_out is None else y + self.b_out[i]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, h = x.shape
        g, moe, E = self.groups, self.moe, self.moe.num_experts
        tokens = x.reshape(-1, h)  # (N, h)
        N = tokens.shape[0]
        logits = self.router(tokens)
        probs = torch.softmax(logits, dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))  # (N, E)
        e, tok, gate, counts = route(probs, moe, capacity(N, moe))
        global_counts, global_tokens = counts, N
        if g.dense is not None and g.world > 1:
            global_counts = counts.clone()
            dist.all_reduce(global_counts, group=g.dense)
            global_tokens = N * g.world  # every rank routes the same number of tokens
        self.aux_loss = moe.aux_loss_coef * balance_loss(probs, global_counts, global_tokens, moe.top_k)
        if self.stats is not None:
            self.stats.skews.append(skew(global_counts))
            self.stats.dropped.append(1.0 - e.numel() / (moe.top_k * N))
        wire = wire_dtype(tokens)
        send = tokens[tok].to(wire)  # (S, h), grouped by expert
        per_expert = torch.bincount(e, minlength=E)  # (E,) kept assignments this rank sends
        if g.ep_size > 1:
            # Who receives what: recv_counts[src, j] = tokens rank src sends to my local expert j.
            recv_counts = torch.empty_like(per_expert)
            dist.all_to_all_single(recv_counts, per_expert, group=g.ep)
            recv_counts = recv_counts.view(g.ep_size, self.local)
            in_splits = per_expert.view(g.ep_size, self.local).sum(1).tolist()
            out_splits = recv_counts.sum(1).tolist()
            recv = _AllToAllV.apply(send, out_splits, in_splits, g.ep, self.stats, "dispatch")
            # Received rows come by (source, expert); run each expert on its rows.
            expert_of = torch.arange(self.local, device=x.device).repeat(g.ep_size)
            expert_of = torch.repeat_interleave(expert_of, recv_counts.flatten())
            perm = torch.argsort(expert_of, stable=True)
            y_sorted = self._run_experts(recv[perm], recv_counts.sum(0).tolist())
            y_recv = torch.empty_like(y_sorted).index_copy(0, perm, y_sorted).to(wire)
            y = _AllToAllV.apply(y_recv, in_splits, out_splits, g.ep, self.stats, "combine")
        else:
            y = self._run_experts(send, per_expert.tolist())
        # y's dtype, not the input's: under autocast the experts' matmuls give bf16 while the
        # LayerNorm before them gives fp32
        out = y.new_zeros(tokens.shape).index_add(0, tok, y * gate.to(y.dtype)[:, None])
        return out.view(B, T, h)

    def _run_experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        parts = [self._expert(i, chunk) for i, chunk in enumerate(x.split(counts))]
        return torch.cat(parts) if parts else x


def moe_layers(model: nn.Module) -> list[MoEMLP]:
    return [m for m in model.modules() if isinstance(m, MoEMLP)]


def attach_stats(model: nn.Module, stats: MoEStats) -> None:
    for m in moe_layers(model):
        m.stats = stats


def aux_loss(model: nn.Module) -> torch.Tensor | float:
    """The sum of every MoE layer's balancing loss from the last forward (0 for a dense model)."""
    return sum((m.aux_loss for m in moe_layers(model)), 0.0)


def expert_parameter_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if getattr(p, "expert", False)]


def reduce_expert_grads(model: nn.Module, groups: ExpertGroups) -> None:
    """Expert gradients after backward: each holds the sum over the EP group's tokens of
    d(local loss); the global-batch gradient is the sum over the replicas divided by the
    world (DDP averages the dense gradients the same way)."""
    for p in model.parameters():
        if getattr(p, "expert", False) and p.grad is not None:
            if groups.replicas is not None and groups.world // groups.ep_size > 1:
                dist.all_reduce(p.grad, group=groups.replicas)
            p.grad.div_(groups.world)


def clip_grad_norm(model: nn.Module, max_norm: float, groups: ExpertGroups) -> torch.Tensor:
    """torch's clip_grad_norm_ over the global model: the dense gradients are the same on
    every rank; each expert's lives on one rank of the EP group, so their squares are summed
    over it. Every rank then scales by the same factor."""
    dense = [p.grad for p in model.parameters() if p.grad is not None and not getattr(p, "expert", False)]
    expert = [p.grad for p in model.parameters() if p.grad is not None and getattr(p, "expert", False)]
    device = next(model.parameters()).device
    total, e_sq = _square_sum(dense, device), _square_sum(expert, device)
    if groups.ep is not None and groups.ep_size > 1:
        dist.all_reduce(e_sq, group=groups.ep)
    norm = (total + e_sq).sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in dense + expert:
        grad.mul_(scale.to(grad.dtype))
    return norm


def _square_sum(grads: list[torch.Tensor], device) -> torch.Tensor:
    if not grads:
        return torch.zeros((), dtype=torch.float64, device=device)
    return torch.stack([g.detach().double().pow(2).sum() for g in grads]).sum()
