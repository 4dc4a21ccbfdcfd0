"""workloads/core/dist.py: the warm-up collectives that make NCCL open its channels before
the log is read, and which GPU a rank binds under per-task GPU binding (torch.cuda is the
boundary here: no GPU)."""

from __future__ import annotations

import pytest
import torch


def test_warmup_collectives_run_before_the_log_is_read(monkeypatch, tmp_path):
    """The reference engine reads its own log after a real all_reduce: warmup_collectives
    issues a tiny and a multi-MB one (a real one-rank Gloo group here)."""
    import torch.distributed as dist

    from workloads.core import dist as fdist

    sizes = []
    real = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1])
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        fdist.warmup_collectives(torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    assert sizes == [1, 1 << 20]


def test_device_index_under_per_task_binding():
    from workloads.core.dist import device_index

    assert [device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]  # one visible GPU per task
    assert [device_index(r, 8) for r in (0, 5, 7)] == [0, 5, 7]
    assert device_index(3, 2) == 1 and device_index(2, 0) == 0


@pytest.mark.parametrize("visible, index", [(1, 0), (8, 3)])
def test_init_once_binds_the_visible_gpu_of_a_per_task_binding(monkeypatch, visible, index):
    """init_once itself for local rank 3 of 4, with torch.cuda and init_process_group as the
    boundary (no GPU here): under srun --gpus-per-task=1 the one visible GPU is cuda:0."""
    import torch
    import torch.distributed as dist

    from workloads.core import dist as fdist

    for k, v in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    bound, init = [], {}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: bound.append(i))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: init.update(kw))
    monkeypatch.setattr(fdist, "_INFO", None)
    monkeypatch.setattr(fdist, "_FABRIC", None)
    monkeypatch.setattr(fdist.atexit, "register", lambda fn: None)
    info = fdist.init_once("nccl", "ib", 60)
    assert bound == [index] and info.device == torch.device("cuda", index) == init["device_id"]
    assert (init["rank"], init["world_size"], info.local_rank) == (3, 4, 3)


def test_a_node_that_never_joins_is_said_to_be_awaited_within_seconds(tmp_path):
    """Node 0's rank whose peers never start (a Slurm step on one node of two, ranks started by
    hand): within seconds one line says for whom it waits, where, and for how long, then the
    timeout (already one error line). It printed nothing until the timeout."""
    import subprocess
    import sys
    import time

    from helpers import REPO, child_env
    from workloads.core.ports import free_port

    code = ("import sys\nfrom workloads.core.dist import init_once\n"
            "print('joining', file=sys.stderr, flush=True)\ninit_once('gloo', 'loopback', 600)\n")
    env = child_env(RANK="0", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()))
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr.readline() == "joining\n"
        start = time.monotonic()
        line = p.stderr.readline()
        waited = time.monotonic() - start
    finally:
        p.kill()
        p.wait()
    assert line == (f"rank 0: waiting for the other 2 rank(s) (1 other node(s)) to join at 127.0.0.1:{env['MASTER_PORT']}; "
                    "giving up after 600 s (dist.timeout_s). Start the same command on every node\n"), line
    assert waited < 30, waited  # within seconds (5 s, on a loaded machine more), not at the timeout
