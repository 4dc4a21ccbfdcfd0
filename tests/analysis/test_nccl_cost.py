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
    rows = hi.nccl_rows(nodes, gpn, version, truth, SIZES)
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
    pairs = {"world": {"world_size": 16, "nodes": 2, "local_world_size": 8}, "collectives": {"pattern": "pairs"}}
    assert hi.level_of(pairs, 2) == (2, 1)
    assert hi.level_of(pairs | {"world": {"world_size": 8, "nodes": 1, "local_world_size": 8}}, 2) == (1, 2)
    with pytest.raises(UsageError, match="ran NCCL 2.23.4, 2.30.7: fit one version"):
        hi.fit([_record(2, 8, "2.23.4"), _record(4, 8, "2.30.7")])
    with pytest.raises(UsageError, match="NCCL 2.18.3: its cost model is not ported"):
        hi.fit([_record(2, 8, "2.30.7") | {"fingerprint": {"nccl": "2.18.3"}}])
    one = {"nccl": hi.fit([_record(1, 8), _record(1, 4)])}
    with pytest.raises(UsageError, match="measured one node only"):
        hi.check_scale(one["nccl"], 2, 8)


# --- NCCL's own TUNING tables (fixtures written from tuning.cc's format strings) and the CLI ----------

LOGS = {v: FIXTURES / "nccl_logs" / f"nccl_{v}_tuning_2x8" / "nccl.gpu-a.7100.log" for v in ("2.23", "2.30")}


@pytest.mark.parametrize("version", ["2.23", "2.30"])
def test_the_tables_parse_with_their_layout_and_version(version):
    t = nm.read(LOGS[version])
    assert (t["nranks"], t["nodes"], t["local_ranks"]) == (16, 2, 8) and t["version"].startswith(version)
    ar = t["cells"]["AllReduce"]
    # 8.4 + 28 x 3.4 + 2 x 14.0 us; 45 GB/s x 16 / 30
    assert ar["Ring/Simple"] == (131.6, 24.0) and len(ar) == 21
    assert not t["per_call_lines"]


@pytest.mark.parametrize("version", ["2.23", "2.30"])
def test_a_calibration_of_a_fabric_nccl_describes_agrees_with_its_table(version):
    full = {"2.23": "2.23.4", "2.30": "2.30.7"}[version]
    cal = {"nccl": hi.fit([_record(2, 8, full), _record(4, 8, full)]), "fabric": "h100"}
    chk = nm.check_nccl(cal, nm.read(LOGS[version]))
    assert chk["ops"] and all(o["agree"] and o["same_algo"] == len(o["rows"]) for o in chk["ops"].values())
    assert all(abs(r["ratio"] - 1) < 0.01 for o in chk["ops"].values() for r in o["rows"])
    assert "agrees within 10% at all 10 sizes" in nm.check_nccl_lines(chk)[1]
    # a fabric 30% slower across nodes than NCCL's model is told, with the size where
    slow = nc.Measured(intra_busbw=360.0, inter_busbw=45.0 / 1.3, net_lat=1.3)
    cal = {"nccl": hi.fit([_record(2, 8, full, slow), _record(4, 8, full, slow)]), "fabric": "h100"}
    lines = nm.check_nccl_lines(nm.check_nccl(cal, nm.read(LOGS[version])))
    assert "differs: at" in lines[1]
    other = {"2.23": "2.30", "2.30": "2.23"}[version]
    with pytest.raises(UsageError, match="give a log of the same NCCL install"):
        nm.check_nccl(cal, nm.read(LOGS[other]))


def _run_record(nodes, gpn, block):
    r = _record(nodes, gpn)
    return r | {"workload": "collectives", "status": "ok", "run_id": f"n{nodes}-{block}", "record_id": f"{nodes}-{block}",
                "created": "2026-12-01T10:00:00+0000", "config": {"trial": block, "fabric": {"name": "h100-ib"}},
                "fabric": {"name": "h100-ib", "backend": "nccl"}, "study": {"id": "s", "block": block},
                "fingerprint": {"nccl": "2.30.7", "git": {"commit": "c0ffee", "dirty_hash": None}},
                "line_rate": {"payload_per_comm(GB/s)": 48.0, "per_comm(GB/s)": 50.0}}


def test_cli_fits_levels_and_projects_nodes_naming_nccls_algorithm(tmp_path):
    import json
    import subprocess
    import sys

    from helpers import REPO, child_env

    res = tmp_path / "res"
    for i, (n, b) in enumerate((n, b) for n in (2, 4) for b in range(2)):
        d = res / f"run{i}" / "records"
        d.mkdir(parents=True)
        (d / "c.json").write_text(json.dumps(_run_record(n, 8, b)))

    def cli(*a):
        return subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", *map(str, a)], cwd=REPO,
                              env=child_env(), capture_output=True, text=True, timeout=120)

    cal = tmp_path / "cal.json"
    r = cli("fit", res, "--out", cal, "--bootstrap", 50, "--nccl-log", LOGS["2.30"])
    assert r.returncode == 0, r.stderr
    assert "inter-node: bus bandwidth 45 GB/s" in r.stdout and "intra-node" in r.stdout and "not measured" in r.stdout
    assert "all_reduce: agrees within 10%" in r.stdout
    r = cli("project", cal, "--nodes", "64", "--gpus-per-node", 8, "--sizes", "64K,256M", "--ops", "all_reduce")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and all("on 64 x 8 (512 ranks)" in x and "NCCL 2.30" in x for x in lines)
    truth = nc.choose(hi.base_topology(64, 8), "all_reduce", 1 << 16, "2.30", TRUE)
    assert f"{truth.time_s * 1e3:.3f} ms" in lines[0] and f"{truth.algo}/{truth.proto}" in lines[0]
    # --ranks alone: one level (multi-node at 8 per node) -> 64 nodes
    r2 = cli("project", cal, "--ranks", 512, "--sizes", "64K", "--ops", "all_reduce")
    assert r2.returncode == 0 and r2.stdout.splitlines()[0] == lines[0]
    for args, words in ((("--ranks", 500), "8 GPUs per node do not divide 500 ranks"),
                        (("--nodes", 1, "--gpus-per-node", 8), "measured multi-node communicators only"),
                        (("--nodes", "x"), "--nodes 'x': give whole numbers")):
        r = cli("project", cal, *args)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and words in r.stderr, r.stderr
    # model check against 8 nodes it did not see: NCCL's model there, per cell
    held = tmp_path / "held" / "run8" / "records"
    held.mkdir(parents=True)
    (held / "c.json").write_text(json.dumps(_run_record(8, 8, 0)))
    r = cli("check", cal, tmp_path / "held")
    assert r.returncode == 0, r.stderr
    assert "all_reduce 65536 B on 8 x 8: measured" in r.stdout and "(Tree/LL; extrapolated), error 0.0%" in r.stdout
    assert "30 measured cells against NCCL's model through the fitted levels: median |error| 0.0%" in r.stdout
    r = cli("export", cal, "--nodes", 64, "--out", tmp_path / "sim")
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "needs both levels" in r.stderr
    r = cli("fit", res, "--out", tmp_path / "c2.json", "--bootstrap", 50, "--nccl-log", LOGS["2.23"])
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "same NCCL install" in r.stderr
    assert not (tmp_path / "c2.json").exists()


def test_a_training_step_through_the_levels_worked():
    cal = {"nccl": hi.fit([_record(1, 8), _record(2, 8), _record(4, 8)]), "fabric": "h100-ib",
           "code": {"commit": "c0ffee", "dirty_hash": None}}
    assert cal["nccl"]["measured"]["intra_busbw"] == pytest.approx(360.0, rel=1e-3)
    # 2 x 8 ranks: 1 s steps, 0.8 s with a collective in flight; per step one data-parallel
    # all_reduce of 231168 floats on all 16 ranks and one tensor-parallel all_reduce of 1 MiB on 8
    rec = {"workload": "pretrain", "status": "ok", "fabric": {"name": "h100-ib"},
           "world": {"world_size": 16, "nodes": 2, "local_world_size": 8},
           "fingerprint": {"git": {"commit": "c0ffee", "dirty_hash": None}, "nccl": "2.30.7"},
           "metrics": {"iteration_time(s)": 1.0, "comm_share": 0.8, "measured_steps": 10},
           "samples": {"comm_calls": [[["all_reduce", "float32", 231168, 16, 0.0, 0.1],
                                       ["all_reduce", "bfloat16", 1 << 19, 8, 0.1, 0.2]]]}}
    sp = hi.project_step(cal, rec, 64, 8)
    t = lambda n, g, s: nc.choose(hi.base_topology(n, g), "all_reduce", s, "2.30", TRUE).time_s  # noqa: E731
    dp0, dp, tp = t(2, 8, 924672), t(64, 8, 924672), t(1, 8, 1 << 20)
    assert sp["step_s"] == pytest.approx(0.2 + 0.8 * (dp + tp) / (dp0 + tp), rel=1e-3)
    assert sp["calls"]["all_reduce inside a node (8 GPUs)"] == pytest.approx(tp, rel=1e-3)
    assert sp["label"] == "model-only" and "training step on 64 x 8 (512 ranks)" in hi.step_line(sp)
    bad = rec | {"samples": {"comm_calls": [[["all_reduce", "float32", 10, 12, 0.0, 0.1]]]}}
    with pytest.raises(UsageError, match="groups of 12 ranks that span nodes of 8"):
        hi.project_step(cal, bad, 64, 8)


def test_exports_of_an_nccl_calibration_worked():
    import yaml

    from analysis import simexport

    cal = {"nccl": hi.fit([_record(1, 8), _record(2, 8), _record(4, 8)]), "fabric": "h100-ib",
           "code": {"commit": "c0ffee", "dirty_hash": None}, "created": "2026-12-01T10:00:00+0000"}
    net = yaml.safe_load(simexport.astra_sim_nccl(cal, 64, 8))
    assert net["topology"] == ["Switch", "Switch"] and net["npus_count"] == [8, 64]
    assert net["bandwidth"] == pytest.approx([360.0, 45.0], rel=1e-4)
    # NCCL 2.30.7's ring Simple step: NVLink 3.4 us, NET 14.0 us, x 1.0, halved, in ns
    assert net["latency"] == pytest.approx([1700.0, 7000.0], rel=1e-4)
    rows = simexport.vidur_nccl(cal, [2, 4, 8], [1 << 20]).splitlines()
    assert len(rows) == 4 and rows[0].split(",")[4] == "time_stats.all_reduce.median"
    tp8 = nc.choose(hi.base_topology(1, 8), "all_reduce", 1 << 20, "2.30", TRUE).time_s * 1e3
    assert float(rows[3].split(",")[4]) == pytest.approx(tp8, rel=1e-3)
    intra, inter = simexport.calculon_nccl(cal, 64, 8)
    assert (intra["size"], inter["size"]) == (8, 512)
    # the line through 16 and 32 MiB of NCCL's model on 64 x 8
    t1, t2 = (nc.choose(hi.base_topology(64, 8), "all_reduce", s, "2.30", TRUE).time_s for s in (16 << 20, 32 << 20))
    slope = (t2 - t1) / (16 << 20)
    assert inter["bandwidth"] == pytest.approx(2 * 511 / 512 / slope / 1e9, rel=1e-3)


def test_a_bandwidth_above_the_payload_ceiling_is_flagged():
    from pathlib import Path

    from analysis import projection as pj
    from analysis.projection import lines

    # the records' link carries 30 GB/s of payload per communicator; they show 45 GB/s of bus bandwidth
    recs = [(Path(f"/r/{n}-{b}.json"), _run_record(n, 8, b) | {"line_rate": {"payload_per_comm(GB/s)": 30.0}})
            for n in (2, 4) for b in range(2)]
    cal = pj.fit(recs, boot=50)
    cal["nccl"] = hi.fit([r for _, r in recs])
    ring = [x for x in lines.fit_lines(cal) if x.startswith("  all_reduce")]
    assert ring and "ABOVE it" in ring[0]
    inter = next(x for x in hi.fit_lines(cal) if "inter-node" in x)
    assert "ABOVE the link's payload ceiling 30 GB/s" in inter
    cal["payload_GBps"] = 60.0
    assert "ABOVE" not in " ".join(hi.fit_lines(cal)) and "ABOVE" not in " ".join(lines.fit_lines(cal))


def test_alltoall_splits_nvlink_and_network_bytes_worked():
    # 16 MiB on 2 x 8: each rank sends 1 MiB to each of 15 peers, 7 over NVLink (7 MiB at 300 GB/s)
    # and 8 over the network (8 MiB at 40 GB/s): 15 x 5 us + 8 MiB / 40 GB/s (the slower side)
    assert hi._a2a_time(16 << 20, 2, 8, 5e-6, 300.0, 40.0) == pytest.approx(15 * 5e-6 + (8 << 20) / 40e9)
    # one node: NVLink only
    assert hi._a2a_time(16 << 20, 1, 8, 5e-6, 300.0, 40.0) == pytest.approx(7 * 5e-6 + (14 << 20) / 300e9)
    recs = []
    for n in (1, 2, 4):
        r = _record(n, 8)
        r["rows"] += [{"op": "alltoall", "size": s, "group_size": n * 8, "out_of_place":
                       {"time_us": hi._a2a_time(s, n, 8, 5e-6, 300.0, 40.0) * 1e6}} for s in SIZES]
        recs.append(r)
    cal = {"nccl": hi.fit(recs), "fabric": "h100-ib"}
    a = cal["nccl"]["alltoall"]
    assert (a["lat_s"], a["intra_GBps"], a["inter_GBps"]) == pytest.approx((5e-6, 300.0, 40.0), rel=1e-3)
    pr = hi.projection(cal, "alltoall", 1 << 28, 64, 8)
    assert pr["algo"] == "p2p" and pr["time_s"] == pytest.approx(511 * 5e-6 + (1 << 28) * 504 / 512 / 40e9, rel=1e-3)
    assert "p2p, NVLink and network bytes apart" in hi.projection_line(pr, "h100-ib")


def test_one_short_label_per_fabric(capsys):
    from workloads.commands.model import _names

    long = "emu-100m (delay=1ms, rate=30mbit)"
    assert _names([{"fabric": long}]) == ["emu-100m"]
    assert capsys.readouterr().out == f"emu-100m = {long}\n"
    assert _names([{"fabric": long}, {"fabric": "emu-100m (rate=50mbit)"}]) == ["A", "B"]
    assert capsys.readouterr().out == f"A = {long}\nB = emu-100m (rate=50mbit)\n"
    assert _names([{"fabric": "roce"}, {"fabric": "ib"}]) == ["roce", "ib"] and capsys.readouterr().out == ""


def test_the_fit_holds_on_noisy_records():
    import random

    rng = random.Random(5601)
    truth = nc.Measured(intra_busbw=200.0, inter_busbw=12.0, intra_lat=0.8, net_lat=2.5)
    recs = []
    for n in (1, 2, 4):
        r = _record(n, 8, truth=truth)
        for row in r["rows"]:            # +-3% on every cell, independently
            row["in_place"] = row["out_of_place"] = {"time_us": row["in_place"]["time_us"] * (1 + rng.uniform(-.03, .03))}
        recs.append(r)
    cal = {"nccl": hi.fit(recs)}
    for s in (1 << 16, 1 << 20, 16 << 20, 256 << 20):
        truth_s = nc.choose(hi.base_topology(64, 8), "all_reduce", s, "2.30", truth).time_s
        assert hi.predict("all_reduce", s, 64, 8, cal)["time_s"] == pytest.approx(truth_s, rel=0.03)


def test_nvls_read_from_nccls_table_shapes_the_fit():
    nvls = {"nvls": True}
    recs = []
    for n in (1, 2, 4):
        r = _record(n, 8)
        r["rows"] = hi.nccl_rows(n, 8, "2.30.7", TRUE, SIZES, **nvls)
        recs.append(r)
    # the table of a 2 x 8 NVLS system, printed as tuning.cc prints it
    text = "\n".join("h:1:1 [0] NCCL INFO " + x for x in
                     ["NCCL version 2.30.7+cuda13.0", "comm 0x1 rank 0 nRanks 16 nNodes 2 localRanks 8 localRank 0 MNNVL 0"]
                     + nc.tuning_lines(nc.tune(hi.base_topology(2, 8, **nvls), "2.30", TRUE))
                     + ["x comm 0x1 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 1 commId 0x2 - Init COMPLETE"])
    (table,) = nm.parse_tuning(text)
    assert hi.shape_of(table) == nvls and hi.shape_of(nm.read(LOGS["2.30"])) == {"nvls": False}
    cal = {"nccl": hi.fit(recs, **hi.shape_of(table)), "fabric": "h100"}
    big = hi.predict("all_reduce", 256 << 20, 64, 8, cal)
    truth = nc.choose(hi.base_topology(64, 8, **nvls), "all_reduce", 256 << 20, "2.30", TRUE)
    assert big["algo"] == truth.algo == "NVLSTree" and big["time_s"] == pytest.approx(truth.time_s, rel=0.02)
    assert all(o["agree"] for o in nm.check_nccl(cal, table)["ops"].values())


def test_a_projected_comparison_is_nccls_gap():
    slow = nc.Measured(intra_busbw=360.0, inter_busbw=25.0, net_lat=1.5)
    a = {"nccl": hi.fit([_record(2, 8), _record(4, 8)]), "fabric": "ib"}
    b = {"nccl": hi.fit([_record(2, 8, truth=slow), _record(4, 8, truth=slow)]), "fabric": "roce"}
    pa, pb = (hi.projection(c, "all_reduce", 16 << 20, 64, 8) for c in (a, b))
    t = {k: nc.choose(hi.base_topology(64, 8), "all_reduce", 16 << 20, "2.30", m).time_s for k, m in (("a", TRUE), ("b", slow))}
    gap = 100 * (t["b"] / t["a"] - 1)
    line = hi.compare_line(pa, pb, ("ib", "roce"))
    assert f"ib is faster than roce by {gap:.1f}%" in line and "on 64 x 8, all_reduce 16 MiB" in line


def test_no_line_of_an_nccl_projection_prices_a_flat_ring(tmp_path):
    """`model project` on an NCCL calibration at 512 ranks (64 x 8), every op and size: each line is
    NCCL's model through the fitted levels (its time, the algorithm and protocol NCCL picks there),
    none the flat ring the calibration's ring terms would give, and none prints an interval (this
    form has none yet, so none can fall outside the floor or the line rate)."""
    import json
    import re
    import subprocess
    import sys

    from analysis import projection as pj
    from helpers import REPO, child_env

    res = tmp_path / "res"
    for i, (n, b) in enumerate((n, b) for n in (2, 4) for b in range(2)):
        d = res / f"run{i}" / "records"
        d.mkdir(parents=True)
        (d / "c.json").write_text(json.dumps(_run_record(n, 8, b)))
    cal_path = tmp_path / "cal.json"
    run = lambda *a: subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", *map(str, a)],  # noqa: E731
                                    cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert run("fit", res, "--out", cal_path, "--bootstrap", 50).returncode == 0
    cal = json.loads(cal_path.read_text())
    sizes = [1 << 12, 1 << 16, 1 << 20, 16 << 20, 256 << 20]
    r = run("project", cal_path, "--nodes", 64, "--gpus-per-node", 8, "--sizes", "4K,64K,1M,16M,256M")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 3 * len(sizes)
    algos = set()
    for x, (op, s) in zip(lines, [(op, s) for op in hi.NCCL_OPS for s in sizes]):
        m = re.match(rf"h100-ib {op} \S+ \S+ on 64 x 8 \(512 ranks\): ([\d.]+) ms, .*; NCCL 2\.30 (\w+)/(\w+); model-only", x)
        assert m, x
        nccl = hi.predict(op, s, 64, 8, cal)
        assert float(m.group(1)) == pytest.approx(nccl["time_s"] * 1e3, abs=5e-4) and m.groups()[1:] == (nccl["algo"], nccl["proto"])
        flat = pj.project(cal, op, 512, s).time_s
        if s <= 1 << 20:   # where latency counts, the flat ring (no per-call constant, one link) says otherwise
            assert abs(flat / nccl["time_s"] - 1) > 0.15, (x, flat)
        assert "[" not in x and "no interval for this form yet" in x
        algos.add(m.group(2))
    assert algos - {"Ring"}, algos     # NCCL's choice by size and node count, not one ring throughout


def test_an_nccl_projection_is_model_only_past_2x_the_measured_nodes_as_every_form():
    cal = {"nccl": hi.fit([_record(2, 8), _record(4, 8)])}
    assert [hi.label(cal["nccl"], n, 8) for n in (2, 3, 8, 9, 64)] == [
        "measured", "interpolated", "extrapolated", "model-only", "model-only"]
