"""NCCL variables checked as the NCCL that runs reads them. Every expectation below is read from
NVIDIA/nccl at the tag it names: parseList and ncclTopoTuneModel in src/graph/tuning.cc
(v2.30.7-1: the grammar :55-136, per-function algorithms :294-303, the disable loop :499-510;
v2.23.4-1's one-list parseList :34-53), ncclLoadParam's strtoll in src/misc/param.cc, and the
NCCL_PARAM / ncclGetEnv sites tools/nccl_env_table.py turned into nccl_versions.tsv."""

from __future__ import annotations

import pytest

from workloads.core.errors import UsageError
from workloads.fabric import ncclvalues as nv

V30, V23, V21 = (2, 30, 7), (2, 23, 4), (2, 21, 5)
DDP = nv.Context(functions=frozenset({"Broadcast", "AllReduce"}), nodes=2)
ZERO = nv.Context(functions=frozenset({"AllGather", "ReduceScatter", "Broadcast", "AllReduce"}), nodes=2)


def test_parse_list_follows_nccl_2_24_grammar():
    # tuning.cc's own examples (v2.30.7-1 :45-53)
    on = nv.parse_list("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", nv.algos(V30), V30, "A")
    assert on["AllReduce"] == {"Tree", "CollNetDirect"} and on["Broadcast"] == {"Ring"}
    assert on["AllGather"] == {"Ring", "CollNetDirect"}
    on = nv.parse_list("LL,Simple;allreduce:^LL", nv.PROTOS, V30, "P")
    assert on["AllReduce"] == {"LL128", "Simple"} and on["Reduce"] == {"LL", "Simple"}
    on = nv.parse_list("^LL128;allreduce:LL128", nv.PROTOS, V30, "P")
    assert on["Broadcast"] == {"LL", "Simple"} and on["AllReduce"] == {"LL128"}
    assert nv.parse_list("TREE", nv.algos(V30), V30, "A")["Reduce"] == {"Tree"}   # strcasecmp, no prefix: all five


@pytest.mark.parametrize("value,needle", [
    ("Ring;Tree", "All entries except the first must have a prefix"),
    ("allredce:tree", "Unrecognized prefix token"),
    ("nvls_tree", "the tuner file's spelling; NCCL_ALGO's is NVLSTree"),
    ("allreduce:tree:ring", "has two ':'"),
])
def test_what_nccl_2_30_fails_at_init_is_refused(value, needle):
    got = nv.problems({"NCCL_ALGO": value}, DDP, V30)
    assert len(got) == 1 and needle in got[0], got


def test_the_docs_old_example_tree_breaks_ddps_broadcast_and_the_prefixed_form_passes():
    got = nv.problems({"NCCL_ALGO": "Tree"}, DDP, V30)
    assert got and "leaves Broadcast no algorithm (NCCL runs Broadcast only as Ring)" in got[0]
    assert "write AllReduce:Tree" in got[0]
    assert nv.problems({"NCCL_ALGO": "AllReduce:Tree"}, DDP, V30) == []
    assert nv.problems({"NCCL_ALGO": "allreduce:tree;broadcast:ring"}, DDP, V30) == []
    # ZeRO's gathers have no Tree either; Ring,Tree leaves them Ring
    assert "AllGather" in nv.problems({"NCCL_ALGO": "AllReduce:Ring;AllGather:Tree"}, ZERO, V30)[0]
    assert nv.problems({"NCCL_ALGO": "Ring,Tree"}, ZERO, V30) == []
    # an all_reduce-only sweep may pin Tree everywhere
    assert nv.problems({"NCCL_ALGO": "Tree"}, nv.Context(functions=frozenset({"AllReduce"})), V30) == []


def test_what_each_algorithm_needs():
    ar = frozenset({"AllReduce"})
    two = nv.Context(functions=ar, nodes=2)
    assert "NVLS across nodes needs CollNet" in nv.problems({"NCCL_ALGO": "NVLS"}, two, V30)[0]
    assert nv.problems({"NCCL_ALGO": "NVLS", "NCCL_COLLNET_ENABLE": "1"}, two, V30) == []
    assert nv.problems({"NCCL_ALGO": "NVLS"}, nv.Context(functions=ar, nodes=1), V30) == []
    assert "needs CollNet" in nv.problems({"NCCL_ALGO": "CollNetDirect"}, two, V30)[0]
    assert "NVLSTree needs more than one node" in nv.problems({"NCCL_ALGO": "NVLSTree"},
                                                              nv.Context(functions=ar, nodes=1), V30)[0]
    assert "only as Tree, Ring" in nv.problems({"NCCL_ALGO": "PAT"}, nv.Context(functions=ar), V30)[0]
    ag8 = nv.Context(functions=frozenset({"AllGather"}), ranks_per_node=8)
    assert "PAT runs only with one GPU per node" in nv.problems({"NCCL_ALGO": "PAT"}, ag8, V30)[0]
    # NVLS runs Simple only: with LL alone nothing is left
    got = nv.problems({"NCCL_ALGO": "NVLS", "NCCL_PROTO": "LL", "NCCL_COLLNET_ENABLE": "1"}, two, V30)
    assert got and "NVLS runs only the Simple protocol" in got[0]
    assert "enables no protocol" in nv.problems({"NCCL_PROTO": "^LL,LL128,Simple"}, DDP, V30)[0]


def test_before_2_24_one_list_and_unknown_names_skipped():
    assert "function prefixes (allreduce:tree) came in NCCL 2.24" in nv.problems({"NCCL_ALGO": "allreduce:tree"},
                                                                                DDP, V21)[0]
    assert "skips the unknown name 'PAT'" in nv.problems({"NCCL_ALGO": "PAT"}, DDP, (2, 22, 3))[0]
    ag = nv.Context(functions=frozenset({"AllGather"}))
    assert nv.problems({"NCCL_ALGO": "PAT"}, ag, V23) == []     # PAT came in 2.23
    assert "only as Ring" in nv.problems({"NCCL_ALGO": "NVLS"}, ag, (2, 18, 6))[0]   # Ring-only gathers then


def test_the_version_table_says_who_reads_what():
    t = nv.table()
    assert t.versions[0] == (2, 3, 7) and t.versions[-1] == (2, 30, 7)
    # the review's list: gone since 2.5, renamed in 2.4 (NCCL_NET_GDR_LEVEL), never read
    for name in ("NCCL_LL_THRESHOLD", "NCCL_TREE_THRESHOLD", "NCCL_RINGS"):
        assert nv.name_problem(name, V30).startswith("NCCL 2.30.7 does not read it: no release from 2.5.7 on"), name
        assert nv.name_problem(name, (2, 4, 8)) is None
    assert "last read by 2.3.7" in nv.name_problem("NCCL_IB_GDR_LEVEL", V30)
    assert nv.name_problem("NCCL_NET_GDR_LEVEL", V30) is None
    assert "does not read it yet" in nv.name_problem("NCCL_GIN_ENABLE", V23)
    assert nv.name_problem("NCCL_GIN_ENABLE", V30) is None
    assert t.column((2, 21, 3)) == t.versions.index((2, 21, 5))        # same minor
    assert t.column((2, 31, 0)) == len(t.versions) - 1


def test_integers_as_strtoll_reads_them():
    assert "as the integer 4" in nv.problems({"NCCL_BUFFSIZE": "4M"}, DDP, V30)[0]
    assert "as the integer 0" in nv.problems({"NCCL_IB_QPS_PER_CONNECTION": "four"}, DDP, V30)[0]
    assert nv.problems({"NCCL_BUFFSIZE": "0x400000", "NCCL_IB_TC": "106", "NCCL_NET_GDR_LEVEL": "PHB"}, DDP, V30) == []


def test_workload_functions():
    assert nv.workload_functions("collectives", ()) == {"AllReduce"}
    assert nv.workload_functions("collectives", ("collectives.ops=[all_gather,broadcast]",)) == \
        {"AllGather", "Broadcast", "AllReduce"}
    assert "Broadcast" in nv.workload_functions("collectives", ("collectives.average=rank0",))
    assert nv.workload_functions("link", ()) == frozenset()
    assert {"Broadcast", "AllGather"} <= nv.workload_functions("pretrain", ())


def test_a_profile_with_a_removed_name_or_a_bad_algo_is_refused(monkeypatch):
    from workloads.fabric.profile import FabricProfile

    monkeypatch.setenv(nv.VERSION_ENV, "2.30.7")
    nv.runtime_version.cache_clear()
    try:
        with pytest.raises(UsageError, match=r"fabric\.env\.NCCL_LL_THRESHOLD: NCCL 2\.30\.7 does not read it"):
            FabricProfile.from_config({"name": "x", "backend": "nccl", "env": {"NCCL_LL_THRESHOLD": 0}})
        with pytest.raises(UsageError, match="Unrecognized element token"):
            FabricProfile.from_config({"name": "x", "backend": "nccl", "env": {"NCCL_ALGO": "nvls_tree"}})
        FabricProfile.from_config({"name": "x", "backend": "nccl", "env": {"NCCL_ALGO": "Tree"}})  # workload unknown
        monkeypatch.setenv(nv.VERSION_ENV, "2.4.8")
        nv.runtime_version.cache_clear()
        FabricProfile.from_config({"name": "x", "backend": "nccl", "env": {"NCCL_LL_THRESHOLD": 0}})
    finally:
        nv.runtime_version.cache_clear()
