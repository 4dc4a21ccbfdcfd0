"""The P/D proxy in SGLang's protocol (Proxy(..., bootstrap=...): server=sglang-pd) between two real
HTTP servers standing in for a prefill and a decode SGLang instance (aiohttp on free ports; no
SGLang): both get the client's body plus the same bootstrap_host/port/room at once (the fields of
SGLang's PDRoutingFields, sglang/srt/entrypoints/openai/protocol.py), the decode stream is relayed
byte for byte while the prefill's answer is dropped, a prefill error before the decode's first
byte reaches the client, and each request's two legs are timed from one start."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from workloads.core.ports import free_port
from workloads.inference.pd.proxy import Proxy

SSE = [b'data: {"choices":[{"text":" w1"}]}\n\n', b"data: [DONE]\n\n"]
BOOT = ("10.0.0.7", 8998)


class Pair:
    """A prefill stand-in that answers after `prefill_s` with `status`, and a decode stand-in that
    starts streaming only once the prefill has answered (as SGLang's decode waits for the KV cache)."""

    def __init__(self, status: int = 200, prefill_s: float = 0.2):
        self.status, self.prefill_s = status, prefill_s
        self.seen: dict[str, list] = {"prefill": [], "decode": []}
        self.arrived: dict[str, float] = {}
        self.kv: dict[int, asyncio.Event] = {}  # one per bootstrap room: the KV cache of that request

    def room(self, body: dict) -> asyncio.Event:
        return self.kv.setdefault(body["bootstrap_room"], asyncio.Event())

    async def prefill(self, request: web.Request) -> web.Response:
        self.arrived["prefill"] = asyncio.get_running_loop().time()
        body = await request.json()
        self.seen["prefill"].append(body)
        await asyncio.sleep(self.prefill_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "prefill said no"}}, status=self.status)
        self.room(body).set()
        return web.json_response({"choices": [{"text": " w0"}]})

    async def decode(self, request: web.Request) -> web.StreamResponse:
        self.arrived["decode"] = asyncio.get_running_loop().time()
        body = await request.json()
        self.seen["decode"].append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            await asyncio.wait_for(self.room(body).wait(), 3)
        except asyncio.TimeoutError:
            return resp  # never reached in a passing test: the proxy answers first
        for chunk in SSE:
            await resp.write(chunk)
        await resp.write_eof()
        return resp


async def _exchange(pair: Pair, tmp_path, n: int = 1):
    runners, urls = [], {}
    for role, handler in (("prefill", pair.prefill), ("decode", pair.decode)):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls[role] = f"http://127.0.0.1:{port}"
    proxy = Proxy(urls["prefill"], urls["decode"], str(tmp_path / "legs.jsonl"), bootstrap=BOOT)
    runner = web.AppRunner(proxy.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    runners.append(runner)
    out = []
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                async with s.post(f"http://127.0.0.1:{port}/v1/completions",
                                  json={"model": "m", "prompt": "a b", "max_tokens": 4, "stream": True}) as r:
                    out.append((r.status, await r.read()))
    finally:
        for r in reversed(runners):
            await r.cleanup()
    return out


def test_both_instances_get_the_body_and_one_room_at_once(tmp_path):
    pair = Pair(prefill_s=0.3)
    (status, body), (_, body2) = asyncio.run(_exchange(pair, tmp_path, n=2))
    assert status == 200 and body == b"".join(SSE) and body2 == body  # decode's stream, byte for byte
    for i in range(2):
        p, d = pair.seen["prefill"][i], pair.seen["decode"][i]
        assert p == d and p["prompt"] == "a b" and p["stream"] is True
        assert (p["bootstrap_host"], p["bootstrap_port"]) == BOOT and isinstance(p["bootstrap_room"], int)
    rooms = {pair.seen["prefill"][i]["bootstrap_room"] for i in range(2)}
    assert len(rooms) == 2 and all(0 <= r < 2**63 for r in rooms)  # one room per request
    # sent together: the decode did not wait for the prefill's 0.3 s answer before being asked
    assert abs(pair.arrived["decode"] - pair.arrived["prefill"]) < 0.2
    legs = [json.loads(x) for x in (tmp_path / "legs.jsonl").read_text().splitlines()]
    assert len(legs) == 2 and all(x["legs"] == "concurrent" for x in legs)
    # both timed from one start: the decode's first byte came after the prefill answered
    assert all(0.3 <= x["prefill_s"] <= x["decode_first_s"] for x in legs), legs


def test_a_prefill_error_reaches_the_client_before_any_decode_byte(tmp_path):
    pair = Pair(status=503, prefill_s=0.1)
    ((status, body),) = asyncio.run(_exchange(pair, tmp_path))
    assert status == 503 and json.loads(body)["error"]["message"] == "prefill said no"
    (leg,) = [json.loads(x) for x in (tmp_path / "legs.jsonl").read_text().splitlines()]
    assert leg["decode_first_s"] is None and leg["prefill_s"] >= 0.1
