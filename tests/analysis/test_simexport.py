"""Exports of a calibration to ASTRA-sim, Calculon and Vidur (analysis/simexport.py), checked
against each loader's rules as its source states them (tests/fixtures/simulators/README.md cites
the files): none of the three installs here from PyPI under its own name. Each checker also
accepts upstream's own example, so it checks the format, not our reading of it."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import yaml

from analysis import projection as pj
from analysis import simexport
from helpers import FIXTURES

SIM = FIXTURES / "simulators"
ALPHA, B = 200e-6, 12.5e6


def _cal() -> dict:
    def rec(p):
        rows = [{"op": "all_reduce", "size": s, "group_size": p, "out_of_place": None,
                 "in_place": {"time_us": 1e6 * pj.model_time("all_reduce", p, s, ALPHA, 1 / B)}}
                for s in (1 << 16, 1 << 20, 1 << 24)]
        return (Path(f"/r/{p}.json"), {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "rows": rows,
                                       "fabric": {"name": "emu-100m"}, "world": {"world_size": p},
                                       "fingerprint": {"git": {"commit": "c0ffee"}},
                                       "line_rate": {"per_comm(GB/s)": 0.025}})
    return pj.fit([rec(2), rec(4)], boot=50)


def _gloo_cal() -> dict:
    """A Gloo fabric's calibration (Gloo's ring form) at 8 ms a round trip and 12 MB/s."""
    def rec(p):
        rows = [{"op": op, "size": s, "group_size": p, "out_of_place": None,
                 "in_place": {"time_us": 1e6 * pj.gloo_ring(op, p, s, 8e-3, 1 / 12e6)}}
                for op in ("all_reduce", "all_gather") for s in (1 << 12, 1 << 16, 1 << 20, 1 << 24)]
        return (Path(f"/r/{p}.json"), {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "rows": rows,
                                       "fabric": {"name": "emu-100m", "backend": "gloo"}, "world": {"world_size": p},
                                       "fingerprint": {"git": {"commit": "c0ffee"}},
                                       "line_rate": {"per_comm(GB/s)": 0.025}})
    return pj.fit([rec(2), rec(4)], boot=20)


def astra_valid(doc: dict) -> list[str]:
    """astra-network-analytical NetworkParser's checks: known topologies, four lists of one length,
    npus_count > 1, bandwidth > 0, latency >= 0."""
    errors = []
    topo = doc.get("topology") or []
    if any(t not in ("Ring", "FullyConnected", "Switch") for t in topo):
        errors.append(f"topology {topo}")
    for key in ("npus_count", "bandwidth", "latency"):
        if len(doc.get(key) or []) != len(topo):
            errors.append(f"length of {key}")
    errors += [f"npus_count {n}" for n in doc.get("npus_count") or [] if not int(n) > 1]
    errors += [f"bandwidth {b}" for b in doc.get("bandwidth") or [] if not float(b) > 0]
    errors += [f"latency {x}" for x in doc.get("latency") or [] if not float(x) >= 0]
    return errors


def calculon_valid(net: dict) -> list[str]:
    """calculon/network.py's Network.__init__ and _parse_op assertions."""
    keys = {"bandwidth", "efficiency", "size", "latency", "ops", "must_be_filled", "processor_usage"}
    errors = [] if set(net) == keys else [f"keys {sorted(net)}"]
    if not net.get("bandwidth", 0) > 0 or not 0 < net.get("efficiency", 0) <= 1 or not net.get("size", -1) >= 0:
        errors.append("bandwidth, efficiency or size")
    ops = net.get("ops") or {}
    if set(ops) != {"p2p", "reduce_scatter", "all_gather", "all_reduce"}:
        errors.append(f"ops {sorted(ops)}")
    for op, (scalar, offset) in ops.items():
        if not scalar > 0 or (offset is None) != (op == "p2p"):
            errors.append(f"op {op}")
    if not 0 <= net.get("processor_usage", -1) < 1:
        errors.append("processor_usage")
    return errors


def calculon_time(net: dict, op: str, size: float, p: int) -> float:
    scalar, offset = net["ops"][op]
    s = size * scalar
    s += s / p * (offset or 0)
    return net["latency"] + s / (net["bandwidth"] * 1e9 * net["efficiency"])


def test_the_checkers_accept_upstreams_examples():
    assert astra_valid(yaml.safe_load((SIM / "astra-sim_Ring_4npus.yml").read_text())) == []
    assert astra_valid({"topology": ["Ring"], "npus_count": [1], "bandwidth": [50], "latency": [1]}) == ["npus_count 1"]
    for net in json.loads((SIM / "calculon_h100_80g_nvl8.json").read_text())["networks"]:
        assert calculon_valid(net) == []
    assert calculon_valid({"bandwidth": 1}) != []
    with (SIM / "vidur_h100_dgx_all_reduce_head.csv").open() as f:
        assert next(csv.reader(f)) == simexport.VIDUR_COLUMNS


def test_astra_sim_network_config():
    text = simexport.astra_sim(_cal(), 512)
    assert text.startswith("# fabricbench calibration of emu-100m")
    doc = yaml.safe_load(text)
    assert astra_valid(doc) == []
    assert doc["topology"] == ["Switch"] and doc["npus_count"] == [512]
    assert doc["bandwidth"][0] == pytest.approx(B / 1e9, rel=1e-5)            # GB/s
    assert doc["latency"][0] == pytest.approx(ALPHA / 2 * 1e9, rel=1e-3)       # ns: half a step, kappa 0 here


def test_calculon_network_prices_the_ring_as_the_model_does():
    cal = _cal()
    net = simexport.calculon(cal, 64)
    assert calculon_valid(net) == []
    # the line rate the records know (0.025 GB/s), at the efficiency that leaves B = 0.0125 GB/s
    assert net["bandwidth"] == 0.025 and net["efficiency"] == pytest.approx(0.5, rel=1e-5)
    # Calculon's time of a 16 MiB all_reduce over the 64 ranks of the network is the model's
    size = 16 << 20
    assert calculon_time(net, "all_reduce", size, 64) == pytest.approx(pj.model_time("all_reduce", 64, size, ALPHA, 1 / B),
                                                                         rel=1e-4)
    # an all_gather's bytes too (its latency is the all_reduce's, 2x its own: said in the module)
    bytes_only = calculon_time(net, "all_gather", size, 64) - net["latency"]
    assert bytes_only == pytest.approx(size * 63 / 64 / B, rel=1e-4)


def test_a_gloo_calibration_exports_one_of_its_two_lines():
    cal = _gloo_cal()
    c = cal["ops"]["all_reduce"]
    assert c["form"] == "gloo"
    # by default the ring form's line, 2 x 63 x 8 ms + S x G / B: at 64 ranks Gloo's two lines cross
    # where a segment's 96000 bytes take 8 ms, S = 128 x 96000 = 12.288 MB; Gloo there: 2 x 127 x 8 ms
    # = 2.032 s, the ring line 1.008 + 12.288e6 x 126/64 / 12e6 = 3.024 s: +48.8%
    size, err = simexport.crossover(cal, 64)
    assert size == pytest.approx(12_288_000, rel=1e-3) and err == pytest.approx(0.48819, abs=2e-3)
    net = simexport.calculon(cal, 64)
    assert net["latency"] == pytest.approx(1.008, rel=1e-3)
    assert yaml.safe_load(simexport.astra_sim(cal, 64))["latency"][0] == pytest.approx(4e6, rel=1e-3)  # 8 ms / 2
    # the line through 1 GiB (1 MiB segments, 87 ms each: a round trip and the bytes a phase):
    # latency 2 x 8 ms, bus bandwidth B; Calculon then gives Gloo's time at 1 GiB
    big = simexport.calculon(cal, 64, 1 << 30)
    assert calculon_valid(big) == [] and big["latency"] == pytest.approx(0.016, rel=1e-3)
    assert big["bandwidth"] * big["efficiency"] == pytest.approx(0.012, rel=1e-3)
    assert calculon_time(big, "all_reduce", 1 << 30, 64) == pytest.approx(pj.op_time(c, "all_reduce", 64, 1 << 30),
                                                                           rel=1e-4)
    # through 1 MiB (8 KiB segments, shorter than a round trip): 126 x 8 ms, and the bytes at twice
    # the rate less 1/64: 126/64 x 12 MB/s = 23.625 MB/s of bus bandwidth
    small = simexport.calculon(cal, 64, 1 << 20)
    assert small["latency"] == pytest.approx(1.008, rel=1e-3)
    assert small["bandwidth"] * small["efficiency"] == pytest.approx(0.023625, rel=1e-3)
    assert calculon_time(small, "all_reduce", 1 << 20, 64) == pytest.approx(pj.op_time(c, "all_reduce", 64, 1 << 20),
                                                                             rel=1e-4)
    astra = yaml.safe_load(simexport.astra_sim(cal, 64, 1 << 20))
    assert astra_valid(astra) == [] and astra["bandwidth"][0] == pytest.approx(0.023625, rel=1e-3)
    # on Gloo reduce_scatter is an all_reduce of the whole buffer; Gloo's all_gather line is B too
    assert big["ops"]["reduce_scatter"] == [2.0, -1] and big["ops"]["all_gather"][0] == pytest.approx(1.0, rel=1e-3)
    assert simexport.crossover(_cal(), 64) is None           # the ring form is one line


def test_vidur_all_reduce_csv_reads_as_vidur_filters_it():
    cal = _cal()
    text = simexport.vidur(cal, [2, 4, 8], [2048, 1 << 20])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == simexport.VIDUR_COLUMNS and len(rows) == 6
    # _load_all_reduce_df for TP=4: num_workers == devices_per_node == 4, collective == all_reduce
    tp4 = [r for r in rows if int(r["num_workers"]) == 4 and int(r["devices_per_node"]) == 4
           and r["collective"] == "all_reduce"]
    assert [int(r["size"]) for r in tp4] == [2048, 1 << 20]
    med = float(tp4[1]["time_stats.all_reduce.median"])
    assert med == pytest.approx(1e3 * pj.model_time("all_reduce", 4, 1 << 20, ALPHA, 1 / B), rel=1e-6)   # ms
    lo, hi = float(tp4[1]["time_stats.all_reduce.min"]), float(tp4[1]["time_stats.all_reduce.max"])
    assert lo <= med <= hi and math.isclose(float(tp4[1]["time_stats.all_reduce.mean"]), med)


def test_an_export_needs_an_all_reduce():
    cal = _cal()
    cal["ops"] = {}
    with pytest.raises(pj.UsageError, match="has no all_reduce"):
        simexport.calculon(cal, 8)


def test_the_export_command_writes_the_three_files(tmp_path):
    import subprocess
    import sys

    from helpers import REPO, child_env

    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(_cal()))
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", "export", str(cal), "--ranks", "512",
                        "--out", str(tmp_path / "sim")], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "model-only" in r.stdout                                     # 512 > 4 x 4
    assert astra_valid(yaml.safe_load((tmp_path / "sim" / "astra-sim-network.yml").read_text())) == []
    assert calculon_valid(json.loads((tmp_path / "sim" / "calculon-network.json").read_text())) == []
    rows = list(csv.DictReader((tmp_path / "sim" / "vidur-all_reduce.csv").open()))
    assert sorted({int(r["num_workers"]) for r in rows}) == [2, 4, 8, 512]
    r = subprocess.run([sys.executable, "-m", "workloads.commands.cli", "model", "export", str(cal), "--ranks", "8,16",
                        "--out", str(tmp_path / "x")], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "export one network size" in r.stderr
