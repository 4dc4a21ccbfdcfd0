"""Distributed init, once per process.

A Hydra multirun under torchrun calls the task function once per sweep point in the
same process; the process group must outlive them all, so it is created on first use
and destroyed at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from workloads.core import signals
from workloads.core.errors import Fault, UsageError
from workloads.core.ports import free_port


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: torch.device

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_INFO: DistInfo | None = None
_FABRIC: str | None = None


def launch_env(environ: dict | None = None) -> tuple[int, int, int, int]:
    """(rank, world, local_rank, local_world) from torchrun's or Slurm's variables;
    a single process when neither launched us."""
    e = os.environ if environ is None else environ
    if "RANK" in e and "WORLD_SIZE" in e:
        world = int(e["WORLD_SIZE"])
        return int(e["RANK"]), world, int(e.get("LOCAL_RANK", 0)), int(e.get("LOCAL_WORLD_SIZE", world))
    if "SLURM_PROCID" in e and "SLURM_NTASKS" in e:
        world = int(e["SLURM_NTASKS"])
        local_world = int(e.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] or 1)
        return int(e["SLURM_PROCID"]), world, int(e.get("SLURM_LOCALID", 0)), local_world
    return 0, 1, 0, 1


def device_index(local_rank: int, visible: int) -> int:
    """The CUDA device of a local rank. Under per-task GPU binding (srun --gpus-per-task=1,
    submitit) each process sees one GPU, numbered 0, whatever its local rank."""
    return local_rank % max(1, visible)


JOIN_NOTICE_S = 5.0  # a node that has not joined by then is said to be awaited, once


def _join_notice(rank: int, world: int, local_world: int, timeout_s: float) -> threading.Timer:
    """One line from each node's first rank when the other nodes have not joined within
    JOIN_NOTICE_S: for whom it waits, where, and for how long. A node started alone (torchrun
    --nnodes=2 on node 0 only) printed nothing until the timeout, minutes later."""
    others = world - local_world
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    text = (f"rank {rank}: waiting for the other {others} rank(s) ({world // max(1, local_world) - 1} other node(s)) to "
            f"join at {where}; giving up after {timeout_s:g} s (dist.timeout_s). Start the same command on every node")
    t = threading.Timer(JOIN_NOTICE_S, lambda: print(text, file=sys.stderr, flush=True))
    t.daemon = True
    t.start()
    return t


def init_once(backend: str, fabric_name: str, timeout_s: float) -> DistInfo:
    global _INFO, _FABRIC
    if _INFO is not None:
        if fabric_name != _FABRIC:
            raise UsageError(
                f"fabric changed from '{_FABRIC}' to '{fabric_name}' inside one process; its "
                "environment is fixed when the process group starts. Sweep fabrics as separate "
                "jobs (one torchrun per fabric, or hydra/launcher=slurm)."
            )
        return _INFO
    rank, world, local_rank, local_world = launch_env()
    if world == 1:
        # Nothing launched us: a private one-rank group on a free local port.
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if backend == "nccl":
        index = device_index(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = device  # eager NCCL communicator init: errors surface here
    notice = _join_notice(rank, world, local_world, timeout_s) if local_rank == 0 and world > local_world else None
    try:
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    except (RuntimeError, ValueError) as e:
        addr = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise Fault(
            f"distributed init failed (backend {backend}, rank {rank}/{world}, master {addr}, "
            f"timeout {timeout_s:g}s): {str(e).splitlines()[0]}. Check that every rank started "
            "and that MASTER_ADDR is reachable on the fabric's interface."
        ) from None
    finally:
        if notice is not None:
            notice.cancel()
    atexit.register(shutdown)
    _INFO = DistInfo(rank, world, local_rank, local_world, backend, device)
    _FABRIC = fabric_name
    return _INFO


def drain(timeout_s: float = 60.0) -> None:
    """Before a group that did its work on every rank is destroyed (end_group_and_exit): one
    barrier, waited on with the GIL released, so that no rank leaves while a peer still needs it.

    A Gloo (or NCCL) worker thread frees a finished collective's tensors after the caller
    has been woken; freeing a tensor that Python made needs the GIL. If the main thread
    reaches interpreter teardown first, that thread dies inside a destructor and the whole
    rank aborts (SIGABRT, "terminate called without an active exception") after its record
    was written. The barrier waits for every earlier collective of the group and gives those
    threads the GIL meanwhile. A peer that never arrives costs `timeout_s`, not a hang.

    The barrier's own work object holds the collectives that were still in flight when it was
    queued, and the worker drops its reference just after waking us: were ours dropped first,
    the worker would free them, the same race one step later (seen in a core dump:
    ~AsyncBarrierWork -> ~AsyncBroadcastWork -> take_gil during Py_FinalizeEx). So it is kept
    until exit and released by the main thread (atexit, below)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    try:
        work = dist.barrier(async_op=True)
        _DRAINED.append(work)
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError:
        pass  # the peer's own exit code and message tell that story


_DRAINED: list = []
atexit.register(_DRAINED.clear)  # registered first, so it runs after shutdown(): in the main thread


def end_group_and_exit(code: int | str | None = 0) -> NoReturn:
    """End a process that made its own group (tests' spawned ranks, benchmarks, parity runs)
    rather than init_once's: drain, destroy, then exit_process. Ending such a process by
    interpreter teardown instead (returning from an mp.spawn target, or from a script's main)
    lost a rank to SIGABRT now and then after its work was done: drain() makes that race rare,
    only exit_process rules it out (its docstring says why). From an mp.spawn target this is the
    child's normal, successful end: torch's spawn sees the exit code."""
    drain()
    if dist.is_initialized():
        dist.destroy_process_group()
    exit_process(code)


def shutdown() -> None:
    global _INFO
    if dist.is_initialized():
        dist.destroy_process_group()
    _INFO = None


def made_group() -> bool:
    """Whether this process started a process group (init_once), so its end must be exit_process's."""
    return _INFO is not None


def exit_process(code: int | str | None) -> None:
    """End a rank's process as sys.exit(code) would, but without interpreter teardown.

    Gloo's (and NCCL's) worker threads free finished collectives' tensors after the caller
    has been woken, and freeing a tensor that Python made takes the GIL. Once teardown has
    begun, a thread taking the GIL is ended by pthread_exit, which unwinds through a noexcept
    C++ destructor: std::terminate, SIGABRT, "terminate called without an active exception",
    after the record was written (core dumps showed it in ~AsyncBroadcastWork and
    ~AsyncBarrierWork). Draining the group first made it rarer, not impossible (a fresh CI run
    still lost a rank to it). So teardown is skipped: the exit functions run (ours destroys
    the group; logging's and wandb's flush), non-daemon threads are joined, the Python and C
    streams are flushed, and the process ends with os._exit, as multiprocessing's forked
    children do. A worker thread still holding something then simply ends with the process."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        status = 1
    signals.ending(status)  # torchrun's SIGTERM to the ranks left may land in the steps below
    # The two steps Py_FinalizeEx takes before it marks the interpreter finalizing, in its order:
    threading._shutdown()    # threading's exit hooks (e.g. idle executors told to stop), then joins
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio, e.g. NCCL's own log lines, buffered when piped
    os._exit(status & 0xFF)


def wait_for_writer(info: DistInfo) -> None:
    """Every rank of a failure the ranks agreed on waits here until rank 0 has written its record.
    A rank that exited first made torchrun's agent stop rank 0 mid-write, and the launcher's
    recovered record then said "rank 1 exited with code 1" instead of the failure (the corrupted-
    element test, once under load). A peer already gone ends the wait: nothing to wait for."""
    if info.world_size > 1 and dist.is_initialized():
        with contextlib.suppress(Exception):
            dist.barrier()


def agree(value, info: DistInfo):
    """Rank 0's value, and the set of ranks whose own value differed."""
    if info.world_size == 1:
        return value, []
    values = [None] * info.world_size
    dist.all_gather_object(values, value)
    return values[0], [r for r, v in enumerate(values) if v != values[0]]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warmup_collectives(device: torch.device, group=None, big_bytes: int = 4 << 20) -> None:
    """One tiny and one few-MB all_reduce, so NCCL has connected the channels that real traffic
    uses (small messages may take the tree/LL path, large ones the ring) before its log is read."""
    for numel in (1, big_bytes // 4):
        t = torch.ones(numel, dtype=torch.float32, device=device)
        dist.all_reduce(t, group=group)
    synchronize(device)


_HOST_GROUP = None


def host_barrier(timeout_s: float) -> None:
    """A barrier that waits on the CPU (a Gloo group made once, by every rank at the same
    point), so no rank sits in a GPU-spinning NCCL kernel while another uses the GPUs."""
    global _HOST_GROUP
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    synchronize(torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
                else torch.device("cpu"))
    if _HOST_GROUP is None:
        _HOST_GROUP = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    dist.barrier(group=_HOST_GROUP)
