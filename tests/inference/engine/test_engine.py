"""The reference engine in one process (TP=1): sharding layout, KV-cache forward against the
plain model, continuous batching, stop rules, sampling, capacity bounds, config checks."""

from __future__ import annotations

import pytest
import torch

from helpers import REPO
from workloads.core.errors import UsageError
from workloads.inference.engine.engine import (
    BlockAllocator,
    EngineSettings,
    RequestError,
    SamplingParams,
    build_engine,
    sample,
)
from workloads.inference.engine.tp import RandomWeights, shard_state_dict
from workloads.models.neox import GPTNeoX
from workloads.testing import parity

CPU = torch.device("cpu")


def engine(residual=True, **kw):
    return build_engine(parity.tiny_config(residual), EngineSettings(**({"max_kv_tokens": 512} | kw)), 0, 1, CPU, seed=7)


def run_all(eng, requests):
    """requests: {name: (prompt, SamplingParams)} submitted together; returns tokens and finish reasons."""
    out, reasons = {}, {}
    for name, (prompt, params) in requests.items():
        out[name] = []

        def emit(tok, reason, name=name):
            if tok is not None:
                out[name].append(tok)
            if reason is not None:
                reasons[name] = reason

        eng.submit(prompt, params, emit)
    for _ in range(1000):
        if not eng.leader_step():
            break
    return out, reasons


def test_qkv_shards_follow_neox_per_head_packing():
    cfg = parity.tiny_config(True)  # 4 heads, hd 16
    torch.manual_seed(0)
    sd = GPTNeoX(cfg).state_dict()
    x = torch.randn(3, cfg.hidden_size)
    w, b = sd["gpt_neox.layers.0.attention.query_key_value.weight"], sd["gpt_neox.layers.0.attention.query_key_value.bias"]
    full = (x @ w.T + b).view(3, 4, 3 * 16)  # (T, nh, 3·hd): per-head q|k|v
    for rank in range(2):
        sh = shard_state_dict(sd, cfg, rank, 2)
        local = (x @ sh["gpt_neox.layers.0.attention.query_key_value.weight"].T
                 + sh["gpt_neox.layers.0.attention.query_key_value.bias"]).view(3, 2, 48)
        torch.testing.assert_close(local, full[:, 2 * rank:2 * rank + 2], rtol=0, atol=1e-6)
    # Row-split dense layers: the partial products of both ranks sum to the full product.
    for name, width in (("attention.dense", cfg.hidden_size), ("mlp.dense_4h_to_h", cfg.ffn_size)):
        y = torch.randn(3, width)
        wfull = sd[f"gpt_neox.layers.1.{name}.weight"]
        parts = []
        for rank in range(2):
            cols = slice(rank * width // 2, (rank + 1) * width // 2)
            parts.append(y[:, cols] @ shard_state_dict(sd, cfg, rank, 2)[f"gpt_neox.layers.1.{name}.weight"].T)
        torch.testing.assert_close(parts[0] + parts[1], y @ wfull.T, rtol=1e-5, atol=1e-5)


def test_tp_degree_must_divide_heads():
    with pytest.raises(UsageError, match="does not divide model.num_attention_heads=4"):
        shard_state_dict({}, parity.tiny_config(True), 0, 3)


@pytest.mark.parametrize("residual", [True, False])
def test_paged_kv_forward_equals_full_model(residual):
    """Prefill of two prompts together, then 15 batched decode steps through the paged
    cache: last-token logits equal the plain model's full recomputation (fp32, atol 1e-5)."""
    eng = engine(residual)
    ref = GPTNeoX(parity.tiny_config(residual)).eval()
    ref.load_state_dict(RandomWeights(parity.tiny_config(residual), 7).state_dict())
    seqs = [[11, 22, 33, 44, 55], [9, 8]]
    tables = [[5, 2], [0, 7]]  # non-contiguous blocks on purpose
    logits = eng.execute([(s, 0, t) for s, t in zip(seqs, tables)])
    for step in range(16):
        with torch.no_grad():
            want = torch.stack([ref(torch.tensor([s]))[0, -1] for s in seqs])
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-5)
        for s, row in zip(seqs, logits):
            s.append(int(row.argmax()))
        logits = eng.execute([([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables)])


def test_joining_mid_decode_matches_solo_runs():
    together = parity.scenario(engine(), new_tokens=10, join_after=3)
    assert [x.shape[0] for x in together["logits"]][:5] == [2, 2, 2, 2, 3]  # C joined at step 5
    for name in "ABC":
        solo = parity.scenario(engine(), new_tokens=10, join_after=3, only=name)
        assert together["tokens"][name] == solo["tokens"][name], name


def test_stop_rules_eos_min_tokens_ignore_eos_max_tokens():
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    free, _ = run_all(engine(), {"a": ([1, 2, 3], greedy)})
    eos = free["a"][3]
    first = free["a"].index(eos)  # EOS fires at its first occurrence
    eng = engine()
    eng.eos = eos
    out, reasons = run_all(eng, {
        "stop": ([1, 2, 3], greedy),
        "ignore": ([1, 2, 3], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)),
    })
    assert out["stop"] == free["a"][:first + 1] and reasons["stop"] == "stop"
    assert out["ignore"] == free["a"] and reasons["ignore"] == "length"
    eng = engine()
    eng.eos = free["a"][0]
    out, reasons = run_all(eng, {"min": ([1, 2, 3], SamplingParams(max_tokens=8, temperature=0.0, min_tokens=3))})
    assert len(out["min"]) >= 3 and out["min"][0] != free["a"][0]  # EOS masked for the first 3 tokens


def test_seeded_sampling_is_reproducible_and_top_p_narrows():
    hot = SamplingParams(max_tokens=12, temperature=1.5, seed=42)
    a, _ = run_all(engine(), {"x": ([4, 5], hot)})
    b, _ = run_all(engine(), {"x": ([4, 5], hot)})
    c, _ = run_all(engine(), {"x": ([4, 5], SamplingParams(max_tokens=12, temperature=1.5, seed=43))})
    assert a == b and a != c
    # softmax([0, 3, 2.9, -5]) = [.026, .512, .463, .0002]: top_p=.9 keeps tokens 1 and 2
    # (.512 < .9, .512+.463 >= .9); top_p=.5 keeps token 1 alone (.512 >= .5).
    logits = torch.tensor([0.0, 3.0, 2.9, -5.0])
    g = torch.Generator().manual_seed(0)
    assert {sample(logits, SamplingParams(1, temperature=1.0, top_p=0.9), g) for _ in range(60)} == {1, 2}
    assert {sample(logits, SamplingParams(1, temperature=1.0, top_p=0.5), g) for _ in range(30)} == {1}
    assert {sample(logits, SamplingParams(1, temperature=1.0), g) for _ in range(200)} >= {0, 1, 2}


def test_batch_and_kv_bounds_queue_and_reject():
    eng = engine(max_batch_size=1)
    order = []
    p = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for name in "ab":
        eng.submit([1, 2], p, lambda tok, reason, name=name: order.append(name) if tok is not None else None)
    while eng.leader_step():
        pass
    assert order == ["a"] * 4 + ["b"] * 4  # b queued until a left the batch

    # 64 KV slots: each request reserves ceil((2+30)/16)=2 blocks of 16, so two fit at once, not three.
    eng = engine(max_kv_tokens=64)
    batches = []
    eng.on_step = lambda info: batches.append(info["batch"])
    p = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    out, _ = run_all(eng, {n: ([1, 2], p) for n in "abc"})
    assert max(batches) == 2 and all(len(v) == 30 for v in out.values())
    with pytest.raises(RequestError, match="whole cache holds server.max_kv_tokens=64"):
        eng.submit([1] * 40, SamplingParams(max_tokens=40), lambda *a: None)
    with pytest.raises(RequestError, match="maximum context length is 256"):
        eng.submit([1] * 200, SamplingParams(max_tokens=100), lambda *a: None)
    assert len(eng.allocator.free) == 4  # every block came back


def test_block_allocator_refuses_beyond_capacity():
    a = BlockAllocator(3)
    got = a.take(2)
    assert a.take(2) is None and sorted(got + a.take(1)) == [0, 1, 2]


def test_serve_config_composes_and_validates():
    from hydra import compose, initialize_config_dir

    from workloads.inference.engine.run import validate

    conf = str(REPO / "conf")
    with initialize_config_dir(config_dir=conf, version_base="1.3"):
        cfg = compose(config_name="serve", overrides=["server.tp=2"])
        plan = validate(cfg, world=2)
        assert plan.model_name == "neox-tiny" and plan.settings.max_batch_size == 8
        with pytest.raises(UsageError, match="server.tp=2 but 1 rank"):
            validate(cfg, world=1)
        bad = compose(config_name="serve", overrides=["server.max_kv_tokens=0"])
        with pytest.raises(UsageError, match="server.max_kv_tokens must be a positive"):
            validate(bad, world=1)
        bad = compose(config_name="serve", overrides=["server.checkpoint=/nonexistent/pythia"])
        with pytest.raises(UsageError, match="does not exist"):
            validate(bad, world=1)


def test_hf_checkpoint_is_sharded_on_load_and_matches_transformers(tmp_path):
    """A checkpoint in HF's on-disk format (safetensors), read slice by slice: prefill
    logits and greedy tokens equal transformers' own GPTNeoXForCausalLM (fp32, atol 1e-4)."""
    from transformers import AutoModelForCausalLM

    from workloads.models.hf import save_hf

    cfg = parity.tiny_config(True)
    ours = GPTNeoX(cfg)
    ours.load_state_dict(RandomWeights(cfg, 99).state_dict())
    save_hf(ours, tmp_path)
    from workloads.models.hf import load_hf_config

    eng = build_engine(load_hf_config(tmp_path), EngineSettings(max_kv_tokens=512), 0, 1, CPU, seed=0,
                       checkpoint=str(tmp_path))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    prompt = [3, 14, 15, 92, 65]
    with torch.no_grad():
        want = hf(torch.tensor([prompt])).logits[0, -1]
        gen = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long), max_new_tokens=12,
                          min_new_tokens=12, do_sample=False, pad_token_id=0)[0, 5:].tolist()
    torch.testing.assert_close(eng.execute([(prompt, 0, [0])]), want[None], rtol=0, atol=1e-4)
    eng2 = build_engine(load_hf_config(tmp_path), EngineSettings(max_kv_tokens=512), 0, 1, CPU, seed=0,
                        checkpoint=str(tmp_path))
    out, _ = run_all(eng2, {"x": (prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))})
    assert out["x"] == gen
    # The TP=2 shards read lazily equal slices of the full tensors.
    from workloads.inference.engine.tp import CheckpointWeights, shard_slice

    src = CheckpointWeights(str(tmp_path))
    sd = ours.state_dict()
    for name in ("gpt_neox.layers.0.attention.query_key_value.weight", "gpt_neox.layers.1.mlp.dense_4h_to_h.weight",
                 "gpt_neox.layers.1.attention.dense.weight", "embed_out.weight"):
        full = shard_state_dict({name: sd[name]}, cfg, 1, 2)[name]
        assert torch.equal(src.get(name, shard_slice(name, cfg, 1, 2)), full), name


@pytest.mark.slow
def test_reference_server_warms_up_before_check_transport(tmp_path):
    """run_server itself, in its own one-rank process (Gloo, a real tiny engine): when it reads
    the transport, the tiny and the multi-MB all_reduce have run. A spy stands where NCCL's log
    would be read and stops the server there (it would serve forever)."""
    import subprocess
    import sys

    from helpers import REPO, child_env

    script = f"""
import sys, torch.distributed as dist
from workloads import CONF_DIR
from workloads.core import config, rundir
from workloads.inference.engine import run
sizes, real = [], dist.all_reduce
dist.all_reduce = lambda t, **kw: (sizes.append(t.numel()), real(t, **kw))[1]
def spy(fabric, run_dir, info):
    print("AT CHECK", sizes, flush=True)
    raise SystemExit(0)
run.check_transport = spy
rundir.register_resolvers()
cfg = config.compose(CONF_DIR, ["model=neox-tiny", "fabric=loopback", "output_root={tmp_path}"], "serve")
run.run_server(cfg)
"""
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=child_env(), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "AT CHECK [1, 1048576]" in r.stdout, r.stdout[-2000:]
