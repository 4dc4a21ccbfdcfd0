"""Gloo's own ring as the projection's model form (analysis/projection/forms.py gloo_ring): the segment
schedule of gloo/allreduce.cc and gloo/allgather.cc pinned with worked values, reduce_scatter as
ProcessGroupGloo runs it (an all_reduce of the whole buffer), the robust fit recovering known
parameters past an outlier cell, and the form chosen by the records' backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis import projection as pj

ALPHA, BW = 8e-3, 12e6            # an 8 ms announcement round trip; 12 MB/s of bus bandwidth
SIZES = [1 << 12, 1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24]


def _rec(p: int, *, backend="gloo", kappa=0.0, slow=None, ops=("all_reduce", "all_gather"), serial=0.0) -> dict:
    """One collectives record (one block) at p ranks whose times follow Gloo's ring; `slow` =
    (op, size, factor) multiplies one cell, as a host stall does; `serial` is the share of 2-rank
    all_gather calls whose announcements queued behind data."""
    rows = []
    for op in ops:
        for s in SIZES:
            t = pj.gloo_ring(op, p, s, ALPHA, 1 / BW, kappa, serial)
            if slow and slow[:2] == (op, s):
                t *= slow[2]
            cell = {"time_us": t * 1e6}
            rows.append({"op": op, "size": s, "group_size": p, "in_place": cell, "out_of_place": cell})
    return {"workload": "collectives", "status": "ok", "run_id": f"n{p}", "record_id": f"{p}-{backend}",
            "created": "2026-11-28T10:00:00+0000", "config": {"trial": 0, "fabric": {"name": "emu-100m"}},
            "fabric": {"name": "emu-100m", "backend": backend}, "world": {"world_size": p}, "rows": rows,
            "fingerprint": {"git": {"commit": "c0ffee", "dirty_hash": None}}}


def test_gloo_segments_follow_its_source():
    # all_reduce: roundUp(max(ceil(S / 1 MiB), 2p), p) segments, (p-1) x per-rank iterations a phase
    assert pj.gloo_segments("all_reduce", 8, 1 << 20) == (2, 14, 65536)        # 16 segments of 64 KiB
    assert pj.gloo_segments("all_reduce", 2, 1 << 24) == (2, 8, 1 << 20)       # 16 of the 1 MiB maximum
    assert pj.gloo_segments("all_reduce", 8, 1 << 24) == (2, 14, 1 << 20)      # 16 of 1 MiB, 2 per rank
    assert pj.gloo_segments("all_reduce", 4, 5 << 20) == (2, 6, (5 << 20) / 8)  # ceil 5 -> max(5, 8) = 8
    # all_gather: 2(p-1) iterations of half a rank's chunk, at any size
    assert pj.gloo_segments("all_gather", 8, 1 << 24) == (1, 14, (1 << 24) / 16)


def test_gloo_ring_worked_on_both_sides_of_its_max():
    # latency side: 8 ranks, 1 MiB all_reduce, 14 iterations a phase of 64 KiB segments; b = 65536
    # / 12e6 = 5.461333 ms. Round trips: 7 x (8 + 5.461333) + 5.461333 = 99.690667 ms; the link's
    # bytes: 14 x 5.461333 + 8 = 84.459 ms; the longer, two phases: 199.381 ms (the textbook ring:
    # 14 x 8 + 1048576 x 1.75 / 12e6 = 264.9 ms)
    assert pj.gloo_ring("all_reduce", 8, 1 << 20, ALPHA, 1 / BW) == pytest.approx(0.1993813, abs=1e-6)
    assert pj.model_time("all_reduce", 8, 1 << 20, ALPHA, 1 / BW) == pytest.approx(0.26491, abs=1e-5)
    assert pj.model_time("all_reduce", 8, 1 << 20, ALPHA, 1 / BW, form="gloo") == pj.gloo_ring(
        "all_reduce", 8, 1 << 20, ALPHA, 1 / BW)
    # bandwidth side: 2 ranks, 16 MiB; 8 iterations of 1 MiB, b = 87.381 ms: the link's bytes 8 x
    # 87.381 + 8 = 707.051 ms beat the round trips 4 x 95.381 + 87.381 = 468.9 ms; two phases
    # 1414.101 ms = 2 x 8 ms + 16 MiB / 12 MB/s
    assert pj.gloo_ring("all_reduce", 2, 1 << 24, ALPHA, 1 / BW) == pytest.approx(2 * ALPHA + (1 << 24) / BW)
    # all_gather, 8 ranks, 1 MiB: 14 halves of 64 KiB, one phase: 99.690667 ms
    assert pj.gloo_ring("all_gather", 8, 1 << 20, ALPHA, 1 / BW) == pytest.approx(0.0996907, abs=1e-6)
    # 2 ranks, 1 KiB: both halves of its 512-byte chunk go at once: a round trip and 512 bytes (what
    # the latency floor reads: the call less its bytes is alpha)
    assert pj.gloo_ring("all_gather", 2, 1024, ALPHA, 1 / BW) == pytest.approx(ALPHA + 512 / BW)
    # kappa adds to every iteration's alpha per doubling, as in the ring form
    assert pj.gloo_ring("all_gather", 8, 1 << 20, ALPHA - 2e-3, 1 / BW, 1e-3) == pytest.approx(0.0996907, abs=1e-6)
    # a large call's bus bandwidth approaches B at any scale, as G(p) promises
    big = 1 << 34
    t = pj.gloo_ring("all_reduce", 64, big, ALPHA, 1 / BW)
    assert big / t * pj.terms("all_reduce", 64)[1] == pytest.approx(BW, rel=1e-3)


def test_a_late_rank_at_two_ranks_serializes_the_all_gather_by_one_half_chunk():
    # 2 ranks, 16 MiB: each rank's 8 MiB chunk goes as two 4 MiB halves, b = 4194304 / 12e6 =
    # 349.525 ms. Both directions at once: alpha + 2b = 707.051 ms, the link's bytes. The late rank's
    # announcements behind its own first half: alpha + 3b = 1056.576 ms, 2/3 of the link's rate
    b = (1 << 22) / BW
    assert pj.gloo_ring("all_gather", 2, 1 << 24, ALPHA, 1 / BW) == pytest.approx(0.7070507, abs=1e-6)
    assert pj.gloo_ring("all_gather", 2, 1 << 24, ALPHA, 1 / BW, serial=1.0) == pytest.approx(1.056576, abs=1e-6)
    assert pj.gloo_ring("all_gather", 2, 1 << 24, ALPHA, 1 / BW, serial=0.5) == pytest.approx(ALPHA + 2.5 * b)
    # a late rank costs nothing from 4 ranks (two connections), nor in the all_reduce, which posts
    # each receive before its send
    for op, p in (("all_gather", 4), ("all_gather", 8), ("all_reduce", 2)):
        assert pj.gloo_ring(op, p, 1 << 24, ALPHA, 1 / BW, serial=1.0) == pj.gloo_ring(op, p, 1 << 24, ALPHA, 1 / BW)
    assert pj.model_time("all_gather", 2, 1 << 24, ALPHA, 1 / BW, form="gloo", serial=1.0) == pytest.approx(1.056576,
                                                                                                           abs=1e-6)


def test_the_serialized_share_is_fitted_beside_another_scale(monkeypatch):
    recs = [(Path("/r/2.json"), _rec(2, serial=0.75, ops=("all_gather",))),
            (Path("/r/4.json"), _rec(4, ops=("all_gather",)))]
    c = pj.fit(recs, boot=20)["ops"]["all_gather"]
    lo, hi = c["serial_90"]
    assert c["serial"] == pytest.approx(0.75, abs=1e-3) and lo - 1e-3 <= 0.75 <= hi + 1e-3
    assert c["alpha_s"] == pytest.approx(ALPHA, rel=1e-3) and c["bandwidth_GBps"] == pytest.approx(BW / 1e9, rel=1e-3)
    cal = {"fabric": "f", "pi_level": 0.9, "ops": {"all_gather": c}}
    t8 = pj.gloo_ring("all_gather", 8, 1 << 22, ALPHA, 1 / BW)
    assert pj.project(cal, "all_gather", 8, 1 << 22).time_s == pytest.approx(t8, rel=1e-3)
    # without the term, the 2-rank calls (slower than their bytes) pull B down for every scale
    monkeypatch.setattr(pj.forms, "serial_segments", lambda op, p: 0)
    old = pj.fit(recs, boot=20)["ops"]["all_gather"]
    assert pj.project({**cal, "ops": {"all_gather": old}}, "all_gather", 8, 1 << 22).time_s > 1.02 * t8
    monkeypatch.undo()
    # from one scale the share cannot be told from B: it is SERIAL_UNSEEN there
    one = pj.fit_params("all_gather", [(2, s, pj.gloo_ring("all_gather", 2, s, ALPHA, 1 / BW)) for s in SIZES], "gloo")
    assert one[3] == pj.SERIAL_UNSEEN


def test_a_calibration_written_before_serial_projects_from_three_number_draws():
    cal = pj.fit([(Path(f"/r/{p}.json"), _rec(p, ops=("all_gather",))) for p in (2, 4)], boot=20)
    c = cal["ops"]["all_gather"]
    new = pj.project(cal, "all_gather", 8, 1 << 20)
    for k in ("serial", "serial_90"):
        c.pop(k)
    c["draws"] = [d[:3] for d in c["draws"]]
    old = pj.project(cal, "all_gather", 8, 1 << 20)
    assert old.time_s == pytest.approx(new.time_s, rel=1e-9) and old.high_s == pytest.approx(new.high_s, rel=1e-9)


def test_a_gloo_fabric_is_fitted_in_gloos_form_and_others_in_the_ring_form():
    cal = pj.fit([(Path(f"/r/{p}.json"), _rec(p)) for p in (2, 4)], boot=20)
    for op in ("all_reduce", "all_gather"):
        c = cal["ops"][op]
        assert c["form"] == "gloo" and c["algorithm"].startswith("Gloo ring")
        assert c["alpha_s"] == pytest.approx(ALPHA, rel=1e-4)
        assert c["bandwidth_GBps"] == pytest.approx(BW / 1e9, rel=1e-4)
        assert max(abs(h["log_error"]) for h in c["holdout"]) < 1e-4
        # the projection to 8 ranks is Gloo's schedule there
        assert pj.project(cal, op, 8, 1 << 20).time_s == pytest.approx(pj.gloo_ring(op, 8, 1 << 20, ALPHA, 1 / BW),
                                                                        rel=1e-4)
    nccl = pj.fit([(Path(f"/r/{p}.json"), _rec(p, backend="nccl")) for p in (2, 4)], boot=20)
    assert {c["form"] for c in nccl["ops"].values()} == {"ring"}
    assert pj.form_of([(Path("/r"), _rec(2))], "alltoall") == "ring"


def test_gloos_reduce_scatter_is_an_all_reduce_of_the_whole_buffer():
    # torch's ProcessGroupGloo runs reduce_scatter_tensor as an all_reduce of S, then keeps its chunk.
    # 8 ranks, 1 MiB: Gloo's all_reduce schedule, 199.381 ms (see the worked all_reduce above); the
    # textbook ring reduce-scatter: 7 x 8 ms + 1048576 x 0.875 / 12e6 = 132.459 ms
    t = pj.model_time("reduce_scatter", 8, 1 << 20, ALPHA, 1 / BW, form="gloo")
    assert t == pytest.approx(0.1993813, abs=1e-6) == pj.gloo_ring("all_reduce", 8, 1 << 20, ALPHA, 1 / BW)
    assert pj.model_time("reduce_scatter", 8, 1 << 20, ALPHA, 1 / BW) == pytest.approx(0.1324587, abs=1e-6)
    # 2 ranks, 16 MiB: 2 x 8 ms + 16 MiB / 12 MB/s = 1414.101 ms on the wire, where the ring form
    # says 8 ms + 8 MiB / 12 MB/s = 707.051: twice the bytes (each rank sends 2(p-1)/p S, not (p-1)/p S)
    assert pj.gloo_ring("reduce_scatter", 2, 1 << 24, ALPHA, 1 / BW) == pytest.approx(1.4141013, abs=1e-6)
    assert pj.model_time("reduce_scatter", 2, 1 << 24, ALPHA, 1 / BW) == pytest.approx(0.7070507, abs=1e-6)
    assert pj.gloo_segments("reduce_scatter", 8, 1 << 20) == pj.gloo_segments("all_reduce", 8, 1 << 20)
    assert pj.serial_segments("reduce_scatter", 2) == 0           # the all_reduce posts each receive first
    # fitted on a Gloo fabric in that form, B is the link's (the all_reduce's bus bandwidth), alpha the round trip
    recs = [(Path(f"/r/{p}.json"), _rec(p, ops=("reduce_scatter",))) for p in (2, 4)]
    c = pj.fit(recs, boot=20)["ops"]["reduce_scatter"]
    assert c["form"] == "gloo" and c["algorithm"].startswith("an all_reduce of the whole buffer")
    assert c["alpha_s"] == pytest.approx(ALPHA, rel=1e-4) and c["bandwidth_GBps"] == pytest.approx(BW / 1e9, rel=1e-4)
    # the same times read in the ring form put B near half the link: the fit would miss the truth by ~50%
    ring = pj.fit_params("reduce_scatter", [(x["p"], x["size"], x["time_s"]) for x in c["cells"]], "ring")
    assert 1 / ring[1] < 0.6 * BW
    # the latency floor counts the all_reduce's 2(p-1) steps and 2(p-1)/p bytes: a 1 KiB call of
    # 16.0853 ms at 2 ranks is 2 steps of (16.0853 - 1024 / 12e6 x 1) / 2 = 8.0 ms
    fast = 2 * ALPHA + 1024 / BW
    r = recs[0][1]
    r["rows"][0]["stability"] = {"times_us_by_rank": {"0": [fast * 1e6, 2e6], "1": [fast * 1e6, 2e6]}}
    r["rows"][0]["size"] = 1024
    floor = pj.latency_floor([recs[0]], "reduce_scatter", 1 / BW, "gloo")["2"]
    assert floor["alpha_floor_s"] == pytest.approx(ALPHA) and floor["calls"] == 2


def test_a_gloo_step_refuses_the_list_form_reduce_scatter():
    # ProcessGroupGloo::reduce_scatter (a list of tensors) runs p all_reduces of S/p: not priced
    cal = pj.fit([(Path(f"/r/{p}.json"), _rec(p, ops=("reduce_scatter",))) for p in (2, 4)], boot=20)
    rec = {"workload": "pretrain", "status": "ok", "fabric": {"name": "emu-100m"}, "world": {"world_size": 2},
           "fingerprint": {"git": {"commit": "c0ffee", "dirty_hash": None}},
           "metrics": {"iteration_time(s)": 1.0, "iteration_time_std(s)": 0.0, "comm_share": 0.5, "measured_steps": 4},
           "samples": {"comm_calls": [[["reduce_scatter_tensor", "float32", 1 << 17, 2, 0.1, 0.2]]] * 2}}
    sp = pj.project_step(cal, rec, 4)
    # 512 KiB a rank, S = 1 MiB: its share of the step scales as Gloo's all_reduce of 1 MiB from 2 to 4 ranks
    ratio = pj.gloo_ring("all_reduce", 4, 1 << 20, ALPHA, 1 / BW) / pj.gloo_ring("all_reduce", 2, 1 << 20, ALPHA, 1 / BW)
    assert sp.step_s == pytest.approx(0.5 + 0.5 * ratio, rel=1e-3)
    rec["samples"]["comm_calls"] = [[["reduce_scatter", "float32", 1 << 17, 2, 0.1, 0.2]]]
    with pytest.raises(pj.UsageError, match="list form of reduce_scatter"):
        pj.project_step(cal, rec, 4)


def test_one_stalled_cell_does_not_move_the_gloo_fit():
    # a host stall made one 4 MiB cell at 4 nodes 3x slower: least squares on relative error moves B
    # by 4.3% (alpha by 1.3%), for every size; the robust fit by 0.7% (0.2%)
    recs = [(Path("/r/2.json"), _rec(2)), (Path("/r/4.json"), _rec(4, slow=("all_gather", 1 << 22, 3.0)))]
    c = pj.fit(recs, boot=20)["ops"]["all_gather"]
    assert c["alpha_s"] == pytest.approx(ALPHA, rel=0.005)
    assert c["bandwidth_GBps"] == pytest.approx(BW / 1e9, rel=0.015)
    # the stalled cell still counts where it should: the held-out error, hence the interval's margin
    assert max(abs(h["log_error"]) for h in c["holdout"]) > 1.0


def test_kappa_is_recovered_from_two_scales():
    recs = [(Path(f"/r/{p}.json"), _rec(p, kappa=1e-3, ops=("all_reduce",))) for p in (2, 4, 8)]
    c = pj.fit(recs, boot=20)["ops"]["all_reduce"]
    assert c["kappa_s"] == pytest.approx(1e-3, rel=1e-3) and c["alpha_s"] == pytest.approx(ALPHA, rel=1e-3)


def test_a_calibration_without_a_form_is_the_ring_form():
    c = {"alpha_s": ALPHA, "beta_s_per_byte": 1 / BW, "kappa_s": 0.0}     # written before the form existed
    assert pj.op_time(c, "all_reduce", 8, 1 << 20) == pj.model_time("all_reduce", 8, 1 << 20, ALPHA, 1 / BW)
