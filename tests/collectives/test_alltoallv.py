"""alltoallv: the skewed size matrices (worked by hand), and the real op over a spawned 3-rank
Gloo group against a reference built here from the senders' buffers with torch.split."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workloads.collectives import ops
from workloads.collectives.harness import count_wrong
from workloads.core.dist import end_group_and_exit
from workloads.core.ports import free_port


def test_size_matrices_worked_values():
    # 100 elements per peer, 4 ranks: every rank sends 400 in all.
    assert ops.size_matrix("uniform", 100, 4)[0] == [100, 100, 100, 100]
    # Zipf: weights 1, 1/2, 1/3, 1/4 (sum 25/12) over the seeded ranking 0, 3, 2, 1:
    # 400 * 12/25 = 192, * 6/25 = 96, * 4/25 = 64, * 3/25 = 48
    assert ops.size_matrix("zipf", 100, 4)[0] == [192, 48, 64, 96]
    # one hot rank: 1/2 + 1/8 of 400 = 250, the others 1/8 = 50
    assert ops.size_matrix("hot", 100, 4)[0] == [250, 50, 50, 50]
    # rounding: 20 elements over weights 1, 1/2 -> 13.33, 6.67 -> 13 + 7 (remainder to the larger fraction)
    assert ops.size_matrix("zipf", 10, 2) == [[13, 7], [13, 7]]
    for skew in ops.ALLTOALLV_SKEWS:
        assert all(sum(row) == 7 * 5 for row in ops.size_matrix(skew, 7, 5))


def test_layout_size_is_the_busiest_rank_and_busbw_is_alltoalls():
    lay = ops.get("alltoallv_hot").layout(1600, 4, 4)  # 100 floats per peer
    assert (lay.count, lay.send_numel, lay.recv_numel) == (100, 400, 1000)  # the hot rank receives 4 x 250
    assert lay.size == 4000
    assert ops.get("alltoallv").name == "alltoallv_zipf"
    # 4000 B in 2 us: algbw 2 GB/s, busbw x 3/4 = 1.5 GB/s; uniform equals alltoall exactly
    assert ops.get("alltoallv_hot").bandwidth(4000, 2e-6, 4) == pytest.approx((2.0, 1.5))
    assert ops.get("alltoallv_uniform").layout(1000, 4, 3) == ops.get("alltoall").layout(1000, 4, 3)


def test_expected_slices_join_to_the_whole():
    op, lay = ops.get("alltoallv_zipf"), ops.get("alltoallv_zipf").layout(4 * 3 * 10, 4, 3)
    comm = ops.Comm(None, 1, 3, (0, 1, 2))
    whole = op.expected(lay, comm, 0, "sum", torch.float32, "cpu")
    parts = [op.expected_slice(lay, comm, 0, "sum", torch.float32, "cpu", a, min(a + 7, whole.numel()))
             for a in range(0, whole.numel(), 7)]
    assert torch.equal(torch.cat(parts), whole)


WORLD, PER_PEER = 3, 11


def _rank(rank: int, port: int, out: str) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    comm = ops.Comm(None, rank, WORLD, tuple(range(WORLD)))
    got = {}
    for skew in ops.ALLTOALLV_SKEWS:
        op = ops.get(f"alltoallv_{skew}")
        lay = op.layout(PER_PEER * WORLD * 4, 4, WORLD)
        b = op.buffers(lay, comm, 0, torch.float32, "cpu", ops.OUT_OF_PLACE)
        b.send.copy_(torch.arange(b.send.numel(), dtype=torch.float32) + 1000 * rank)  # who sent what, where
        op.run(b, comm, "sum", 0)
        got[skew] = b.recv.clone()
    torch.save(got, f"{out}.{rank}")
    end_group_and_exit()  # not interpreter teardown (workloads/core/dist.py says why)


@pytest.fixture(scope="module")
def received(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("a2av") / "recv")
    mp.spawn(_rank, args=(free_port(), out), nprocs=WORLD, join=True)
    return [torch.load(f"{out}.{r}") for r in range(WORLD)]


@pytest.mark.parametrize("skew", ops.ALLTOALLV_SKEWS)
def test_alltoallv_agrees_with_a_reference(received, skew):
    m = ops.size_matrix(skew, PER_PEER, WORLD)
    sent = [torch.arange(PER_PEER * WORLD, dtype=torch.float32) + 1000 * j for j in range(WORLD)]
    for r in range(WORLD):
        want = torch.cat([torch.split(sent[j], m[j])[r] for j in range(WORLD)])  # block r of every sender
        assert count_wrong(received[r][skew], want) == 0 and received[r][skew].numel() == want.numel()
    if skew != "uniform":
        sizes = [received[r][skew].numel() for r in range(WORLD)]
        assert len(set(sizes)) > 1  # skewed: some rank receives more than another
