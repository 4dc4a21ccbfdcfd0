"""The reference inference engine: continuous batching over a tensor-parallel GPT-NeoX.

Rank 0 (the leader) owns every decision. Each step it
  1. drops aborted requests and frees their KV blocks,
  2. admits queued requests while the batch has room (`max_batch_size`) and the KV pool
     has blocks for the request's whole budget (prompt + max_tokens, reserved up front,
     so nothing is ever preempted),
  3. broadcasts the step plan: for each sequence its new tokens, the position of the
     first, and its block table (newly admitted: the whole prompt; running: the last
     sampled token),
  4. runs the forward with every other rank (2 all_reduces per layer), samples on the
     last-token logits and hands each token to its request's callback.
The other ranks (followers) hold no request state: they receive the plan and run it.
With nothing to do the leader broadcasts an `idle` plan every `heartbeat_s` so that
followers never hit the collective timeout, and a `stop` plan on shutdown.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from workloads.core.errors import UsageError
from workloads.inference.engine.tp import StepInput, TPNeoX, check_tp, weight_source
from workloads.models.neox import PRECISIONS, NeoXConfig


class RequestError(Exception):
    """A request this server cannot serve; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


@dataclass(frozen=True)
class EngineSettings:
    max_batch_size: int = 8
    max_kv_tokens: int = 8192
    kv_block_size: int = 16
    max_queue: int = 1024
    heartbeat_s: float = 1.0
    dtype: str = "fp32"

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_kv_tokens", "kv_block_size", "max_queue"):
            if int(getattr(self, name)) <= 0:
                raise UsageError(f"server.{name} must be a positive integer, got {getattr(self, name)}")
        if self.max_kv_tokens < self.kv_block_size:
            raise UsageError(f"server.max_kv_tokens={self.max_kv_tokens} is below one KV block "
                             f"(server.kv_block_size={self.kv_block_size}); raise it")
        if self.dtype not in PRECISIONS:
            raise UsageError(f"server.dtype={self.dtype!r}; use one of {', '.join(PRECISIONS)}")

    @property
    def num_blocks(self) -> int:
        return self.max_kv_tokens // self.kv_block_size


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0


@dataclass
class Sequence:
    id: int
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[int | None, str | None], None]  # (token, finish_reason); called on the engine thread
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    prefilled: bool = False
    generator: torch.Generator | None = None
    arrival: float = field(default_factory=time.perf_counter)


class BlockAllocator:
    def __init__(self, num_blocks: int):
        self.free = list(range(num_blocks - 1, -1, -1))

    def take(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        return [self.free.pop() for _ in range(n)]

    def give(self, blocks: list[int]) -> None:
        self.free.extend(reversed(blocks))


def build_step_input(entries: list[tuple[list[int], int, list[int]]], block_size: int, device) -> StepInput:
    """entries: (new tokens, position of the first, block table) per sequence."""
    tokens, positions, slots, q_index, q_pos, ctx_slots, last = [], [], [], [], [], [], []
    n = 0
    for toks, start, blocks in entries:
        b = torch.tensor(blocks, dtype=torch.long)
        table = (b[:, None] * block_size + torch.arange(block_size)).reshape(-1)  # slot of each position
        ctx = start + len(toks)
        pos = list(range(start, ctx))
        tokens += toks
        positions += pos
        slots.append(table[start:ctx])
        ctx_slots.append(table[:ctx])
        q_index.append(list(range(n, n + len(toks))))
        q_pos.append(pos)
        n += len(toks)
        last.append(n - 1)
    qmax = max(len(q) for q in q_index)
    cmax = max(len(c) for c in ctx_slots)
    pad = lambda rows, width, v: [r + [v] * (width - len(r)) for r in rows]  # noqa: E731
    lt = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return StepInput(
        tokens=lt(tokens),
        positions=lt(positions),
        slots=torch.cat(slots).to(device),
        q_index=lt(pad(q_index, qmax, n)),  # row n of the padded q is zeros
        q_pos=lt(pad(q_pos, qmax, 0)),
        ctx_slots=torch.stack([torch.nn.functional.pad(c, (0, cmax - len(c))) for c in ctx_slots]).to(device),
        last=lt(last),
    )


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits (V,) float32 -> one token id. temperature 0 is greedy."""
    if params.temperature <= 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop = (torch.cumsum(sorted_p, 0) - sorted_p) >= params.top_p
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=generator))


class Engine:
    """Runs on every rank; only the leader (rank 0) accepts requests."""

    def __init__(self, model: TPNeoX, cfg: NeoXConfig, settings: EngineSettings, rank: int, world: int,
                 device: torch.device, eos_token_id: int | None = None, max_model_len: int | None = None):
        self.model, self.cfg, self.s = model, cfg, settings
        self.rank, self.world, self.device = rank, world, device
        self.eos = eos_token_id
        self.max_model_len = max_model_len or cfg.max_position_embeddings
        model.allocate_cache(settings.num_blocks * settings.kv_block_size)
        self.allocator = BlockAllocator(settings.num_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._aborted: set[int] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.alive = True
        self.failure: str | None = None
        self.steps = 0
        self.on_step: Callable[[dict], None] | None = None  # observer (benchmarks)

    # ---- leader API (thread-safe) -------------------------------------------------
    def kv_bytes_per_rank(self) -> int:
        k = self.model.k_cache[0]
        return 2 * len(self.model.k_cache) * k.numel() * k.element_size()

    def check(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise RequestError for a request that can never be served (before it queues)."""
        if not prompt:
            raise RequestError("the prompt is empty; send at least one token", param="prompt")
        bad = [t for t in prompt if not 0 <= t < self.cfg.padded_vocab]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the model's vocabulary [0, {self.cfg.padded_vocab})",
                               param="prompt")
        total = len(prompt) + params.max_tokens
        if total > self.max_model_len:
            raise RequestError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({len(prompt)} in the messages, {params.max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.", param="max_tokens")
        need = math.ceil(total / self.s.kv_block_size) * self.s.kv_block_size
        if need > self.s.max_kv_tokens:
            raise RequestError(f"the request needs {need} KV-cache tokens (prompt {len(prompt)} + max_tokens "
                               f"{params.max_tokens}) and the whole cache holds server.max_kv_tokens="
                               f"{self.s.max_kv_tokens}; shorten it", param="max_tokens")

    def submit(self, prompt: list[int], params: SamplingParams, emit) -> int:
        self.check(prompt, params)
        if not self.alive:
            raise RequestError(f"the engine has stopped ({self.failure or 'shutting down'})", status=503,
                               kind="server_error")
        gen = None
        if params.temperature > 0:
            gen = torch.Generator()
            if params.seed is not None:
                gen.manual_seed(int(params.seed))
            else:
                gen.seed()
        with self._lock:
            if len(self.waiting) >= self.s.max_queue:
                raise RequestError(f"the queue is full ({self.s.max_queue} waiting requests, server.max_queue); "
                                   "retry later", status=503, kind="server_error")
            seq = Sequence(next(self._ids), list(prompt), params, emit, generator=gen)
            self.waiting.append(seq)
        self._wake.set()
        return seq.id

    def abort(self, seq_id: int) -> None:
        with self._lock:
            self._aborted.add(seq_id)
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # ---- scheduling (leader) --------------------------------------------------------
    def _finish(self, seq: Sequence, reason: str | None, notify: bool = True) -> None:
        self.allocator.give(seq.blocks)
        seq.blocks = []
        if notify:
            seq.emit(None, reason)

    def schedule(self) -> list[Sequence]:
        """The sequences of the next step: every running one plus newly admitted ones."""
        with self._lock:
            aborted, self._aborted = self._aborted, set()
            if aborted:
                for seq in [q for q in self.waiting if q.id in aborted]:
                    self.waiting.remove(seq)
                    seq.emit(None, "abort")
                for seq in [q for q in self.running if q.id in aborted]:
                    self.running.remove(seq)
                    self._finish(seq, "abort")
            while self.waiting and len(self.running) < self.s.max_batch_size:
                seq = self.waiting[0]
                need = math.ceil((len(seq.prompt) + seq.params.max_tokens) / self.s.kv_block_size)
                blocks = self.allocator.take(need)
                if blocks is None:
                    break  # first come, first served: later requests wait behind it
                seq.blocks = blocks
                self.running.append(self.waiting.popleft())
        return list(self.running)

    def plan_entries(self, batch: list[Sequence]) -> list[tuple[list[int], int, list[int]]]:
        out = []
        for seq in batch:
            if not seq.prefilled:
                out.append((seq.prompt, 0, seq.blocks))
            else:
                out.append(([seq.output[-1]], len(seq.prompt) + len(seq.output) - 1, seq.blocks))
        return out

    # ---- execution (every rank) -------------------------------------------------------
    def _broadcast(self, plan: dict | None) -> dict:
        if self.world == 1:
            return plan
        box = [plan]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def execute(self, entries) -> torch.Tensor | None:
        return self.model(build_step_input(entries, self.s.kv_block_size, self.device))

    def _sample_and_emit(self, batch: list[Sequence], logits: torch.Tensor) -> None:
        logits = logits.float().clone()  # a normal tensor: the forward ran under inference_mode
        logits[:, self.cfg.vocab_size:] = float("-inf")  # padded vocabulary rows are not tokens
        for seq, row in zip(batch, logits):
            p = seq.params
            if self.eos is not None and not p.ignore_eos and len(seq.output) < p.min_tokens:
                row[self.eos] = float("-inf")
            tok = sample(row, p, seq.generator)
            seq.prefilled = True
            seq.output.append(tok)
            reason = None
            if self.eos is not None and not p.ignore_eos and tok == self.eos:
                reason = "stop"
            elif len(seq.output) >= p.max_tokens:
                reason = "length"
            seq.emit(tok, reason)
            if reason is not None:
                with self._lock:
                    self.running.remove(seq)
                    self._finish(seq, reason, notify=False)

    def leader_step(self) -> bool:
        """One step on rank 0; False when there was nothing to run."""
        batch = self.schedule()
        if not batch:
            return False
        entries = self.plan_entries(batch)
        self._broadcast({"kind": "step", "entries": entries})
        t0 = time.perf_counter()
        logits = self.execute(entries)
        self._sample_and_emit(batch, logits)
        self.steps += 1
        if self.on_step is not None:
            self.on_step({"seconds": time.perf_counter() - t0, "batch": len(batch),
                          "tokens": sum(len(e[0]) for e in entries)})
        return True

    def run_leader(self) -> None:
        try:
            while not self._stop.is_set():
                if self.leader_step():
                    continue
                self._wake.wait(self.s.heartbeat_s)
                self._wake.clear()
                if not self.waiting and not self._aborted and not self._stop.is_set():
                    self._broadcast({"kind": "idle"})
        except Exception as e:  # a broken step: fail every request, keep the message
            self.failure = f"{type(e).__name__}: {e}"
            raise
        finally:
            self.alive = False
            with self._lock:
                pending = list(self.running) + list(self.waiting)
                self.running.clear()
                self.waiting.clear()
            for seq in pending:
                seq.emit(None, "error")
            try:
                self._broadcast({"kind": "stop"})
            except Exception:
                pass  # followers already gone

    def run_follower(self) -> None:
        while True:
            plan = self._broadcast(None)
            if plan["kind"] == "stop":
                return
            if plan["kind"] == "step":
                self.execute(plan["entries"])


def build_engine(model_cfg: NeoXConfig, settings: EngineSettings, rank: int, world: int, device: torch.device,
                 seed: int, checkpoint: str | None = None, eos_token_id: int | None = None) -> Engine:
    check_tp(model_cfg, world)
    if settings.dtype == "fp16" and device.type != "cuda":
        raise UsageError("server.dtype=fp16 needs a GPU; on CPU use fp32 or bf16")
    model = TPNeoX.load(weight_source(model_cfg, seed, checkpoint), model_cfg, world, rank, device,
                        PRECISIONS[settings.dtype])
    return Engine(model, model_cfg, settings, rank, world, device, eos_token_id)
