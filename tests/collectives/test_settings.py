"""The collectives: section becomes one frozen plan (settings.py) in one place; what a user
is told about a bad value is pinned word for word, and so is which of several bad values is
named first (the checks run in one order)."""

import pytest

from helpers.collectives import settings as _settings
from workloads.core.errors import UsageError

OPS = ("all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, alltoallv_uniform, "
       "alltoallv_zipf, alltoallv_hot")

BAD = [
    (['collectives.ops=[all_sum]'], {}, "collectives.ops names unknown op 'all_sum'; use any of " + OPS),
    (['collectives.maxbytes=big'], {}, "collectives.maxbytes='big' is not a size; write bytes or a number with K, M or G (e.g. 32M)"),
    (['collectives.minbytes=1M', 'collectives.maxbytes=1K'], {}, 'collectives.minbytes (1048576) > collectives.maxbytes (1024): sizes are out of order; give minbytes <= maxbytes'),
    (['collectives.minbytes=0'], {}, 'collectives.minbytes must be positive, got 0'),
    (['collectives.stepbytes=1K'], {}, "set only one of collectives.stepbytes and collectives.stepfactor (as nccl-tests' -i / -f)"),
    (['collectives.stepfactor=0'], {}, 'collectives.stepfactor must be >= 1, got 0'),
    (['collectives.stepfactor=null', 'collectives.stepbytes=0'], {}, 'collectives.stepbytes must be positive, got 0'),
    (['collectives.datatype=float8'], {}, "collectives.datatype='float8' is unknown; use one of int8, uint8, int32, int64, half, float, double, bfloat16"),
    (['collectives.op=mean'], {}, "collectives.op='mean' is unknown; use one of sum, prod, max, min, avg"),
    (['collectives.op=avg', 'collectives.datatype=int32'], {}, 'collectives.op=avg needs a floating-point datatype, not int32'),
    (['collectives.iters=0'], {}, 'collectives.iters must be positive, got 0'),
    (['collectives.warmup_iters=-1'], {}, 'collectives.warmup_iters must be >= 0, got -1'),
    (['collectives.average=median'], {}, "collectives.average='median'; use one of rank0, mean, min, max"),
    (['collectives.pattern=ring'], {}, "collectives.pattern='ring'; use one of all, one_per_node, pairs"),
    (['collectives.out_of_place=false', 'collectives.in_place=false'], {}, 'collectives.out_of_place and collectives.in_place are both false: nothing to measure'),
    (['collectives.ops=[]'], {}, 'collectives.ops is empty and collectives.p2p is empty: nothing to run'),
    (['collectives.p2p=[jitter]'], {}, "collectives.p2p names 'jitter'; use any of latency, bw, bibw"),
    (['collectives.p2p=[latency]', 'collectives.p2p_ranks=[1,1]'], {}, 'collectives.p2p_ranks=[1, 1] must be two different ranks in [0, 2)'),
    (['collectives.p2p_minbytes=2K', 'collectives.p2p_maxbytes=1K'], {}, 'collectives.minbytes (2048) > collectives.maxbytes (1024): sizes are out of order; give minbytes <= maxbytes'),
    (['collectives.external=maybe'], {}, "collectives.external='maybe'; use auto, on or off"),
    (["collectives.external_prefix=[mpirun,'{gpus}']"], {}, "collectives.external_prefix=['mpirun', '{gpus}'] has a placeholder other than {world}, {nodes}, {ranks_per_node} ('gpus'); use only those"),
    (['collectives.sample_iters=-1'], {}, 'collectives.sample_iters must be >= 0, got -1'),
    (['collectives.sample_maxbytes=small'], {}, "collectives.sample_maxbytes='small' is not a size; write bytes or a number with K, M or G (e.g. 32M)"),
    ([], {'FABRICBENCH_TEST_CORRUPT': '5:all_reduce'}, "FABRICBENCH_TEST_CORRUPT='5:all_reduce'; write <rank>:<op> with a rank in [0, 2), e.g. 1:all_gather"),
    ([], {'FABRICBENCH_TEST_CORRUPT': '1:gossip'}, "collectives.ops names unknown op 'gossip'; use any of " + OPS),
    ([], {'FABRICBENCH_TEST_SLOW_RANK': '1:x'}, "FABRICBENCH_TEST_SLOW_RANK='1:x'; write <rank>:<milliseconds> with a rank in [0, 2), e.g. 1:5"),
    # two bad values: the first check in the plan's order names its own
    (["collectives.iters=0", "collectives.average=median"], {}, "collectives.iters must be positive, got 0"),
    (["collectives.pattern=ring", "collectives.p2p=[jitter]"], {}, "collectives.pattern='ring'; use one of all, one_per_node, pairs"),
]


@pytest.mark.parametrize("overrides, env, message", BAD)
def test_bad_values_are_told_word_for_word(overrides, env, message):
    with pytest.raises(UsageError) as e:
        _settings(*overrides, env=env)
    assert str(e.value) == message


def test_p2p_on_one_rank_is_refused():
    with pytest.raises(UsageError) as e:
        _settings("collectives.p2p=[latency]", world=1)
    assert str(e.value) == "collectives.p2p needs at least 2 ranks; launch 2 or more"


def test_sampling_can_stop_at_a_size():
    assert _settings().timing.sample_maxbytes is None                                  # every size, as before
    assert _settings("collectives.sample_maxbytes=16K").timing.sample_maxbytes == 16384
