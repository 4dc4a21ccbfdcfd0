"""The P/D proxy: one OpenAI-compatible endpoint in front of a prefill and a decode instance.

Protocol (vLLM 0.32's NixlConnector, as its examples' toy_proxy_server.py describes it,
and as it was found to run on this CPU), per request, one X-Request-Id for both legs:
1. prefill: the client's body with max_tokens=1 (max_completion_tokens too, if given),
   stream=false, no stream_options, and kv_transfer_params={"do_remote_decode": true, ...}:
   the prefill instance computes the prompt's KV cache, keeps its blocks for the decode
   instance and answers with the kv_transfer_params that name them (engine id, block ids,
   side-channel host/port);
2. decode: the client's own body plus those kv_transfer_params; the decode instance reads
   the blocks (NIXL over UCX) instead of recomputing the prompt, and its SSE stream is
   relayed byte for byte, so the load generator times TTFT/ITL as against any server.

SGLang's protocol (`bootstrap` set: server=sglang-pd; what SGLang's router does, its request fields
in sglang/srt/entrypoints/openai/protocol.py PDRoutingFields): the client's body plus
bootstrap_host/bootstrap_port (the prefill instance's bootstrap server) and one random
bootstrap_room go to both instances at once; the decode instance waits for that room's KV cache
from the prefill instance and its SSE stream is relayed; the prefill instance's answer is read and
dropped, unless it is an error before the decode's first byte, which then goes to the client.

Each request's legs are timed here and appended, one JSON line, to `timings_path` once its
decode stream ends: the prefill leg (post to answer: the part of TTFT spent before decode starts)
and the decode leg up to its first chunk (post to first byte: the KV transfer, the decode
instance's first step and its queue), the two parts of TTFT the proxy can see.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

# What the prefill leg adds (vLLM's kv_transfer_params for a producer request).
PREFILL_KV_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
ROUTES = ("/v1/completions", "/v1/chat/completions")
PREFILL_ANSWER_S = 5.0  # SGLang: how long the prefill's answer may trail the decode stream's end


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body) | {"max_tokens": 1, "stream": False, "kv_transfer_params": dict(PREFILL_KV_PARAMS)}
    out.pop("stream_options", None)
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
    return dict(body) | ({"kv_transfer_params": kv_transfer_params} if kv_transfer_params else {})


def sglang_body(body: dict[str, Any], bootstrap: tuple[str, int], room: int) -> dict[str, Any]:
    """What both SGLang instances get: the client's body and the room the KV cache meets in."""
    return dict(body) | {"bootstrap_host": bootstrap[0], "bootstrap_port": int(bootstrap[1]), "bootstrap_room": room}


class Proxy:
    def __init__(self, prefill_url: str, decode_url: str, timings_path: str | None = None,
                 bootstrap: tuple[str, int] | None = None):
        self.prefill_url, self.decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")
        self.timings_path = timings_path
        self.bootstrap = bootstrap  # SGLang's protocol: the prefill instance's bootstrap (host, port)
        self.session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        for route in ROUTES:
            app.router.add_post(route, self.handle)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _app) -> None:
        # no total timeout: a decode stream lasts as long as the client's request does
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                             connector=aiohttp.TCPConnector(limit=0))

    async def _close(self, _app) -> None:
        await self.session.close()

    async def health(self, _request: web.Request) -> web.Response:
        """200 only when both instances answer theirs."""
        for url in (self.prefill_url, self.decode_url):
            try:
                async with self.session.get(url + "/health") as r:
                    if r.status != 200:
                        return web.Response(status=503, text=f"{url}/health answered {r.status}")
            except aiohttp.ClientError as e:
                return web.Response(status=503, text=f"{url}/health: {e}")
        return web.Response(text="ok")

    async def models(self, _request: web.Request) -> web.Response:
        async with self.session.get(self.decode_url + "/v1/models") as r:
            return web.Response(status=r.status, body=await r.read(), content_type="application/json")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = request.headers.get("X-Request-Id") or str(uuid.uuid4())
        headers = {"X-Request-Id": rid}
        auth = request.headers.get("Authorization")
        if auth:
            headers["Authorization"] = auth
        if self.bootstrap:
            return await self._both_at_once(request, body, headers, rid)
        t0 = time.perf_counter()
        async with self.session.post(self.prefill_url + request.path, json=prefill_body(body), headers=headers) as r:
            raw = await r.read()
            if r.status != 200:  # the prefill instance's own error, as it gave it
                return web.Response(status=r.status, body=raw, content_type=r.content_type)
        t1 = time.perf_counter()
        params = json.loads(raw).get("kv_transfer_params")
        first: float | None = None
        resp = web.StreamResponse()
        try:
            async with self.session.post(self.decode_url + request.path, json=decode_body(body, params),
                                         headers=headers) as r:
                resp.set_status(r.status)
                resp.content_type = r.content_type
                await resp.prepare(request)
                try:
                    async for chunk in r.content.iter_any():
                        if first is None:
                            first = time.perf_counter() - t1
                        await resp.write(chunk)
                    await resp.write_eof()
                except ConnectionResetError:
                    # the client left (a load generator may close once it has read [DONE]); leaving
                    # this block closes the decode stream too, which ends the request there
                    pass
        finally:
            self._note(rid, t1 - t0, first, params)
        return resp

    async def _post(self, url: str, body: dict, headers: dict, t0: float) -> tuple[int, bytes, str, float]:
        async with self.session.post(url, json=body, headers=headers) as r:
            return r.status, await r.read(), r.content_type, time.perf_counter() - t0

    async def _both_at_once(self, request: web.Request, body: dict, headers: dict, rid: str) -> web.StreamResponse:
        both = sglang_body(body, self.bootstrap, random.getrandbits(63))
        t0 = time.perf_counter()
        pre = asyncio.create_task(self._post(self.prefill_url + request.path, both, headers, t0))
        first: float | None = None
        resp = web.StreamResponse()
        try:
            async with self.session.post(self.decode_url + request.path, json=both, headers=headers) as r:
                head = asyncio.ensure_future(r.content.readany())
                await asyncio.wait({pre, head}, return_when=asyncio.FIRST_COMPLETED)
                if pre.done() and not head.done() and pre.result()[0] != 200:
                    head.cancel()  # the decode instance would wait for a KV cache that never comes
                    status, raw, ctype, _ = pre.result()
                    return web.Response(status=status, body=raw, content_type=ctype)
                chunk = await head
                first = time.perf_counter() - t0
                resp.set_status(r.status)
                resp.content_type = r.content_type
                await resp.prepare(request)
                try:
                    while chunk:
                        await resp.write(chunk)
                        chunk = await r.content.readany()
                    await resp.write_eof()
                except ConnectionResetError:
                    pass  # the client left: leaving this block closes the decode stream too
        finally:
            prefill_s = None
            try:  # the decode needed the prefill's KV cache, so its answer is in or about to be
                prefill_s = (await asyncio.wait_for(pre, PREFILL_ANSWER_S))[3]
            except (asyncio.TimeoutError, aiohttp.ClientError):
                pass
            self._note(rid, prefill_s, first, None, concurrent=True)
        return resp

    def _note(self, rid: str, prefill_s: float | None, decode_first_s: float | None, params: dict | None,
              concurrent: bool = False) -> None:
        if not self.timings_path:
            return
        row = {"request_id": rid, "prefill_s": prefill_s, "decode_first_s": decode_first_s, "t": time.time(),
               "remote_num_tokens": (params or {}).get("remote_num_tokens"),
               "remote_blocks": _count((params or {}).get("remote_block_ids"))}
        if concurrent:  # both legs from the same start (SGLang): not a prefill-then-decode split of TTFT
            row["legs"] = "concurrent"
        with open(self.timings_path, "a") as f:
            f.write(json.dumps(row) + "\n")


def _count(ids) -> int:
    """Block ids are a list per KV-cache group ([[1, 2]]) in vLLM 0.32; a flat list elsewhere."""
    if ids is None:
        return 0
    return sum(_count(x) if isinstance(x, list) else 1 for x in ids)
