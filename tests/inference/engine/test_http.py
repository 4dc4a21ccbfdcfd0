"""The HTTP layer with text: an in-process TP=1 server (real socket, real aiohttp) and a
word-level tokenizer built here (no download). Text prompts, chat streaming deltas,
incremental detokenization, usage counts."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
import torch

WORDS = "the a fabric network packet switch link fast slow cluster node rank token hello there user assistant".split()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<unk>": 1, ":": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    # Every id the random model can emit (< 1000) decodes to some word.
    vocab |= {f"w{i}": i for i in range(len(vocab), 1000)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    d = tmp_path_factory.mktemp("tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>").save_pretrained(d)
    return AutoTokenizer.from_pretrained(str(d), local_files_only=True)


@pytest.fixture(scope="module")
def server(tokenizer):
    from workloads.inference.engine.engine import EngineSettings, build_engine
    from workloads.inference.engine.server import Server, serve
    from workloads.testing import parity

    engine = build_engine(parity.tiny_config(True), EngineSettings(max_kv_tokens=1024), 0, 1, torch.device("cpu"),
                          seed=3, eos_token_id=None)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    leader = threading.Thread(target=engine.run_leader, daemon=True)
    leader.start()
    srv = threading.Thread(target=loop.run_until_complete,
                           args=(serve(Server(engine, "tiny-text", tokenizer), "127.0.0.1", port, stop),), daemon=True)
    srv.start()
    import time
    import urllib.request

    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            break
        except OSError:
            time.sleep(0.1)
    yield {"url": f"http://127.0.0.1:{port}", "engine": engine}
    loop.call_soon_threadsafe(stop.set)
    srv.join(30)
    engine.request_stop()
    leader.join(30)


async def _post(url, body):
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body) as r:
            if not body.get("stream"):
                return r.status, await r.json()
            chunks = []
            async for line in r.content:
                line = line.strip()
                if line and line != b"data: [DONE]":
                    chunks.append(json.loads(line[6:]))
            return r.status, chunks


def test_text_completion_detokenizes_and_counts(server, tokenizer):
    prompt = "the fabric link is fast"
    status, body = asyncio.run(_post(server["url"] + "/v1/completions",
                                     {"prompt": prompt, "max_tokens": 6, "temperature": 0}))
    assert status == 200
    n_prompt = len(tokenizer.encode(prompt))
    assert body["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 6, "total_tokens": n_prompt + 6}
    status, chunks = asyncio.run(_post(server["url"] + "/v1/completions",
                                       {"prompt": prompt, "max_tokens": 6, "temperature": 0, "stream": True}))
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == body["choices"][0]["text"] and len(streamed.split()) == 6


def test_chat_stream_role_then_content_deltas_then_usage(server, tokenizer):
    messages = [{"role": "user", "content": "hello there"}]
    status, chunks = asyncio.run(_post(server["url"] + "/v1/chat/completions", {
        "messages": messages, "max_tokens": 5, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}))
    assert status == 200 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    body = chunks[1:-1]
    assert all(set(c["choices"][0]["delta"]) <= {"content"} for c in body)
    assert body[-1]["choices"][0]["finish_reason"] == "length"
    # No chat template in this tokenizer: the plain transcript "user: hello there\nassistant:".
    n_prompt = len(tokenizer.encode("user: hello there\nassistant:"))
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == n_prompt
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    status, whole = asyncio.run(_post(server["url"] + "/v1/chat/completions",
                                      {"messages": messages, "max_tokens": 5, "temperature": 0}))
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    assert whole["choices"][0]["message"]["content"] == "".join(c["choices"][0]["delta"].get("content", "")
                                                                for c in body)


def test_bad_chat_and_sampling_fields_are_openai_errors(server):
    for body, param in (({"messages": "hi"}, "messages"),
                        ({"messages": [{"role": "user", "content": "a"}], "temperature": "hot"}, "temperature"),
                        ({"messages": [{"role": "user", "content": "a"}], "n": 2}, "n")):
        status, err = asyncio.run(_post(server["url"] + "/v1/chat/completions", body))
        assert status == 400 and err["error"]["param"] == param and err["error"]["type"] == "invalid_request_error"
    assert server["engine"].alive
