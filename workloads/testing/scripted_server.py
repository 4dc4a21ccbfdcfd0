"""A scripted OpenAI-compatible SSE server: the known truth the load generator is tested
and benchmarked against. Not a model: it streams placeholder tokens on a schedule.

    python -m workloads.testing.scripted_server --port 0 [--ttft-ms 5 --itl-ms 1]

prints `PORT <n>` once listening. A request follows its default schedule (`--ttft-ms`,
then one token every `--itl-ms`, `max_tokens` tokens), or the script in a text prompt:
`id=7;ttft=30;itl=10,12,8;mode=split` (times in ms from the request's arrival; the
number of itl entries + 1 tokens). Modes exercise the client's failure handling:
normal, comments, split, usage_late, no_usage, malformed, error_event, http400, http500,
close, hang, no_done, empty_text (every token's text empty, as special tokens decode),
no_usage_empty (both), cached (usage reports 3 prompt tokens served from cache). Every chunk's send time (perf_counter, which is CLOCK_MONOTONIC and
so shared with the client process) is kept and served at GET /trace. A digest of every
prompt received, in arrival order, is served at GET /prompts (to check that a load
generator never resends one), and POST /flush_cache counts its calls in that answer.

`--instant` serves only the default schedule at zero delay (the same chunks, one HTTP chunk
per SSE event, written in one go) from a bare asyncio protocol: aiohttp's server tops out
near 3,500 req/s on one core, below the load generator, so client benchmarks use this one.
It keeps no trace; GET /health answers ok, anything else but POST /v1/completions 404.

Faults for the sweep's own bookkeeping: `--fail-every N` answers every Nth request HTTP
500; `--die-after N` SIGKILLs the server when its Nth request arrives.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import time

from aiohttp import web


def _script(body: dict, ttft_ms: float, itl_ms: float) -> dict:
    prompt = body.get("prompt")
    if prompt is None and body.get("messages"):
        prompt = body["messages"][-1].get("content")
    n = int(body.get("max_tokens") or 16)
    s = {"id": None, "ttft": ttft_ms, "itl": [itl_ms] * (n - 1), "mode": "normal"}
    if isinstance(prompt, str) and "=" in prompt:
        for item in prompt.split(";"):
            k, _, v = item.partition("=")
            k = k.strip()
            if k == "itl":
                s["itl"] = [float(x) for x in v.split(",") if x]
            elif k == "ttft":
                s["ttft"] = float(v)
            elif k in ("id", "mode"):
                s[k] = v.strip()
    return s


def _chunk(chat: bool, text: str, finish: str | None = None, usage: dict | None = None, role: bool = False) -> dict:
    if usage is not None:
        return {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion", "choices": [],
                "usage": usage}
    if chat:
        delta = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish}
    return {"id": "x", "object": "chat.completion.chunk" if chat else "text_completion",
            "choices": [choice], "usage": None}


class Scripted:
    def __init__(self, ttft_ms: float, itl_ms: float, fail_every: int = 0, die_after: int = 0) -> None:
        self.ttft_ms, self.itl_ms = ttft_ms, itl_ms
        self.fail_every, self.die_after = fail_every, die_after
        self.trace: dict[str, dict] = {}
        self.prompts: list[str] = []   # sha1 of each prompt's JSON (text or token ids), arrival order
        self.flushes: list[int] = []   # len(self.prompts) at each POST /flush_cache

    async def handle(self, request: web.Request) -> web.StreamResponse:
        arrive = time.perf_counter()
        # One handler (over 60 lines on purpose) for every failure mode, so each mode's send stamps are taken
        # exactly as the normal path takes them.
        chat = request.path.endswith("/chat/completions")
        body = await request.json()
        s = _script(body, self.ttft_ms, self.itl_ms)
        sent = body["prompt"] if "prompt" in body else body.get("messages")
        self.prompts.append(hashlib.sha1(json.dumps(sent).encode()).hexdigest())
        mode = s["mode"]
        n = len(self.prompts)
        if self.die_after and n >= self.die_after:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if self.fail_every and n % self.fail_every == 0:
            mode = "http500"
        if mode == "http500":
            return web.Response(status=500, text="scripted internal error")
        if mode == "http400":
            return web.json_response({"object": "error", "message": "scripted bad request"}, status=400)
        if mode == "hang":
            await asyncio.sleep(3600)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        rec = {"arrive": arrive, "content_writes": [], "finish_write": None}
        if s["id"] is not None:
            self.trace[s["id"]] = rec
        eol = "\r\n" if mode == "split" else "\n"

        async def send(obj, at: float | None = None) -> float:
            if at is not None:
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
            data = (obj if isinstance(obj, str) else json.dumps(obj))
            raw = f"data: {data}{eol}{eol}".encode()
            if mode == "comments":
                raw = f": keep-alive{eol}{eol}event: message{eol}id: 1{eol}".encode() + raw
            if mode == "split":
                # The event's last bytes arrive 2 ms after its first: it counts then.
                cut = len(raw) // 2
                await resp.write(raw[:cut])
                await asyncio.sleep(0.002)
                raw = raw[cut:]
            t = time.perf_counter()
            await resp.write(raw)
            return t

        if chat:
            await send(_chunk(True, "", role=True))  # vLLM/SGLang open with a role-only delta
        offsets = [s["ttft"]]
        for gap in s["itl"]:
            offsets.append(offsets[-1] + gap)
        for k, off in enumerate(offsets):
            if mode in ("malformed", "error_event", "close") and k == 2:
                if mode == "malformed":
                    await send("{not json")
                elif mode == "error_event":
                    await send({"error": {"message": "scripted out of memory", "code": 500}})
                else:
                    request.transport.abort()  # the server dies mid-stream
                    return resp
                await asyncio.sleep(0.01)
                return resp
            text = "" if mode in ("empty_text", "no_usage_empty") else f"t{k} "  # tokens that decode to no text
            rec["content_writes"].append(await send(_chunk(chat, text), arrive + off / 1e3))
        if mode == "no_done":
            await resp.write_eof()
            return resp
        rec["finish_write"] = await send(_chunk(chat, "", finish="length"))
        if mode not in ("no_usage", "no_usage_empty"):
            n = len(offsets)
            at = time.perf_counter() + 0.1 if mode == "usage_late" else None
            usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": n + 4}
            if mode == "cached":  # as vLLM --enable-prompt-tokens-details / SGLang --enable-cache-report say it
                usage["prompt_tokens_details"] = {"cached_tokens": 3}
            await send(_chunk(chat, "", usage=usage), at)
        await send("[DONE]")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def get_trace(self, request: web.Request) -> web.Response:
        return web.json_response(self.trace)

    async def get_prompts(self, request: web.Request) -> web.Response:
        return web.json_response({"prompts": self.prompts, "flushes": self.flushes})

    async def flush(self, request: web.Request) -> web.Response:
        self.flushes.append(len(self.prompts))
        return web.Response(text="Cache flushed.")


def make_app(ttft_ms: float = 5.0, itl_ms: float = 1.0, fail_every: int = 0, die_after: int = 0) -> web.Application:
    s = Scripted(ttft_ms, itl_ms, fail_every, die_after)
    app = web.Application()
    app.router.add_post("/v1/completions", s.handle)
    app.router.add_post("/v1/chat/completions", s.handle)
    app.router.add_get("/health", s.health)
    app.router.add_get("/v1/models", s.models)
    app.router.add_get("/trace", s.get_trace)
    app.router.add_get("/prompts", s.get_prompts)
    app.router.add_post("/flush_cache", s.flush)
    return app


class Instant(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server: each POST /v1/completions gets its whole stream
    (max_tokens content chunks, a finish chunk, usage, [DONE]) in one write."""

    _cache: dict[int, bytes] = {}
    _404 = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    _OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def connection_made(self, transport) -> None:
        self.transport, self.buf = transport, b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1")
            length = next((int(v) for k, _, v in (h.partition(":") for h in head.split("\r\n")[1:])
                           if k.strip().lower() == "content-length"), 0)
            if len(self.buf) < end + 4 + length:
                return  # the body is still on its way
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            if not head.startswith("POST /v1/completions "):
                self.transport.write(self._OK if head.startswith("GET /health ") else self._404)
                continue
            n = int(json.loads(body).get("max_tokens") or 16)
            self.transport.write(self._cache.get(n) or self._cache.setdefault(n, self._stream(n)))

    @staticmethod
    def _stream(n: int) -> bytes:
        events = [_chunk(False, f"t{k} ") for k in range(n)] + [_chunk(False, "", finish="length")]
        events.append(_chunk(False, "", usage={"prompt_tokens": 4, "completion_tokens": n, "total_tokens": n + 4}))
        out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n"]
        for ev in [json.dumps(e) for e in events] + ["[DONE]"]:
            raw = f"data: {ev}\n\n".encode()
            out.append(b"%x\r\n%s\r\n" % (len(raw), raw))
        return b"".join(out + [b"0\r\n\r\n"])


def _serve_instant(sock: socket.socket) -> None:
    try:
        import uvloop
        loop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    loop.run_until_complete(loop.create_server(Instant, sock=sock, backlog=4096))
    loop.run_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--itl-ms", type=float, default=1.0)
    ap.add_argument("--instant", action="store_true", help="the bare zero-delay server for client benchmarks")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--die-after", type=int, default=0)
    a, _ = ap.parse_known_args()  # an engine's flags (as an adapter builds them) are ignored
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((a.host, a.port))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    if a.instant:
        return _serve_instant(sock)
    web.run_app(make_app(a.ttft_ms, a.itl_ms, a.fail_every, a.die_after), sock=sock, print=None, backlog=4096,
                access_log=None)


if __name__ == "__main__":
    main()


class Running:
    """`with Running() as url:` the scripted server in its own process on 127.0.0.1."""

    def __init__(self, ttft_ms: float = 5.0, itl_ms: float = 1.0, cpu: int | None = None,
                 instant: bool = False, fail_every: int = 0) -> None:
        self.args = (["--instant"] if instant else ["--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                                                    "--fail-every", str(fail_every)])
        self.cpu = cpu

    def __enter__(self) -> str:
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-m", "workloads.testing.scripted_server", *self.args],
                                     stdout=subprocess.PIPE, text=True, start_new_session=True,
                                     cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
        if self.cpu is not None:
            os.sched_setaffinity(self.proc.pid, {self.cpu})
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"scripted server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        import urllib.request

        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    self.proc.kill()
                    raise
                time.sleep(0.05)
        return self.url

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except Exception:
            self.proc.kill()
            self.proc.wait()
