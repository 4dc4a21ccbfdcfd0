"""Measured (not estimated) time in gradient communication.

Every collective launched through `torch.distributed` while a `CommTimer` is active is
timed from launch to completion, and a step's communication time is the union of those
intervals: the wall time during which at least one collective was in flight. Overlap
with compute is therefore not double-counted, and a step whose communication is fully
hidden still shows how long the wire was busy.

The collectives are wrapped once per process (`install`), before any engine binds
them: DeepSpeed keeps references to `torch.distributed.all_gather_into_tensor` and
friends from the moment its backend is created, and a Hydra multirun reuses that backend
across sweep points. The wrappers hand each call to whichever timer is active, or pass it
straight through.

On CPU the clock is `perf_counter` (Gloo completes futures on its own threads). On GPU
it is CUDA events on the current stream, read as offsets from an event recorded at step
start, so the figure is device time, not launch time.
"""

from __future__ import annotations

import contextlib
import functools
import time

import torch
import torch.distributed as dist

_COLLECTIVES = (
    "all_reduce",
    "reduce_scatter_tensor",
    "all_gather_into_tensor",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all_single",
    "all_reduce_coalesced",
)
_ACTIVE: CommTimer | None = None
_INSTALLED = False


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


# Collectives whose payload is their second argument (output first).
_INPUT_SECOND = ("reduce_scatter_tensor", "all_gather_into_tensor", "all_to_all_single")


def payload(name: str, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The tensor a collective sends from this rank (the first of a list)."""
    key = "input" if name in _INPUT_SECOND else "tensor"
    t = kwargs.get(key, args[1] if name in _INPUT_SECOND and len(args) > 1 else args[0] if args else None)
    if isinstance(t, (list, tuple)):
        t = t[0] if t else None
    return t if isinstance(t, torch.Tensor) else None


def _wrap(fn):
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        timer = _ACTIVE
        if timer is None:
            return fn(*args, **kwargs)
        sent = payload(fn.__name__, args, kwargs)
        timer._count(sent)
        slot = timer._open(fn.__name__, sent, kwargs.get("group"))
        work = fn(*args, **kwargs)
        if kwargs.get("async_op") and work is not None:
            work.get_future().then(lambda fut: timer._close(slot))
        else:
            timer._close(slot)
        return work

    return timed


def install() -> None:
    """Wrap torch.distributed's collectives for this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None:
            setattr(dist, name, _wrap(fn))
    _INSTALLED = True


class CommTimer:
    def __init__(self, device: torch.device):
        install()
        self.cuda = device.type == "cuda"
        self._intervals: list[list] = []
        self._calls: list[tuple] = []     # (op, dtype, numel, group size) of each slot, in launch order
        self._ref = None
        self.step_bytes: dict[str, int] = {}  # dtype -> bytes this rank's collectives sent this step

    def _count(self, t: torch.Tensor | None) -> None:
        if t is not None:
            key = str(t.dtype).removeprefix("torch.")
            self.step_bytes[key] = self.step_bytes.get(key, 0) + t.numel() * t.element_size()

    def _mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _open(self, name: str = "", sent: torch.Tensor | None = None, group=None) -> list:
        slot = [self._mark(), None]
        self._intervals.append(slot)
        size = dist.get_world_size(group) if dist.is_initialized() else 1
        self._calls.append((name, str(sent.dtype).removeprefix("torch.") if sent is not None else None,
                            sent.numel() if sent is not None else 0, size))
        return slot

    def _close(self, slot: list) -> None:
        slot[1] = self._mark()

    @contextlib.contextmanager
    def active(self):
        global _ACTIVE
        previous, _ACTIVE = _ACTIVE, self
        try:
            yield self
        finally:
            _ACTIVE = previous

    def begin_step(self) -> None:
        self._intervals = []
        self._calls = []
        self.step_bytes = {}
        self._ref = self._mark()

    def end_step(self) -> float:
        """Seconds with a collective in flight during the step; call after synchronising the device."""
        done = [(a, b) for a, b in self._intervals if b is not None]
        if self.cuda:
            done = [(self._ref.elapsed_time(a) / 1e3, self._ref.elapsed_time(b) / 1e3) for a, b in done]
        return union_length(done)

    def step_calls(self) -> list[list]:
        """This step's collectives in launch order, the replay workload's trace (workloads/replay/):
        [op, dtype, elements this rank sent, ranks in its group, start s, end s], times from the
        step's start (None: not completed). Call after end_step."""
        out = []
        for (name, dtype, numel, size), (a, b) in zip(self._calls, self._intervals):
            if self.cuda:
                a, b = self._ref.elapsed_time(a) / 1e3, None if b is None else self._ref.elapsed_time(b) / 1e3
            else:
                a, b = a - self._ref, None if b is None else b - self._ref
            out.append([name, dtype, numel, size, a, b])
        return out

    @staticmethod
    def ddp_hook(process_group, bucket):
        """DDP comm hook equal to the built-in allreduce hook (average the bucket), but
        launched through torch.distributed so the active timer sees it."""
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer().div_(dist.get_world_size(group))
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])


def comm_dtypes(step_bytes: list[dict[str, int]], warmup_steps: int) -> dict:
    """What the gradient collectives moved, per timed step: bytes by dtype (mean over timed
    steps) and the dtype carrying most of them. A bf16 run moves fp32 gradients under DDP
    (autocast keeps fp32 parameters) and bf16 under DeepSpeed (it casts the model), so two
    "bf16" runs can move 2x different bytes: the record says which."""
    timed = step_bytes[warmup_steps:] or step_bytes
    keys = sorted({k for s in timed for k in s})
    mean = {k: sum(s.get(k, 0) for s in timed) / max(1, len(timed)) for k in keys}
    return {"bytes_per_step_by_dtype": mean, "dtype": max(mean, key=mean.get) if mean else None}


def dump_flight_recorder(directory, rank: int) -> str | None:
    """When TORCH_FR_BUFFER_SIZE was set before the process group started, write this rank's
    Flight Recorder dump (PyTorch's JSON, the same from Gloo and NCCL; what launch/replay.py
    reads) to directory/rank<r>.json and return its path; None when the recorder is off. A torch
    whose dump call differs says so in the returned text instead of failing the run."""
    import os
    from pathlib import Path

    if not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        data = _dump_fr_trace_json(includeCollectives=True, onlyActive=False)
    except (ImportError, TypeError, RuntimeError) as e:
        return f"not written: this torch's Flight Recorder dump failed ({e.__class__.__name__}: {str(e)[:120]})"
    path = Path(directory) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else str(data).encode())
    return str(path)
