"""The P/D proxy (workloads/inference/pd/proxy.py) between two real HTTP servers standing in for
a prefill and a decode instance (aiohttp on free ports; no vLLM): what each leg receives, that
the decode leg gets the prefill's kv_transfer_params, that the SSE stream is relayed byte for
byte, that an error of the prefill leg reaches the client as it was given, and /health."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web

from workloads.core.ports import free_port
from workloads.inference.pd.proxy import Proxy

KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2]], "remote_engine_id": "e1",
      "remote_host": "127.0.0.1", "remote_port": 5600, "remote_num_tokens": 130}
SSE = [b'data: {"choices":[{"text":" w1"}]}\n\n', b'data: {"choices":[{"text":" w2"}]}\n\n', b"data: [DONE]\n\n"]


class Instances:
    """A prefill and a decode stand-in that keep what they were sent."""

    def __init__(self, prefill_status: int = 200):
        self.seen: dict[str, list] = {"prefill": [], "decode": []}
        self.prefill_status = prefill_status
        self.closed_early = 0

    async def prefill(self, request: web.Request) -> web.Response:
        self.seen["prefill"].append((request.headers.copy(), await request.json()))
        if self.prefill_status != 200:
            return web.json_response({"error": {"message": "prefill said no"}}, status=self.prefill_status)
        return web.json_response({"choices": [{"text": " w9"}], "kv_transfer_params": KV})

    async def decode(self, request: web.Request) -> web.StreamResponse:
        self.seen["decode"].append((request.headers.copy(), await request.json()))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for chunk in SSE:
                await resp.write(chunk)
                await asyncio.sleep(0.05)
            await resp.write_eof()
        except ConnectionResetError:
            self.closed_early += 1  # the proxy closed the decode stream: vLLM would abort the request
        return resp


async def _ok(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def _exchange(inst: Instances, body: dict, tmp_path, health: bool = False, leave_early: bool = False):
    runners = []
    urls = {}
    for role, handler in (("prefill", inst.prefill), ("decode", inst.decode)):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_get("/health", _ok)
        runner, urls[role] = await _serve(app)
        runners.append(runner)
    proxy_runner, proxy = await _serve(Proxy(urls["prefill"], urls["decode"], str(tmp_path / "legs.jsonl")).app())
    runners.append(proxy_runner)
    try:
        async with aiohttp.ClientSession() as s:
            if health:
                async with s.get(proxy + "/health") as r:
                    up = r.status
                await runners[1].cleanup()  # the decode instance goes away
                async with s.get(proxy + "/health") as r:
                    return up, r.status, await r.text()
            if leave_early:  # read one chunk and go; the next request must still be served whole
                async with s.post(proxy + "/v1/completions", json=body) as r:
                    await r.content.readany()
                    r.close()
                await asyncio.sleep(0.1)
            async with s.post(proxy + "/v1/completions", json=body) as r:
                return r.status, r.content_type, await r.read()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


BODY = {"model": "tiny", "prompt": "a b c", "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}


def test_prefill_then_decode_with_the_kv_params(tmp_path):
    inst = Instances()
    t0 = time.perf_counter()
    status, ctype, raw = asyncio.run(_exchange(inst, BODY, tmp_path))
    elapsed = time.perf_counter() - t0
    assert status == 200 and ctype == "text/event-stream"
    assert raw == b"".join(SSE)  # relayed byte for byte
    (ph, pb), = inst.seen["prefill"]
    (dh, db), = inst.seen["decode"]
    # prefill: one token, not streamed, asking the instance to keep the KV for a remote decode
    assert pb["max_tokens"] == 1 and pb["stream"] is False and "stream_options" not in pb
    assert pb["kv_transfer_params"]["do_remote_decode"] is True and pb["prompt"] == "a b c"
    # decode: the client's own request plus what the prefill returned
    assert db == BODY | {"kv_transfer_params": KV}
    assert ph["X-Request-Id"] == dh["X-Request-Id"]  # one id for both legs
    (leg,) = [json.loads(x) for x in (tmp_path / "legs.jsonl").read_text().splitlines()]
    assert leg["remote_blocks"] == 2 and leg["remote_num_tokens"] == 130 and leg["prefill_s"] > 0
    # the decode leg to its first chunk: the stand-in sleeps 50 ms after each of its 3 chunks, so
    # the first byte comes at least 100 ms before the exchange ends
    assert 0 < leg["decode_first_s"] <= elapsed - 0.1, (leg, elapsed)


def test_max_completion_tokens_is_capped_too(tmp_path):
    inst = Instances()
    asyncio.run(_exchange(inst, BODY | {"max_completion_tokens": 8}, tmp_path))
    assert inst.seen["prefill"][0][1]["max_completion_tokens"] == 1
    assert inst.seen["decode"][0][1]["max_completion_tokens"] == 8


def test_a_prefill_error_reaches_the_client_and_decode_is_not_asked(tmp_path):
    inst = Instances(prefill_status=500)
    status, _, raw = asyncio.run(_exchange(inst, BODY, tmp_path))
    assert status == 500 and b"prefill said no" in raw
    assert inst.seen["decode"] == []


def test_a_client_that_leaves_mid_stream(tmp_path, caplog):
    inst = Instances()
    status, _, raw = asyncio.run(_exchange(inst, BODY, tmp_path, leave_early=True))
    assert status == 200 and raw == b"".join(SSE) and len(inst.seen["decode"]) == 2
    assert inst.closed_early == 1
    # the departure is not an error of the proxy (aiohttp logs a handler's exception as one)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def test_health_needs_both_instances(tmp_path):
    up, down, why = asyncio.run(_exchange(Instances(), BODY, tmp_path, health=True))
    assert up == 200 and down == 503 and "/health" in why


@pytest.mark.parametrize("ids,n", [([[1, 2], [3]], 3), ([4, 5], 2), (None, 0)])
def test_block_count(ids, n):
    from workloads.inference.pd.proxy import _count

    assert _count(ids) == n
