"""Pure pieces of the load generator, pinned by hand-computed values: metrics (docs/metrics.md
"Inference", vLLM's field names), arrival processes, datasets and their bad input."""

import json
import math

import numpy as np
import pytest

from workloads.core.errors import UsageError
from workloads.inference.loadgen.arrivals import Arrival
from workloads.inference.loadgen.client import RequestResult
from workloads.inference.loadgen.datasets import (
    PromptPlan,
    RandomDataset,
    ShareGPTDataset,
    build_dataset,
    load_tokenizer,
    prompt_key,
)
from workloads.inference.loadgen.point import planned_requests
from workloads.inference.metrics import parse_slo, summarize


def _r(ttft, latency, out, itl, prompt):
    return RequestResult(ok=True, ttft=ttft, latency=latency, output_tokens=out, itl=itl, prompt_len=prompt)


RESULTS = [
    _r(0.1, 0.5, 5, [0.1] * 4, 10),
    _r(0.2, 0.4, 3, [0.1] * 2, 20),
    _r(0.3, 0.3, 1, [], 30),          # one token: no TPOT, no ITL
    RequestResult(ok=False, error="HTTP 500 from x: boom", prompt_len=40),
]


def test_summary_by_hand():
    m = summarize(RESULTS, duration_s=2.0)
    ap = pytest.approx
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["errors"] == ["1x HTTP 500 from x: boom"]
    assert (m["total_input_tokens"], m["total_output_tokens"]) == (60, 9)  # failed prompts not counted
    assert m["request_throughput"] == ap(1.5) and m["output_throughput"] == ap(4.5)
    assert m["input_throughput"] == ap(30.0) and m["total_token_throughput"] == ap(34.5)
    # TTFT [100, 200, 300] ms: population std = sqrt(20000/3); p90 at rank 1.8 -> 280.
    assert m["mean_ttft_ms"] == ap(200) and m["median_ttft_ms"] == ap(200)
    assert m["std_ttft_ms"] == ap(math.sqrt(20000 / 3)) and m["p90_ttft_ms"] == ap(280)
    assert m["p95_ttft_ms"] == ap(290) and m["p99_ttft_ms"] == ap(298)
    # TPOT: (0.5-0.1)/4 and (0.4-0.2)/2, both 100 ms; the 1-token request has none.
    assert m["mean_tpot_ms"] == ap(100) and m["std_tpot_ms"] == ap(0, abs=1e-9)
    assert m["mean_itl_ms"] == ap(100) and m["p99_itl_ms"] == ap(100)
    assert m["mean_e2el_ms"] == ap(400) and m["median_e2el_ms"] == ap(400)
    assert m["request_goodput"] is None


def test_goodput_counts_requests_meeting_every_slo():
    # ttft<=250 and tpot<=100: requests 1 and 2 (the third has TTFT 300) -> 2 / 2 s.
    assert summarize(RESULTS, 2.0, parse_slo("ttft:250 tpot:100"))["request_goodput"] == pytest.approx(1.0)
    # Add e2e<=450: request 1 (500 ms) fails too.
    assert summarize(RESULTS, 2.0, parse_slo("ttft:250 tpot:100 e2e:450"))["request_goodput"] == pytest.approx(0.5)
    assert parse_slo("ttft:1,e2el:2") == {"ttft": 1.0, "e2el": 2.0}
    for bad in ("ttft=5", "latency:3", "ttft:abc", "tpot:-1"):
        with pytest.raises(UsageError, match="load.slo"):
            parse_slo(bad)


def test_no_completed_request_gives_nulls_not_a_crash():
    m = summarize(RESULTS[3:], 1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] is None and m["request_throughput"] == 0


def test_gamma_arrivals_have_vllm_burstiness():
    n = 40000
    for kind, b, cv2 in (("poisson", 1.0, 1.0), ("gamma", 0.25, 4.0), ("gamma", 4.0, 0.25)):
        t = Arrival(kind, rate=50.0, burstiness=b).offsets(n, seed=1)
        gaps = np.diff(t)
        assert t[0] == 0 and np.all(gaps >= 0)
        assert gaps.mean() == pytest.approx(1 / 50, rel=0.03)            # rate is kept
        assert gaps.var() / gaps.mean() ** 2 == pytest.approx(cv2, rel=0.1)  # CV^2 = 1/shape
    assert np.all(Arrival("burst").offsets(5) == 0)
    assert Arrival("closed", concurrency=4).label() == "c4"
    with pytest.raises(UsageError, match="positive request rate"):
        Arrival("poisson", rate=0)
    with pytest.raises(UsageError, match="use one of"):
        Arrival("uniform", rate=1)
    with pytest.raises(UsageError, match="positive concurrency"):
        Arrival("closed")


def test_random_dataset_range_ratio_is_sglangs():
    specs = RandomDataset(3000, input_len=100, output_len=10, range_ratio=0.5, vocab_size=50, seed=3).load(None)
    ins = {s.prompt_len for s in specs}
    outs = {s.output_len for s in specs}
    assert ins == set(range(50, 101)) and outs == set(range(5, 11))  # uniform on [L*r, L], ends included
    assert all(len(s.prompt) == s.prompt_len and max(s.prompt) < 50 for s in specs[:50])
    exact = RandomDataset(10, 32, 8, 1.0).load(None)
    assert {(s.prompt_len, s.output_len) for s in exact} == {(32, 8)}
    with pytest.raises(UsageError, match="range_ratio"):
        RandomDataset(1, 8, 8, 1.5).load(None)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """A real Hugging Face tokenizer (word level, 100 words), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0} | {f"w{i}": i + 1 for i in range(100)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    d = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(d)
    return str(d)


def test_sharegpt_and_tokenizer(tokenizer_dir, tmp_path):
    tok = load_tokenizer(tokenizer_dir)
    words = lambda n: " ".join(f"w{i}" for i in range(n))  # noqa: E731
    data = [
        {"conversations": [{"from": "human", "value": words(5)}, {"from": "gpt", "value": words(6)}]},
        {"conversations": [{"from": "human", "value": words(2)}, {"from": "gpt", "value": words(9)}]},  # too short
        {"id": "no conversations"},
    ]
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(data))
    specs = ShareGPTDataset(str(f), num_prompts=10).load(tok)
    assert [(s.prompt, s.prompt_len, s.output_len) for s in specs] == [(words(5), 5, 6)]
    assert ShareGPTDataset(str(f), 10, output_len=7).load(tok)[0].output_len == 7
    # Random text prompts are decoded, then measured with the tokenizer.
    rs = RandomDataset(5, 12, 3).load(tok)
    assert all(isinstance(s.prompt, str) and s.prompt_len == len(tok.encode(s.prompt, add_special_tokens=False)) for s in rs)


def test_dataset_bad_input(tmp_path, tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    with pytest.raises(UsageError, match="is not a file"):
        ShareGPTDataset(str(tmp_path / "missing.json"), 1).load(tok)
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(UsageError, match="not valid JSON"):
        ShareGPTDataset(str(tmp_path / "bad.json"), 1).load(tok)
    (tmp_path / "obj.json").write_text('{"a": 1}')
    with pytest.raises(UsageError, match="list of"):
        ShareGPTDataset(str(tmp_path / "obj.json"), 1).load(tok)
    with pytest.raises(UsageError, match="needs load.tokenizer"):
        ShareGPTDataset(str(tmp_path / "obj.json"), 1).load(None)
    with pytest.raises(UsageError, match="does not exist"):
        load_tokenizer(str(tmp_path / "no-tokenizer"))
    with pytest.raises(UsageError, match="not a loadable tokenizer"):
        load_tokenizer(str(tmp_path))
    with pytest.raises(UsageError, match="dataset.kind"):
        build_dataset({"kind": "sonnet"}, 1, 10, 0)


def _keys(specs):
    return [prompt_key(s.prompt) for s in specs]


def test_prompt_plan_random_never_resends_a_prompt():
    # vocab 3, 2-token prompts: only 9 possible; 3 points x (2 warm-up + 2 measured) = 12
    # requests cannot all differ. The first 9 do (redrawn), the rest are counted repeats.
    tiny = PromptPlan({"kind": "random", "input_len": 2, "output_len": 1}, None, 3, 0, 2, [2, 2, 2], warn=None)
    pts = [tiny.point(k) for k in range(3)]
    every = [key for p in pts for key in _keys(p.warmup) + _keys(p.measured)]
    assert len(set(every)) == 9
    assert sum(p.info["prompts_seen_before"] + p.info["warmup_seen_before"] for p in pts) == 12 - 9
    assert pts[2].info["repeats_across_points"] is True and pts[0].info["repeats_across_points"] is False
    # A realistic size: all 3 x (4 + 50) distinct; each point's seeds are its own, and a point's
    # prompts do not depend on which points were built (a resumed sweep gets the same ones).
    cfg = {"kind": "random", "input_len": 8, "output_len": 4, "range_ratio": 0.5}
    plan = PromptPlan(cfg, None, 1000, 7, 4, [50, 50, 50], warn=None)
    pts = [plan.point(k) for k in range(3)]
    every = [key for p in pts for key in _keys(p.warmup) + _keys(p.measured)]
    assert len(every) == 3 * 54 and len(set(every)) == len(every)
    assert [p.info["seed"] for p in pts] == [[7, 1], [7, 3], [7, 5]] and pts[1].info["warmup_seed"] == [7, 2]
    assert all(p.info["prompts_unique"] == 50 and p.info["prompts_seen_before"] == 0 for p in pts)
    assert _keys(PromptPlan(cfg, None, 1000, 7, 4, [50, 50, 50, 50], warn=None).point(2).measured) == _keys(pts[2].measured)
    assert all(len(s.prompt) == s.prompt_len and 4 <= s.prompt_len <= 8 for p in pts for s in p.measured)


def test_prompt_plan_sharegpt_deals_disjoint_points(tokenizer_dir, tmp_path):
    tok = load_tokenizer(tokenizer_dir)
    convs = [{"conversations": [{"from": "human", "value": " ".join(f"w{(i + j) % 100}" for j in range(5 + i % 7))},
                                {"from": "gpt", "value": "w1 w2 w3 w4 w5"}]} for i in range(40)]
    convs.append(convs[0])  # a repeated first turn is kept once
    f = tmp_path / "sg.json"
    f.write_text(json.dumps(convs))
    cfg = {"kind": "sharegpt", "path": str(f), "output_len": 4}
    warned = []
    plan = PromptPlan(cfg, tok, 1000, 0, 2, [10, 10, 10], warn=warned.append)  # needs 36 of 40
    pts = [plan.point(k) for k in range(3)]
    every = [key for p in pts for key in _keys(p.warmup) + _keys(p.measured)]
    assert len(every) == 36 and len(set(every)) == 36 and not warned
    assert all(p.info["repeats_across_points"] is False and p.info["prompts_seen_before"] == 0 for p in pts)
    # 3 x (2 + 20) = 66 > 40: warned and recorded; within a point warm-up and measured still
    # differ, and each point's 20 measured prompts are distinct (none repeats within it).
    plan = PromptPlan(cfg, tok, 1000, 0, 2, [20, 20, 20], warn=warned.append)
    pts = [plan.point(k) for k in range(3)]
    assert len(warned) == 1 and "repeat across points" in warned[0] and "flush_cache_path" in warned[0]
    for p in pts:
        assert len(set(_keys(p.measured))) == 20 and not set(_keys(p.warmup)) & set(_keys(p.measured))
        assert p.info["repeats_across_points"] is True and p.info["file_prompts"] == 40
    assert [p.info["prompts_seen_before"] for p in pts] == [0, 4, 20]
    # More measured requests than the file holds: the point gets every prompt but its warm-up's.
    assert len(PromptPlan(cfg, tok, 1000, 0, 2, [100], warn=warned.append).point(0).measured) == 38
    with pytest.raises(UsageError, match="load.warmup_requests=40"):
        PromptPlan(cfg, tok, 1000, 0, 40, [1], warn=None)


def test_requests_per_point_are_planned_from_the_arrival():
    assert planned_requests(Arrival("closed", concurrency=4), 256, None) == 256
    assert planned_requests(Arrival("poisson", rate=10.0), None, 60.0) == 60 * 10 * 1.5 + 100
    assert planned_requests(Arrival("closed", concurrency=4), None, 60.0) == 1000
