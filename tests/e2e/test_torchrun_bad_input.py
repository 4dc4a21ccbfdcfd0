"""Bad input under a raw `torchrun` (not self-launch): one `error:` line from one rank,
exit code 2 — not one message per rank. torchrun's own agent then prints its failure
summary (a `ChildFailedError` block); that is torchrun's process, not ours, and the
docs/training.md says so; each rank's error file puts our line last in it, as the root cause's
traceback. Every case here fails in validation, before the process group exists.
"""

import os
import subprocess
import sys

import pytest

from helpers import REPO

CASES = [
    ("launch/train.py", "train.micro_batch_size=1.5", "train.micro_batch_size must be a positive integer, got 1.5"),
    ("launch/train.py", "train.global_batch_size=3", "train.global_batch_size=3 is not divisible"),
    ("launch/collectives.py", "collectives.iters=abc", "collectives.iters must be a positive integer, got 'abc'"),
    ("launch/train.py", "fabric=nosuch", "fabric"),
]


@pytest.mark.slow
@pytest.mark.parametrize("script,override,message", CASES)
def test_one_line_from_one_rank(script, override, message, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script,
                        override, f"output_root={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=180)
    ours = [line for line in (p.stdout + p.stderr).splitlines() if line.startswith("error:")]
    assert len(ours) == 1, p.stdout[-2000:] + p.stderr[-3000:]
    assert message in ours[0], ours
    assert p.returncode != 0
    # torchrun reports the ranks' exit code 2 in its summary; our ranks wrote no traceback.
    assert "exitcode  : 2" in p.stderr or "exit code 2" in p.stderr or "exitcode: 2" in p.stderr, p.stderr[-3000:]
    assert "Traceback (most recent call last)" not in p.stdout
    # the rank's error file (TORCHELASTIC_ERROR_FILE) makes our line the root cause's traceback,
    # the summary's last field before its closing border: no "To enable traceback see" there
    tail = p.stderr.rstrip().splitlines()
    assert set(tail[-1]) == {"="} and tail[-2].strip() == f"traceback : {ours[0]}", "\n".join(tail[-12:])
    assert not list(tmp_path.rglob("records/*.json"))
