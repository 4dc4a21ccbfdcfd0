"""The collectives correctness check: each rank's expected slice equals the whole reference,
and the check never holds n full-size tensors."""

from __future__ import annotations

import pytest
import torch

from workloads.collectives import ops


def _naive(op, lay, comm, root, redop, dtype):
    """The pre-fix reference: every rank's full input, then one reduction/concatenation."""
    n, c = comm.size, lay.count
    full = [ops.values(lay.send_numel, r, dtype, "cpu") for r in range(n)]
    if op.name == "all_reduce":
        return ops.reduce_reference([f[:c] for f in full], redop, dtype)
    if op.name == "reduce_scatter":
        return ops.reduce_reference([f[comm.rank * c:(comm.rank + 1) * c] for f in full], redop, dtype)
    if op.name == "all_gather":
        return torch.cat([f[:c] for f in full])
    if op.name == "alltoall":
        return torch.cat([f[comm.rank * c:(comm.rank + 1) * c] for f in full])
    return None


@pytest.mark.parametrize("name", ["all_reduce", "reduce_scatter", "all_gather", "alltoall"])
@pytest.mark.parametrize("redop", ["sum", "prod", "max", "avg"])
def test_sliced_expected_equals_the_whole_reference(name, redop):
    op = ops.get(name)
    dtype = torch.float32 if redop == "avg" else torch.int32
    for n in (3, 4):
        lay = op.layout(4 * 1000, 4, n)
        comm = ops.Comm(None, 1, n, tuple(range(n)))
        want = _naive(op, lay, comm, 0, redop, dtype)
        numel = op.checked_numel(lay)
        pieces = [op.expected_slice(lay, comm, 0, redop, dtype, "cpu", lo, min(numel, lo + 77))
                  for lo in range(0, numel, 77)]
        assert torch.equal(torch.cat(pieces), want), (name, redop, n)


def test_check_never_materialises_full_size_tensors(monkeypatch):
    """Count the elements of every input pattern the check builds: with CHECK_CHUNK = 1000 and
    a 16 000-element buffer over 8 ranks, no temporary is larger than one slice."""
    from helpers.collectives import settings as _settings
    from workloads.collectives import harness

    asked = []
    real = ops.values
    monkeypatch.setattr(ops, "values", lambda numel, *a, **k: (asked.append(numel), real(numel, *a, **k))[1])
    monkeypatch.setattr(harness, "CHECK_CHUNK", 1000)
    s = _settings("collectives.minbytes=64K", "collectives.maxbytes=64K", "collectives.datatype=int32")
    n = 8
    for name in ("all_reduce", "reduce_scatter", "all_gather", "alltoall"):
        op = ops.get(name)
        comm = ops.Comm(None, 0, n, tuple(range(n)))
        h = harness.Harness(s.sweep, s.timing, s.checks, comm, torch.device("cpu"), "gloo", 0)
        lay = op.layout(64 * 1024, 4, n)
        b = op.buffers(lay, comm, 0, torch.int32, "cpu", op.placements[0])
        b.checked.copy_(_naive(op, lay, comm, 0, "sum", torch.int32))  # what a correct collective leaves
        asked.clear()
        assert h.count_wrong_in(op, lay, b) == 0
        assert asked and max(asked) <= 1000, (name, max(asked))
        b.checked.view(-1)[-1] += 1
        assert h.count_wrong_in(op, lay, b) == 1
