"""Run one load point: warm-up (not counted), then the measured requests under an arrival
process, recording for each request how late the client sent it versus its schedule.

The open-loop scheduler sleeps until ~1.5 ms before a send time, then yields in a tight
`sleep(0)` loop: asyncio's timers fire up to ~1 ms late (epoll's millisecond timeout), which
alone would exceed the < 1 ms lag this client promises.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from workloads.core.errors import UsageError
from workloads.inference.loadgen.arrivals import Arrival
from workloads.inference.loadgen.backends import Backend
from workloads.inference.loadgen.client import RequestResult, make_session, stream_request
from workloads.inference.metrics import send_lag_stats

_SPIN_S = 0.0015


@dataclass
class PointResult:
    results: list[RequestResult]
    duration_s: float                  # first scheduled send -> last request done
    event_loop: str = ""               # the loop that ran the point: uvloop | asyncio
    warmup: list[RequestResult] = field(default_factory=list)
    cap_wait_s: list[float] = field(default_factory=list)
    prompt_repeats: int = 0            # measured requests that resent a prompt of this point
    capped: bool = False               # a closed loop run for a time stopped at max_requests

    @property
    def send_lags(self) -> list[float]:
        return [r.send_lag for r in self.results if r.scheduled is not None]

    def lag_stats(self) -> dict[str, Any]:
        return send_lag_stats(self.send_lags)


@dataclass(frozen=True)
class LoadPoint:
    base_url: str
    backend: Backend
    model: str
    specs: Sequence                    # RequestSpec, measured; cycled only when more are sent (warned)
    arrival: Arrival
    num_requests: int | None = None    # exactly this many measured requests ...
    duration_s: float | None = None    # ... or as many as are sent in this time
    warmup_requests: int = 0
    timeout_s: float = 600.0
    seed: int = 0
    extra_body: dict = field(default_factory=dict)
    lag_warn_ms: float = 1.0
    # Warm-up's own prompts (cycled): never the measured ones, which a prefix cache would
    # then answer from cache.
    warmup_specs: Sequence = ()
    event_loop: str = "auto"           # auto (uvloop when importable) | uvloop | asyncio
    # The most requests a closed loop run for a time may send: its count is not known in
    # advance, and every request's samples stay in memory until the record is written.
    max_requests: int | None = None

    def __post_init__(self) -> None:
        loop_factory(self.event_loop)  # a bad load.event_loop fails here, before the point starts


async def _until(target: float) -> None:
    delay = target - time.perf_counter()
    if delay > _SPIN_S:
        await asyncio.sleep(delay - _SPIN_S)
    while time.perf_counter() < target:
        await asyncio.sleep(0)


async def run_load_async(p: LoadPoint, warn: Callable[[str], None] = print) -> PointResult:
    if not p.specs:
        raise ValueError("no requests to send")
    if p.warmup_requests and not p.warmup_specs:
        raise ValueError("warmup_requests needs warmup_specs: warm-up must not send the measured prompts")
    limit = p.arrival.concurrency if not p.arrival.open_loop else p.arrival.max_concurrency
    async with make_session(limit) as session:
        send = lambda spec, r=None: stream_request(session, p.base_url, p.backend, spec, p.model,  # noqa: E731
                                                   p.timeout_s, p.extra_body, r)
        warm = [p.warmup_specs[i % len(p.warmup_specs)] for i in range(p.warmup_requests)]
        warmup = list(await asyncio.gather(*(send(s) for s in warm))) if warm else []
        if p.arrival.open_loop:
            out = await _open_loop(p, send)
        else:
            out = await _closed_loop(p, send)
    out.warmup = warmup
    if out.prompt_repeats:
        warn(f"warning: this point sent {len(out.results)} requests but has {len(p.specs)} distinct prompts: "
             f"{out.prompt_repeats} measured requests repeat a prompt of this point, which a server prefix cache may "
             "answer from cache. Raise the prompts per point (load.num_requests) or shorten load.duration_s.")
    lag = out.lag_stats()
    if lag["p99_send_lag_ms"] is not None and lag["p99_send_lag_ms"] > p.lag_warn_ms:
        warn(f"warning: the client fell behind its schedule: p99 send lag {lag['p99_send_lag_ms']:.2f} ms, "
             f"max {lag['max_send_lag_ms']:.2f} ms (> {p.lag_warn_ms:g} ms); the offered load was lower "
             "than configured. Use a lower rate or run the client on a less busy machine.")
    return out


CLOSED_DURATION_PROMPTS = 1000  # prompts for a closed-loop point that runs for a time (count unknown)


def planned_requests(arrival: Arrival, num_requests: int | None, duration_s: float | None) -> int:
    """How many measured requests a point may send, so it can get that many distinct prompts."""
    if num_requests is not None:
        return int(num_requests)
    if arrival.open_loop and not math.isinf(arrival.rate):
        # Enough arrivals to cover the duration at this rate, with room for randomness.
        return int(max(duration_s * arrival.rate * 1.5 + 100, 100))
    return CLOSED_DURATION_PROMPTS


def _count(p: LoadPoint) -> int:
    if p.num_requests is None and p.arrival.open_loop and math.isinf(p.arrival.rate):
        return len(p.specs)
    return planned_requests(p.arrival, p.num_requests, p.duration_s)


async def _open_loop(p: LoadPoint, send) -> PointResult:
    offsets = p.arrival.offsets(_count(p), p.seed)
    if p.duration_s is not None and p.num_requests is None:
        offsets = offsets[offsets < p.duration_s]
    sem = asyncio.Semaphore(p.arrival.max_concurrency) if p.arrival.max_concurrency else None
    results = [RequestResult() for _ in offsets]
    waits = [0.0] * len(offsets)

    async def one(i: int, target: float) -> None:
        r = results[i]
        r.scheduled = target
        if sem is None:
            await send(p.specs[i % len(p.specs)], r)
        else:
            t = time.perf_counter()
            async with sem:
                waits[i] = time.perf_counter() - t
                await send(p.specs[i % len(p.specs)], r)
        # A capped request waited for a slot on purpose; only the rest is client lateness.
        r.send_lag = r.start - target - waits[i]

    start = time.perf_counter() + 0.005
    tasks = []
    for i, off in enumerate(offsets.tolist()):
        target = start + off
        await _until(target)
        tasks.append(asyncio.create_task(one(i, target)))
    await asyncio.gather(*tasks)
    return PointResult(results, time.perf_counter() - start, cap_wait_s=waits,
                       prompt_repeats=max(0, len(results) - len(p.specs)))


async def _closed_loop(p: LoadPoint, send) -> PointResult:
    n = p.num_requests
    counter = itertools.count()
    results: list[RequestResult] = []
    start = time.perf_counter()
    stop_at = start + p.duration_s if n is None else math.inf

    cap = p.max_requests if n is None and p.max_requests is not None else math.inf
    capped = False

    async def worker() -> None:
        nonlocal capped
        while True:
            i = next(counter)
            if i >= cap:
                capped = True
                return
            if (n is not None and i >= n) or time.perf_counter() >= stop_at:
                return
            r = RequestResult(scheduled=time.perf_counter())
            results.append(r)
            await send(p.specs[i % len(p.specs)], r)
            r.send_lag = r.start - r.scheduled

    await asyncio.gather(*(worker() for _ in range(p.arrival.concurrency)))
    return PointResult(results, time.perf_counter() - start, prompt_repeats=max(0, len(results) - len(p.specs)),
                       capped=capped)


EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(name: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """(the loop's name, its factory). uvloop (libuv) roughly halves the event loop's own
    cost per read and write, which is most of the client's work at high request rates."""
    if name not in EVENT_LOOPS:
        raise UsageError(f"load.event_loop={name!r}; use one of {', '.join(EVENT_LOOPS)}")
    if name != "asyncio":
        try:
            import uvloop
        except ImportError:
            if name == "uvloop":
                raise UsageError("load.event_loop=uvloop but uvloop is not installed; `uv sync`, "
                                 "or use load.event_loop=auto|asyncio") from None
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def run_load(p: LoadPoint, warn: Callable[[str], None] = print) -> PointResult:
    """One load point's requests against the server (session.run_point records it)."""
    # A cyclic-GC pass over a point's worth of response objects can stall the event loop
    # for milliseconds, which would be charged to TTFT/ITL: collect first, hold it during
    # the point (memory use of one point is small), and restore it after.
    name, factory = loop_factory(p.event_loop)
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            res = runner.run(run_load_async(p, warn))
        res.event_loop = name
        return res
    finally:
        if was_enabled:
            gc.enable()


# the name before run_load (one `run_point` now: session's); kept for callers outside the package for a release
run_point = run_load
