"""One small object per collective, as nccl-tests has one small file per collective.

Each op knows four things and nothing else: how a requested byte count becomes buffer
sizes (`layout`), how to fill inputs and what the outputs must be (`inputs`,
`expected`), the call itself (`run`), and its bus-bandwidth factor. The harness
(workloads/collectives/harness.py) owns warm-up, timing, checking and printing.

Bandwidth, exactly as nccl-tests' doc/PERFORMANCE.md and docs/metrics.md define it
(GB/s = 1e9 B/s):
    algbw = S / t      S = the row's `size` column: the total buffer for all_gather,
                       reduce_scatter and alltoall (per-rank count x n x type size), the
                       per-rank buffer otherwise
    busbw = algbw x factor(n)

Size rounding follows nccl-tests' getCollByteCount: the requested bytes become
count = bytes // type_size elements; all_gather and reduce_scatter use a per-rank count
of (count // n) rounded down to a multiple of 16 bytes' worth of elements (current
nccl-tests aligns their chunks that way); alltoall uses count // n per peer. The
printed size is max(send, recv) bytes, so it can be smaller than requested.

Torch exposes all_reduce, broadcast and reduce only in place (one tensor), and
all_to_all_single / send-recv only out of place; the other placement is reported as
N/A rather than measured with an extra copy that nccl-tests does not make.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from workloads.core.errors import UsageError

OUT_OF_PLACE, IN_PLACE = "out_of_place", "in_place"

# nccl-tests' type names (the table's `type` column) -> torch dtype.
DTYPES: dict[str, torch.dtype] = {
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
    "half": torch.float16,
    "float": torch.float32,
    "double": torch.float64,
    "bfloat16": torch.bfloat16,
}
DTYPE_ALIASES = {"float16": "half", "fp16": "half", "float32": "float", "fp32": "float", "float64": "double",
                 "bf16": "bfloat16", "char": "int8", "int": "int32"}

REDOPS: dict[str, Callable[[], dist.ReduceOp]] = {
    "sum": lambda: dist.ReduceOp.SUM,
    "prod": lambda: dist.ReduceOp.PRODUCT,
    "max": lambda: dist.ReduceOp.MAX,
    "min": lambda: dist.ReduceOp.MIN,
    "avg": lambda: dist.ReduceOp.AVG,
}


def dtype_name(name: str) -> str:
    key = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise UsageError(f"collectives.datatype={name!r} is unknown; use one of {', '.join(DTYPES)}")
    return key


@dataclass(frozen=True)
class Layout:
    """Element counts for one row. `count` is the table's count column (nccl-tests'
    paramcount: the count argument the collective is called with)."""

    count: int
    send_numel: int
    recv_numel: int
    type_size: int

    @property
    def size(self) -> int:
        """The table's size column in bytes: max(send, recv) buffer."""
        return max(self.send_numel, self.recv_numel) * self.type_size


@dataclass
class Buffers:
    send: torch.Tensor  # (send_numel,) what run() reads
    recv: torch.Tensor  # (recv_numel,) what run() writes; may alias send in place
    checked: torch.Tensor | None  # the view the check compares (None: this rank is not checked)


@dataclass
class SplitBuffers(Buffers):
    """Buffers of an uneven all-to-all, with this rank's splits (elements per peer), worked
    out once, outside the timed calls."""

    out_splits: list[int] | None = None
    in_splits: list[int] | None = None


@dataclass(frozen=True)
class Comm:
    """Where one rank runs a collective: its group and its place in it."""

    group: dist.ProcessGroup | None
    rank: int  # rank within the group
    size: int
    global_ranks: tuple[int, ...]  # group rank -> world rank


def values(numel: int, rank: int, dtype: torch.dtype, device, offset: int = 0) -> torch.Tensor:
    """Rank `rank`'s input pattern: small integers 1..3, exact in every dtype, so sums and
    products of a few ranks are exact or round the same way in any order."""
    i = torch.arange(offset, offset + numel, device=device, dtype=torch.int64)
    return ((i + rank) % 3 + 1).to(dtype)


def reduce_reference(parts: list[torch.Tensor], redop: str, dtype: torch.dtype) -> torch.Tensor:
    """What a reduction of `parts` must give, computed in 64 bits then cast (integer
    overflow wraps the same way the device does)."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    acc = parts[0].to(wide)
    for p in parts[1:]:
        _combine(acc, p.to(wide), redop)
    return _finish(acc, len(parts), redop, dtype)


def reduce_ranks(numel: int, n: int, offset: int, redop: str, dtype: torch.dtype, device) -> torch.Tensor:
    """reduce_reference over ranks 0..n-1 of elements [offset, offset + numel), accumulated one
    rank at a time: memory is one accumulator and one input slice, whatever n is."""
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    acc = values(numel, 0, wide, device, offset)
    for r in range(1, n):
        _combine(acc, values(numel, r, wide, device, offset), redop)
    return _finish(acc, n, redop, dtype)


def _combine(acc: torch.Tensor, p: torch.Tensor, redop: str) -> None:
    if redop in ("sum", "avg"):
        acc += p
    elif redop == "prod":
        acc *= p
    elif redop == "max":
        torch.maximum(acc, p, out=acc)
    else:
        torch.minimum(acc, p, out=acc)


def _finish(acc: torch.Tensor, n: int, redop: str, dtype: torch.dtype) -> torch.Tensor:
    if redop == "avg":
        acc = acc / n
    return acc.to(dtype)


def blockwise(lo: int, hi: int, block: int, part: Callable[[int, int, int], torch.Tensor], dtype, device) -> torch.Tensor:
    """Elements [lo, hi) of a concatenation of equal blocks; `part(b, a, z)` gives elements
    [a, z) of block b."""
    out = torch.empty(hi - lo, dtype=dtype, device=device)
    i = lo
    while i < hi:
        b, a = divmod(i, block)
        z = min(block, a + hi - i)
        out[i - lo:i - lo + z - a] = part(b, a, z)
        i += z - a
    return out


class Collective:
    """Base: subclasses set the class attributes and override layout/inputs/expected/run."""

    name = ""
    uses_redop = False
    uses_root = False
    placements: tuple[str, ...] = (OUT_OF_PLACE, IN_PLACE)

    def bus_factor(self, n: int) -> float:
        return 1.0

    def bandwidth(self, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
        """(algbw, busbw) in GB/s for a row whose size column is `nbytes`."""
        algbw = nbytes / seconds / 1e9
        return algbw, algbw * self.bus_factor(world)

    def layout(self, nbytes: int, type_size: int, n: int) -> Layout:
        count = nbytes // type_size
        return Layout(count, count, count, type_size)

    # ---- data: inputs on this rank, and what this rank must hold afterwards ----
    def inputs(self, lay: Layout, comm: Comm, root: int, dtype, device) -> torch.Tensor:
        return values(lay.send_numel, comm.rank, dtype, device)

    def expected(self, lay: Layout, comm: Comm, root: int, redop: str, dtype, device) -> torch.Tensor | None:
        """The whole checked buffer (small sizes and tests; the harness checks in slices)."""
        return self.expected_slice(lay, comm, root, redop, dtype, device, 0, self.checked_numel(lay))

    def checked_numel(self, lay: Layout) -> int:
        return lay.recv_numel

    def expected_slice(self, lay: Layout, comm: Comm, root: int, redop: str, dtype, device,
                       lo: int, hi: int) -> torch.Tensor | None:
        """Elements [lo, hi) of what this rank must hold (None: not checked here). Built from
        at most two slice-sized temporaries, so a check of a 4 GiB buffer over 64 ranks
        never holds 64 buffers at once."""
        raise NotImplementedError

    def buffers(self, lay: Layout, comm: Comm, root: int, dtype, device, placement: str) -> Buffers:
        """Default: one tensor, the collective works in place on it (torch's all_reduce,
        broadcast, reduce)."""
        buf = self.inputs(lay, comm, root, dtype, device).clone()
        return Buffers(send=buf, recv=buf, checked=buf)

    def run(self, b: Buffers, comm: Comm, redop: str, root: int) -> None:
        raise NotImplementedError


class AllReduce(Collective):
    name = "all_reduce"
    uses_redop = True
    placements = (IN_PLACE,)

    def bus_factor(self, n: int) -> float:
        return 2 * (n - 1) / n

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        return reduce_ranks(hi - lo, comm.size, lo, redop, dtype, device)

    def run(self, b, comm, redop, root):
        dist.all_reduce(b.recv, op=REDOPS[redop](), group=comm.group)


class AllGather(Collective):
    name = "all_gather"

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, nbytes, type_size, n):
        align = max(1, 16 // type_size)
        base = (nbytes // type_size // n) // align * align
        return Layout(base, base, base * n, type_size)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        # Block r of the output is rank r's input.
        return blockwise(lo, hi, lay.count, lambda r, a, b: values(b - a, r, dtype, device, offset=a), dtype, device)

    def buffers(self, lay, comm, root, dtype, device, placement):
        mine = self.inputs(lay, comm, root, dtype, device)
        recv = torch.zeros(lay.recv_numel, dtype=dtype, device=device)
        if placement == IN_PLACE:
            # NCCL's in-place all_gather: the input is this rank's slot of the output.
            send = recv[comm.rank * lay.count:(comm.rank + 1) * lay.count]
            send.copy_(mine)
        else:
            send = mine
        return Buffers(send=send, recv=recv, checked=recv)

    def run(self, b, comm, redop, root):
        dist.all_gather_into_tensor(b.recv, b.send, group=comm.group)


class ReduceScatter(Collective):
    name = "reduce_scatter"
    uses_redop = True

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, nbytes, type_size, n):
        align = max(1, 16 // type_size)
        base = (nbytes // type_size // n) // align * align
        return Layout(base, base * n, base, type_size)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        return reduce_ranks(hi - lo, comm.size, comm.rank * lay.count + lo, redop, dtype, device)

    def buffers(self, lay, comm, root, dtype, device, placement):
        send = self.inputs(lay, comm, root, dtype, device)
        if placement == IN_PLACE:
            # NCCL's in-place reduce_scatter: the output is this rank's slot of the input.
            recv = send[comm.rank * lay.count:(comm.rank + 1) * lay.count]
        else:
            recv = torch.zeros(lay.recv_numel, dtype=dtype, device=device)
        return Buffers(send=send, recv=recv, checked=recv)

    def run(self, b, comm, redop, root):
        dist.reduce_scatter_tensor(b.recv, b.send, op=REDOPS[redop](), group=comm.group)


class Broadcast(Collective):
    name = "broadcast"
    uses_root = True
    placements = (IN_PLACE,)

    def inputs(self, lay, comm, root, dtype, device):
        if comm.rank == root:
            return values(lay.count, root, dtype, device)
        return torch.zeros(lay.count, dtype=dtype, device=device)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        return values(hi - lo, root, dtype, device, offset=lo)

    def run(self, b, comm, redop, root):
        dist.broadcast(b.recv, src=comm.global_ranks[root], group=comm.group)


class Reduce(Collective):
    name = "reduce"
    uses_redop = True
    uses_root = True
    placements = (IN_PLACE,)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        if comm.rank != root:
            return None  # only the root's result is defined
        return reduce_ranks(hi - lo, comm.size, lo, redop, dtype, device)

    def buffers(self, lay, comm, root, dtype, device, placement):
        b = super().buffers(lay, comm, root, dtype, device, placement)
        b.checked = b.recv if comm.rank == root else None
        return b

    def run(self, b, comm, redop, root):
        dist.reduce(b.recv, dst=comm.global_ranks[root], op=REDOPS[redop](), group=comm.group)


class AllToAll(Collective):
    name = "alltoall"
    placements = (OUT_OF_PLACE,)

    def bus_factor(self, n: int) -> float:
        return (n - 1) / n

    def layout(self, nbytes, type_size, n):
        per_peer = nbytes // type_size // n
        return Layout(per_peer, per_peer * n, per_peer * n, type_size)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        # Block j of my output is block <my rank> of rank j's input.
        base = comm.rank * lay.count
        return blockwise(lo, hi, lay.count, lambda j, a, b: values(b - a, j, dtype, device, offset=base + a),
                         dtype, device)

    def buffers(self, lay, comm, root, dtype, device, placement):
        recv = torch.zeros(lay.recv_numel, dtype=dtype, device=device)
        return Buffers(send=self.inputs(lay, comm, root, dtype, device), recv=recv, checked=recv)

    def run(self, b, comm, redop, root):
        dist.all_to_all_single(b.recv, b.send, group=comm.group)


# The skews of alltoallv's size matrix, as an MoE router's token counts look (the rank a
# token goes to is the rank holding its expert).
ALLTOALLV_SKEWS = ("uniform", "zipf", "hot")
ALLTOALLV_SEED = 25  # which ranks are popular: fixed, so every run and every rank draws the same matrix


def size_matrix(skew: str, per_peer: int, n: int, seed: int = ALLTOALLV_SEED) -> list[list[int]]:
    """M[i][j] = elements rank i sends rank j. Every row sums to per_peer·n (each rank sends
    what alltoall of the same size sends); the destinations' shares are
      uniform  1/n each (alltoall itself),
      zipf     ∝ 1/rank^1 over a seeded ranking of the destinations (expert popularity),
      hot      one seeded destination gets 1/2 + 1/(2n), the others 1/(2n) (one hot expert),
    rounded down, the remainder going one element at a time to the largest fractions."""
    if skew not in ALLTOALLV_SKEWS:
        raise UsageError(f"alltoallv skew {skew!r}; use one of {', '.join(ALLTOALLV_SKEWS)}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()  # order[0]: most popular
    if skew == "uniform":
        w = [1.0] * n
    elif skew == "zipf":
        w = [0.0] * n
        for place, dst in enumerate(order):
            w[dst] = 1.0 / (place + 1)
    else:
        w = [1.0 / (2 * n)] * n
        w[order[0]] += 0.5
    total = per_peer * n
    exact = [total * x / sum(w) for x in w]
    row = [int(x) for x in exact]
    for j in sorted(range(n), key=lambda j: (row[j] - exact[j], j))[: total - sum(row)]:
        row[j] += 1
    return [list(row) for _ in range(n)]


def variable_blocks(lo: int, hi: int, sizes: list[int], part: Callable[[int, int, int], torch.Tensor], dtype,
                    device) -> torch.Tensor:
    """Elements [lo, hi) of a concatenation of blocks of `sizes`; `part(b, a, z)` gives
    elements [a, z) of block b."""
    out = torch.empty(hi - lo, dtype=dtype, device=device)
    start = 0
    for b, size in enumerate(sizes):
        a, z = max(lo, start), min(hi, start + size)
        if a < z:
            out[a - lo:z - lo] = part(b, a - start, z - start)
        start += size
    return out


class AllToAllV(AllToAll):
    """all_to_all_single with uneven splits from `size_matrix` (the MoE dispatch's pattern).
    The size column is the busiest rank's max(sent, received) bytes, which bounds the time;
    busbw = algbw x (n-1)/n as nccl-tests' alltoall (for uniform the two ops agree exactly)."""

    def __init__(self, skew: str):
        self.skew = skew
        self.name = f"alltoallv_{skew}"

    def layout(self, nbytes, type_size, n):
        per_peer = nbytes // type_size // n
        m = size_matrix(self.skew, per_peer, n)
        recv = max(sum(m[i][j] for i in range(n)) for j in range(n))
        return Layout(per_peer, per_peer * n, recv, type_size)

    def matrix(self, lay: Layout, n: int) -> list[list[int]]:
        return size_matrix(self.skew, lay.count, n)

    def expected(self, lay, comm, root, redop, dtype, device):
        mine = sum(row[comm.rank] for row in self.matrix(lay, comm.size))
        return self.expected_slice(lay, comm, root, redop, dtype, device, 0, mine)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        # Block j of my output is what rank j sends me: its input from where its blocks for
        # ranks before me end.
        m, me = self.matrix(lay, comm.size), comm.rank
        return variable_blocks(lo, hi, [row[me] for row in m],
                               lambda j, a, b: values(b - a, j, dtype, device, offset=sum(m[j][:me]) + a),
                               dtype, device)

    def buffers(self, lay, comm, root, dtype, device, placement):
        m = self.matrix(lay, comm.size)
        out_splits = [row[comm.rank] for row in m]
        recv = torch.zeros(sum(out_splits), dtype=dtype, device=device)
        return SplitBuffers(send=self.inputs(lay, comm, root, dtype, device), recv=recv, checked=recv,
                            out_splits=out_splits, in_splits=m[comm.rank])

    def run(self, b, comm, redop, root):
        dist.all_to_all_single(b.recv, b.send, b.out_splits, b.in_splits, group=comm.group)


class SendRecv(Collective):
    """Each rank sends to the next and receives from the previous (a ring shift)."""

    name = "sendrecv"
    placements = (OUT_OF_PLACE,)

    def expected_slice(self, lay, comm, root, redop, dtype, device, lo, hi):
        return values(hi - lo, (comm.rank - 1) % comm.size, dtype, device, offset=lo)

    def buffers(self, lay, comm, root, dtype, device, placement):
        recv = torch.zeros(lay.recv_numel, dtype=dtype, device=device)
        return Buffers(send=self.inputs(lay, comm, root, dtype, device), recv=recv, checked=recv)

    def run(self, b, comm, redop, root):
        nxt = comm.global_ranks[(comm.rank + 1) % comm.size]
        prv = comm.global_ranks[(comm.rank - 1) % comm.size]
        if nxt == comm.global_ranks[comm.rank]:  # one rank: a send to oneself is a copy
            b.recv.copy_(b.send)
            return
        ops = [dist.P2POp(dist.isend, b.send, nxt, group=comm.group),
               dist.P2POp(dist.irecv, b.recv, prv, group=comm.group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()


REGISTRY: dict[str, Collective] = {
    op.name: op for op in (AllReduce(), AllGather(), ReduceScatter(), Broadcast(), Reduce(), AllToAll(), SendRecv(),
                           *(AllToAllV(skew) for skew in ALLTOALLV_SKEWS))
}
ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
           "all_to_all": "alltoall", "send_recv": "sendrecv", "alltoallv": "alltoallv_zipf"}


def get(name: str) -> Collective:
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in REGISTRY:
        raise UsageError(f"collectives.ops names unknown op {name!r}; use any of {', '.join(REGISTRY)}")
    return REGISTRY[key]
