"""What the P/D proxy (workloads/inference/pd/proxy.py) adds to TTFT, against the same requests
sent straight to the decode instance in the same run.

The KV cache moves engine to engine (NIXL), never through the proxy; what the harness puts on a
disaggregated request's path is the proxy's two HTTP hops (the prefill leg, then the decode leg
relayed byte for byte). Here both instances are instant stand-ins in a second process (the prefill
answers with kv_transfer_params at once, the decode streams `--tokens` SSE chunks), so all that
differs between the two sides is the proxy: client -> proxy -> prefill, proxy -> decode -> relay,
against client -> decode. Sides alternate ABBA over `--rounds` rounds of `--requests` sequential
requests; printed: median TTFT per side, the proxy's added ms per request and the ratio.

    .venv/bin/python benchmarks/pd_proxy_overhead.py [--rounds 6 --requests 200 --tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KV = {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[1, 2, 3, 4]],
      "remote_engine_id": "e1", "remote_host": "127.0.0.1", "remote_port": 5600, "remote_num_tokens": 500}


def _serve(ports: dict, tokens: int, ready) -> None:
    from aiohttp import web

    from workloads.inference.pd.proxy import Proxy

    async def prefill(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [{"text": " w9"}], "kv_transfer_params": KV})

    async def decode(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(tokens):
            await resp.write(b'data: {"choices":[{"text":" w%d"}]}\n\n' % i)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def main() -> None:
        runners = []
        for name, handler in (("prefill", prefill), ("decode", decode)):
            app = web.Application()
            app.router.add_post("/v1/completions", handler)
            runners.append(web.AppRunner(app))
        base = "http://127.0.0.1:{}"
        runners.append(web.AppRunner(Proxy(base.format(ports["prefill"]), base.format(ports["decode"])).app()))
        for runner, name in zip(runners, ("prefill", "decode", "proxy")):
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", ports[name]).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


async def _round(url: str, requests: int) -> list[float]:
    import aiohttp

    body = {"model": "tiny", "prompt": "w1 " * 500, "max_tokens": 8, "stream": True}
    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(requests):
            t0 = time.perf_counter()
            async with s.post(url + "/v1/completions", json=body) as r:
                await r.content.readany()
                out.append(time.perf_counter() - t0)
                await r.read()
    return out


def main() -> None:
    from workloads.core.dist import free_port

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    ports = {k: free_port() for k in ("prefill", "decode", "proxy")}
    ready = mp.Event()
    server = mp.Process(target=_serve, args=(ports, a.tokens, ready), daemon=True)
    server.start()
    if not ready.wait(60):
        sys.exit("the stand-ins and the proxy did not come up in 60 s")
    sides = {"direct": f"http://127.0.0.1:{ports['decode']}", "proxy": f"http://127.0.0.1:{ports['proxy']}"}
    ttft: dict[str, list[float]] = {k: [] for k in sides}
    for side in sides:  # burn-in: connections, the first requests' imports
        asyncio.run(_round(sides[side], 20))
    for k in range(a.rounds):
        for side in (list(sides) if k % 2 == 0 else list(sides)[::-1]):
            ttft[side] += asyncio.run(_round(sides[side], a.requests))
    server.terminate()
    med = {k: statistics.median(v) * 1e3 for k, v in ttft.items()}
    print(f"P/D proxy overhead, {a.rounds} ABBA rounds x {a.requests} requests a side, {a.tokens} tokens each")
    print(f"  TTFT median direct to decode  {med['direct']:.3f} ms")
    print(f"  TTFT median through the proxy {med['proxy']:.3f} ms (its prefill leg to an instant stand-in included)")
    print(f"  added per request {med['proxy'] - med['direct']:.3f} ms; ratio proxy / direct {med['proxy'] / med['direct']:.2f}")


if __name__ == "__main__":
    main()
