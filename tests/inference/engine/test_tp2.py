"""Tensor parallelism over real processes: two torchrun launches in this file.

1. `workloads.testing.parity` at TP=2 (Gloo) against the same scenario at TP=1 in this
   process: every step's logits (prefill, mixed prefill+decode, decode) and the greedy tokens.
2. One TP=2 server (launch/serve.py under torchrun, real HTTP), shared by the tests below
   and shut down by SIGTERM in the last one (tests run in file order).
Reference token streams come from the TP=1 engine in this process (same seed, same model).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import REPO, wait_healthy
from workloads.core.ports import free_port

TP_ATOL = 1e-5  # fp32; TP changes only the summation order of the two all_reduces per layer

pytestmark = pytest.mark.slow


def _env():
    return os.environ | {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def test_tp2_logits_equal_tp1_every_step(tmp_path):
    from workloads.inference.engine.engine import EngineSettings, build_engine
    from workloads.testing import parity

    out = tmp_path / "tp2.pt"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "workloads.testing.parity", "--out", str(out)],
        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tp2 = torch.load(out)
    for key, residual in (("parallel", True), ("sequential", False)):
        eng = build_engine(parity.tiny_config(residual), EngineSettings(max_kv_tokens=512), 0, 1,
                           torch.device("cpu"), seed=1234)
        tp1 = parity.scenario(eng, new_tokens=12, join_after=3)
        assert len(tp2[key]["logits"]) == len(tp1["logits"]) == 16
        for step, (a, b) in enumerate(zip(tp1["logits"], tp2[key]["logits"])):
            torch.testing.assert_close(b, a, rtol=0, atol=TP_ATOL, msg=lambda m: f"{key} step {step}: {m}")
        assert tp2[key]["tokens"] == tp1["tokens"]


# ---- the TP=2 server -------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@pytest.fixture(scope="module")
def server(tmp_path_factory):

    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "launch/serve.py",
           "model=neox-tiny", "fabric=loopback", "server.host=127.0.0.1", f"server.port={port}",
           f"output_root={log.parent}"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log, "server", 240, 1)
    yield {"url": url, "proc": proc, "log": log}
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def reference():
    """Greedy tokens of the same random neox-tiny (seed 1234) on one rank, in this process."""
    from hydra import compose, initialize_config_dir

    from workloads.inference.engine.engine import (
        EngineSettings,
        SamplingParams,
        build_engine,
    )
    from workloads.inference.engine.run import validate

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        plan = validate(compose(config_name="serve"), world=1)
    eng = build_engine(plan.model, EngineSettings(max_kv_tokens=1024), 0, 1, torch.device("cpu"), seed=1234)

    def solo(prompt: list[int], n: int) -> list[int]:
        got = []
        eng.submit(prompt, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                   lambda tok, reason: got.append(tok) if tok is not None else None)
        while eng.leader_step():
            pass
        return got

    return solo


async def _stream(session, url, body, on_chunk=None, stop_after=None):
    """POST a streaming request; returns (parsed chunks, raw text). `stop_after`: drop the
    connection after that many chunks (a client going away)."""
    chunks, raw, done = [], "", False
    async with session.post(url, json=body | {"stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        async for line in resp.content:
            raw += line.decode()
            line = line.strip()
            if not line:
                continue
            assert not done, f"data after [DONE]: {line}"
            assert line.startswith(b"data: "), line
            payload = line[len(b"data: "):]
            if payload == b"[DONE]":
                done = True
                continue
            chunks.append(json.loads(payload))
            if on_chunk:
                await on_chunk(len(chunks))
            if stop_after and len(chunks) >= stop_after:
                resp.close()
                return chunks, raw
    assert done, "stream ended without data: [DONE]"
    return chunks, raw


def _ids(text: str) -> list[int]:
    """Without a tokenizer each token is rendered `[id]`."""
    return [int(t) for t in text.strip("[]").split("][")] if text else []


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 240))


def test_health_and_models(server):
    import urllib.request

    with urllib.request.urlopen(server["url"] + "/v1/models", timeout=10) as r:
        models = json.load(r)
    assert [m["id"] for m in models["data"]] == ["neox-tiny"] and models["object"] == "list"


def test_streaming_format_usage_and_tp2_equals_tp1(server, reference):
    import aiohttp

    prompt = [17, 42, 99, 3]

    async def go():
        async with aiohttp.ClientSession() as s:
            url = server["url"] + "/v1/completions"
            body = {"model": "neox-tiny", "prompt": prompt, "max_tokens": 7, "temperature": 0, "ignore_eos": True,
                    "stream_options": {"include_usage": True}}
            chunks, raw = await _stream(s, url, body)
            async with s.post(url, json=body) as r:
                whole = await r.json()
            async with s.post(server["url"] + "/v1/chat/completions",
                              json={"messages": [{"role": "user", "content": "hi"}]}) as r:
                chat_err = (r.status, await r.json())
            return chunks, raw, whole, chat_err

    chunks, raw, whole, chat_err = _run(go())
    assert raw.endswith("data: [DONE]\n\n") and raw.count("\n\n") == len(chunks) + 1
    content, usage = chunks[:-1], chunks[-1]
    assert all(c["object"] == "text_completion" and c["model"] == "neox-tiny" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 6 + ["length"]
    assert all(c["usage"] is None for c in content)
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    tokens = [t for c in content for t in _ids(c["choices"][0]["text"])]
    assert tokens == reference(prompt, 7)  # TP=2 over HTTP == TP=1 in process, greedy
    assert whole["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in content)
    assert whole["usage"]["completion_tokens"] == 7 and whole["object"] == "text_completion"
    assert chat_err[0] == 400 and "tokenizer" in chat_err[1]["error"]["message"]


def test_request_joining_mid_decode_streams_its_solo_tokens(server, reference):
    import aiohttp

    a_prompt, b_prompt = [5, 6, 7, 8, 9], [300, 200, 100]
    b_done_at = {}

    async def go():
        async with aiohttp.ClientSession() as s:
            url = server["url"] + "/v1/completions"
            b_task = None

            async def on_a(n):
                nonlocal b_task
                if n == 3:  # A is decoding: B arrives now
                    b_task = asyncio.create_task(_stream(s, url, b_body))
                if b_task is not None and b_task.done() and "a" not in b_done_at:
                    b_done_at["a"] = n

            b_body = {"prompt": b_prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
            a, _ = await _stream(s, url, {"prompt": a_prompt, "max_tokens": 120, "temperature": 0,
                                          "ignore_eos": True}, on_chunk=on_a)
            b, _ = await b_task
            return a, b

    a, b = _run(go())
    assert "a" in b_done_at and b_done_at["a"] < 120, "B should finish while A is still streaming"
    assert [t for c in a for t in _ids(c["choices"][0]["text"])] == reference(a_prompt, 120)
    assert [t for c in b for t in _ids(c["choices"][0]["text"])] == reference(b_prompt, 10)


def test_bad_requests_and_a_vanishing_client_leave_others_untouched(server, reference):
    import aiohttp

    a_prompt = [1, 2, 3]
    results = {}

    async def go():
        async with aiohttp.ClientSession() as s:
            url = server["url"] + "/v1/completions"

            async def disturb(n):
                if n != 2:
                    return
                async with s.post(url, data=b"{not json") as r:
                    results["malformed"] = (r.status, await r.json())
                async with s.post(url, json={"prompt": list(range(250)), "max_tokens": 50}) as r:
                    results["too_long"] = (r.status, await r.json())
                async with s.post(url, json={"prompt": [1], "model": "gpt-9"}) as r:
                    results["model"] = (r.status, await r.json())
                async with s.post(url, json={"prompt": [1], "max_tokens": -1}) as r:
                    results["negative"] = (r.status, await r.json())
                results["dropped"], _ = await _stream(s, url, {"prompt": [7, 7], "max_tokens": 100,
                                                               "ignore_eos": True}, stop_after=2)

            a, _ = await _stream(s, url, {"prompt": a_prompt, "max_tokens": 60, "temperature": 0,
                                          "ignore_eos": True}, on_chunk=disturb)
            after, _ = await _stream(s, url, {"prompt": a_prompt, "max_tokens": 5, "temperature": 0,
                                              "ignore_eos": True})
            async with s.get(server["url"] + "/health") as r:
                health = r.status
            return a, after, health

    a, after, health = _run(go())
    for key, status in (("malformed", 400), ("too_long", 400), ("model", 404), ("negative", 400)):
        code, body = results[key]
        assert code == status and set(body["error"]) == {"message", "type", "param", "code"}, (key, body)
    assert "maximum context length is 256" in results["too_long"][1]["error"]["message"]
    assert len(results["dropped"]) == 2
    want = reference(a_prompt, 60)
    assert [t for c in a for t in _ids(c["choices"][0]["text"])] == want
    assert [t for c in after for t in _ids(c["choices"][0]["text"])] == want[:5]
    assert health == 200


def test_sigterm_stops_every_rank(server):
    proc = server["proc"]
    ranks = _children(proc.pid)
    assert len(ranks) == 2
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    deadline = time.time() + 30
    while any(Path(f"/proc/{r}").exists() and "zombie" not in Path(f"/proc/{r}/status").read_text()
              for r in ranks) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(Path(f"/proc/{r}").exists() for r in ranks), "a rank outlived torchrun"
    log = server["log"].read_text()
    assert "server stopped" in log and "Traceback (most recent call last)" not in log.split("server stopped")[0]
