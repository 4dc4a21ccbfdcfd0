"""NCCL's cost model ported (analysis/nccl_cost.py) and the per-level NCCL calibration
(analysis/projection/hierarchy.py), pinned with values worked by hand from NCCL's constants:
src/graph/tuning.cc of NVIDIA/nccl v2.23.4-1 (hwLat, baseLat, perChMax*Bws, llMaxBws,
treeCorrectionFactor) and v2.30.7-1 (ncclTunerConstantsDefaults, nvlsEfficiency)."""

from __future__ import annotations

import pytest

from analysis import nccl_cost as nc
from analysis import nccl_model as nm
from analysis.projection import hierarchy as hi
from helpers import FIXTURES
from workloads.core.errors import UsageError

H100 = nc.Graph(16, 20.0, 20.0)          # 16 channels at 20 GB/s each, NVLink inside the node


def _topo(nodes, gpn=8, **kw):
    return nc.Topology(nodes, gpn, H100, **kw)


def test_ring_and_tree_latencies_worked():
    tab = nc.tune(_topo(2), "2.30")["AllReduce"]
    # Ring/Simple, 2 nodes of 8: baseLat 8.4 + (2(16-1) - 2(2-1)) = 28 NVLink steps x max(3.4, 3 x 1.0
    # net overhead) + 2 network steps x 14.0
    assert tab["Ring/Simple"][0] == pytest.approx(8.4 + 28 * 3.4 + 2 * 14.0)
    # Tree/LL: 6.8 + 2 x ((8-1) x 0.6 NVLink + log2(2) x 5.0 NET)
    assert tab["Tree/LL"][0] == pytest.approx(6.8 + 2 * (7 * 0.6 + 5.0))
    # NVLSTree/Simple differs by release: NET latency 14 (2.23.4) and 20.9 (2.30.7), NVLink 25
    nv = nc.Graph(16, 40.0, 20.0)
    assert nc.tune(_topo(2, nvls=nv), "2.23")["AllReduce"]["NVLSTree/Simple"][0] == pytest.approx(25 + 2 * 14)
    assert nc.tune(_topo(2, nvls=nv), "2.30")["AllReduce"]["NVLSTree/Simple"][0] == pytest.approx(25 + 2 * 20.9)


def test_bandwidths_worked():
    tab = nc.tune(_topo(2), "2.30")["AllReduce"]
    # ring: 16 x 20 = 320 GB/s bus, x nRanks / nsteps = 16 / 30 for the algorithm bandwidth
    assert tab["Ring/Simple"][1] == pytest.approx(320 * 16 / 30)
    # tree LL128 (Hopper, 2 nodes): min(320 x .92, 16 x 41.4) = 294.4, then min(x 120/128, 16 x 36.7),
    # then x .5 (tree)
    assert tab["Tree/LL128"][1] == pytest.approx(294.4 * 120 / 128 * .5)
    # tree LL: min(294.4 / 3.8, llMaxBw 39.0 (Intel, 2 nodes)) x .5
    assert tab["Tree/LL"][1] == pytest.approx(39.0 * .5)


def test_time_with_the_tree_correction_and_the_ring_plateau_worked():
    t = _topo(2)
    ch = nc.choose(t, "all_reduce", 65536, "2.30")
    # 64 KiB: log2(65536 >> 6) = 10, treeCorrectionFactor[LL][10] = .6: 25.2 us + 65536 / (1000 x 19.5 x .6)
    assert ch.name == "Tree/LL" and ch.time_s == pytest.approx((25.2 + 65536 / (1000 * 19.5 * .6)) * 1e-6)
    # Ring/Simple at 1 MiB across nodes: 1048576 / (16 ch x 16 ranks) >= 64, latency x 1.4 (sm80+)
    ring = nc.choose(t, "all_reduce", 1 << 20, "2.30").costs["Ring/Simple"]
    assert ring == pytest.approx((131.6 * 1.4 + (1 << 20) / (1000 * 320 * 16 / 30)) * 1e-6)
    # one node has no plateau
    one = nc.choose(_topo(1), "all_reduce", 1 << 20, "2.30").costs["Ring/Simple"]
    assert one == pytest.approx((8.4 + 14 * 3.4 + (1 << 20) / (1000 * 320 * 8 / 14)) * 1e-6)


def test_the_port_reproduces_the_2_30_fixture_table_cell_for_cell():
    # the fixture's table was worked by hand for 8 nodes x 1 GPU, 2 channels of 12 GB/s, no LL128
    log = nm.read(FIXTURES / "nccl_logs" / "nccl_2.30_tuning_table" / "nccl.h0.9100.log")
    tab = nc.tune(nc.Topology(8, 1, nc.Graph(2, 12.0, 12.0), ll128=False), "2.30")
    for func in nc.FUNCS:
        for key, (lat, bw) in tab[func].items():
            assert (round(lat, 1), round(bw, 1)) == log["cells"][func][key], (func, key)


def test_versions():
    assert nc.version_of("2.21.5") == "2.23" and nc.version_of("2.30.7+cuda13.0") == "2.30"
    assert nc.version_of("2.18.3") is None and nc.version_of(None) is None
    # PAT: 2.23.4 x .85 and 8 us inside the model, 2.30.7 x .75 and baseLat 8.0 (one GPU per node)
    t = nc.Topology(4, 1, nc.Graph(2, 12.0, 12.0))
    a, b = nc.tune(t, "2.23")["AllGather"]["PAT/Simple"], nc.tune(t, "2.30")["AllGather"]["PAT/Simple"]
    assert a[1] == pytest.approx(2 * 12 * .85) and b[1] == pytest.approx(2 * 12 * .75)
    # latency 8 + log2(4) x (14 / 3.5) + 4 x 2.8 in both
    assert a[0] == pytest.approx(8 + 2 * 4 + 11.2) and b[0] == pytest.approx(8 + 2 * 4 + 11.2)


# --- the per-level calibration: fitted on NCCL-model data, projected through it -----------------

TRUE = nc.Measured(intra_busbw=360.0, inter_busbw=45.0)
SIZES = [1 << k for k in range(10, 29, 2)]


def _record(nodes, gpn, version="2.30.7", truth=TRUE):
    t = hi.base_topology(nodes, gpn)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for s in SIZES:
            us = nc.choose(t, op, s, nc.version_of(version), truth).time_s * 1e6
            rows.append({"op": op, "size": s, "group_size": nodes * gpn, "in_place": {"time_us": us},
                         "out_of_place": {"time_us": us}})
    return {"world": {"world_size": nodes * gpn, "nodes": nodes, "local_world_size": gpn},
            "collectives": {"pattern": "all", "ranks_per_node": gpn}, "fingerprint": {"nccl": version}, "rows": rows}


@pytest.mark.parametrize("version", ["2.23.4", "2.30.7"])
def test_fitted_on_2_and_4_nodes_the_512_rank_projection_is_nccls(version):
    cal = {"nccl": hi.fit([_record(2, 8, version), _record(4, 8, version)])}
    assert cal["nccl"]["levels"]["inter"]["measured_at"] == [[2, 8], [4, 8]]
    assert not cal["nccl"]["levels"]["intra"]["measured_at"]
    for s in (1 << 16, 1 << 20, 16 << 20, 256 << 20):
        truth = nc.choose(hi.base_topology(64, 8), "all_reduce", s, nc.version_of(version), TRUE)
        got = hi.predict("all_reduce", s, 64, 8, cal)
        assert got["time_s"] == pytest.approx(truth.time_s, rel=0.02)
        assert (got["algo"], got["proto"]) == (truth.algo, truth.proto)
    with pytest.raises(UsageError, match="measured multi-node communicators only"):
        hi.check_scale(cal["nccl"], 1, 8)


def test_levels_from_the_records_and_refusals():
    assert hi.level_of(_record(2, 8), 16) == (2, 8)
    assert hi.level_of({"world": {"world_size": 16, "nodes": 2, "local_world_size": 8},
                        "collectives": {"pattern": "one_per_node"}}, 2) == (2, 1)
    assert hi.level_of({"world": {"world_size": 16, "nodes": 2}, "collectives": {"ranks_per_node": 8}}, 8) == (1, 8)
    with pytest.raises(UsageError, match="ran NCCL 2.23.4, 2.30.7: fit one version"):
        hi.fit([_record(2, 8, "2.23.4"), _record(4, 8, "2.30.7")])
    with pytest.raises(UsageError, match="NCCL 2.18.3: its cost model is not ported"):
        hi.fit([_record(2, 8, "2.30.7") | {"fingerprint": {"nccl": "2.18.3"}}])
    one = {"nccl": hi.fit([_record(1, 8), _record(1, 4)])}
    with pytest.raises(UsageError, match="measured one node only"):
        hi.check_scale(one["nccl"], 2, 8)
