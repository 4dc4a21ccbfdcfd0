"""OpenAI-compatible HTTP front end on rank 0 (aiohttp), in front of the engine thread.

Endpoints: POST /v1/completions, POST /v1/chat/completions (stream or not; with
`stream_options.include_usage` a last chunk carries `usage` and empty `choices`, then
`data: [DONE]`), GET /v1/models, GET /health (200 while the engine runs, else 503).

Prompts: text (needs a tokenizer: server.tokenizer or the checkpoint's directory) or a
list of token ids. Without a tokenizer each generated token is rendered as the text
`[id]`, so that every token still arrives as a non-empty content chunk.

Extensions honoured as vLLM does: `ignore_eos`, `min_tokens`. Sampling: temperature 0
is greedy; otherwise temperature, top_p and `seed` (per request, reproducible).
Defaults as OpenAI/vLLM: temperature 1.0, top_p 1.0; `max_tokens` 16 for completions,
the rest of the context for chat. Errors are `{"error": {"message", "type", "param",
"code"}}` with a 4xx/5xx status; the engine keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from workloads.core.errors import UsageError
from workloads.inference.engine.engine import Engine, RequestError, SamplingParams
from workloads.inference.protocol import IDENTITY_ENV

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy completions default, also vLLM's


class Detokenizer:
    """Incremental text of a growing token list; holds back an incomplete UTF-8 tail."""

    def __init__(self, tokenizer, skip: set[int]):
        self.tok, self.skip, self.ids, self.sent = tokenizer, skip, [], 0

    def push(self, token: int) -> str:
        if self.tok is None:
            return f"[{token}]"
        if token in self.skip:
            return ""
        self.ids.append(token)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        delta, self.sent = text[self.sent:], len(text)
        return delta


def error_response(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": None}},
                             status=status)


def _num(body: dict, key: str, default, kind, lo=None, hi=None):
    v = body.get(key, default)
    if v is None:
        v = default
    if kind is int and (isinstance(v, bool) or not isinstance(v, int)):
        raise RequestError(f"'{key}' must be an integer, got {v!r}", param=key)
    if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
        raise RequestError(f"'{key}' must be a number, got {v!r}", param=key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise RequestError(f"'{key}'={v} is out of range [{lo}, {hi if hi is not None else 'inf'}]", param=key)
    return kind(v)


@dataclass
class Parsed:
    prompt: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool


class Server:
    def __init__(self, engine: Engine, model_name: str, tokenizer=None, max_model_len: int | None = None):
        self.engine, self.model_name, self.tok = engine, model_name, tokenizer
        self.max_model_len = max_model_len or engine.max_model_len
        self.created = int(time.time())
        skip = set(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else set()
        self.skip = skip

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if self.engine.alive:
            return web.Response(text="ok")
        return web.Response(status=503, text=f"engine stopped: {self.engine.failure or 'shutting down'}")

    async def models(self, request: web.Request) -> web.Response:
        # fabricbench_token: the launching orchestrator's per-run token (adapters/base.py)
        return web.json_response({"object": "list", "fabricbench_token": os.environ.get(IDENTITY_ENV), "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "fabricbench",
            "root": self.model_name, "max_model_len": self.max_model_len}]})

    # ---- request parsing ---------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if model not in (None, self.model_name):
            raise RequestError(f"The model `{model}` does not exist. This server serves `{self.model_name}`.",
                               status=404, param="model", kind="NotFoundError")
        if _num(body, "n", 1, int, 1) != 1:
            raise RequestError("only n=1 is supported", param="n")
        return body

    def _tokenize(self, text: str) -> list[int]:
        if self.tok is None:
            raise RequestError("this server has no tokenizer (start it with server.tokenizer=<dir>); send the "
                               "prompt as a list of token ids", param="prompt")
        return list(self.tok.encode(text))

    def _prompt(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return self._tokenize(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise RequestError("'prompt' must be a string, a list of token ids, or a batch of exactly one of them",
                           param="prompt")

    def _chat_prompt(self, messages: Any) -> list[int]:
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise RequestError("'messages' must be a non-empty list of {role, content} objects with string content",
                               param="messages")
        if self.tok is None:
            raise RequestError("chat needs a tokenizer; start the server with server.tokenizer=<dir>",
                               param="messages")
        if getattr(self.tok, "chat_template", None):
            ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        # Base models (Pythia) ship no chat template: a plain transcript, stated in the docs.
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return self._tokenize(text)

    def _parse(self, body: dict, prompt: list[int], default_max: int) -> Parsed:
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = default_max if max_tokens is None else _num({"max_tokens": max_tokens}, "max_tokens", 1, int, 1)
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise RequestError("'stream_options' must be an object", param="stream_options")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("'stream' must be true or false", param="stream")
        seed = body.get("seed")
        if seed is not None:
            seed = _num(body, "seed", None, int)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=_num(body, "temperature", 1.0, float, 0.0, 2.0),
            top_p=_num(body, "top_p", 1.0, float, 0.0, 1.0),
            seed=seed,
            ignore_eos=bool(body.get("ignore_eos", False)),
            min_tokens=_num(body, "min_tokens", 0, int, 0),
        )
        if params.top_p == 0.0:
            raise RequestError("'top_p' must be greater than 0", param="top_p")
        if params.min_tokens > params.max_tokens:
            raise RequestError(f"min_tokens={params.min_tokens} exceeds max_tokens={params.max_tokens}",
                               param="min_tokens")
        return Parsed(prompt, params, stream, bool(opts.get("include_usage", False)) and stream)

    # ---- handlers -------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            if "prompt" not in body:
                raise RequestError("'prompt' is required", param="prompt")
            req = self._parse(body, self._prompt(body["prompt"]), COMPLETIONS_DEFAULT_MAX_TOKENS)
        except RequestError as e:
            return error_response(e.status, str(e), e.kind, e.param)
        return await self._serve(request, req, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt = self._chat_prompt(body.get("messages"))
            req = self._parse(body, prompt, max(1, self.max_model_len - len(prompt)))
        except RequestError as e:
            return error_response(e.status, str(e), e.kind, e.param)
        return await self._serve(request, req, chat=True)

    async def _serve(self, request: web.Request, req: Parsed, chat: bool) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(token, reason):  # engine thread -> event loop
            try:
                loop.call_soon_threadsafe(events.put_nowait, (token, reason))
            except RuntimeError:
                pass  # the loop has closed (shutdown): nobody is listening

        try:
            seq_id = self.engine.submit(req.prompt, req.params, emit)
        except RequestError as e:
            return error_response(e.status, str(e), e.kind, e.param)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        finished = False
        try:
            if req.stream:
                resp = await self._stream(request, req, chat, rid, events)
            else:
                resp = await self._collect(req, chat, rid, events)
            finished = True
            return resp
        finally:
            if not finished:  # client went away (write failed or handler cancelled): free its slot
                self.engine.abort(seq_id)

    async def _next(self, events: asyncio.Queue):
        return await events.get()

    async def _collect(self, req: Parsed, chat: bool, rid: str, events: asyncio.Queue) -> web.Response:
        detok, text, n, reason = Detokenizer(self.tok, self.skip), [], 0, None
        while reason is None:
            token, reason = await self._next(events)
            if token is not None:
                n += 1
                text.append(detok.push(token))
        if reason in ("error", "abort"):
            return error_response(503, f"the engine stopped before the request finished ({self.engine.failure})",
                                  "server_error")
        usage = self._usage(req, n)
        content = "".join(text)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                      "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return web.json_response({"id": rid, "object": obj, "created": int(time.time()), "model": self.model_name,
                                  "choices": [choice], "usage": usage})

    def _usage(self, req: Parsed, n: int) -> dict:
        return {"prompt_tokens": len(req.prompt), "completion_tokens": n, "total_tokens": len(req.prompt) + n}

    async def _stream(self, request, req: Parsed, chat: bool, rid: str, events: asyncio.Queue) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created, obj = int(time.time()), ("chat.completion.chunk" if chat else "text_completion")

        def chunk(choices, usage=None) -> bytes:
            d = {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": choices}
            if req.include_usage:
                d["usage"] = usage
            return f"data: {json.dumps(d)}\n\n".encode()

        def choice(text: str | None, reason: str | None, role: bool = False) -> dict:
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

        if chat:
            await resp.write(chunk([choice(None, None, role=True)]))
        detok, n, reason = Detokenizer(self.tok, self.skip), 0, None
        while reason is None:
            token, reason = await self._next(events)
            if reason in ("error", "abort"):
                err = {"error": {"message": f"the engine stopped ({self.engine.failure})", "type": "server_error",
                                 "param": None, "code": None}}
                await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                break
            text = detok.push(token) if token is not None else ""
            if token is not None:
                n += 1
            if text or reason is not None:
                await resp.write(chunk([choice(text if (text or not chat) else None, reason)]))
        if req.include_usage and reason not in ("error", "abort"):
            await resp.write(chunk([], self._usage(req, n)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def serve(server: Server, host: str, port: int, stop: asyncio.Event, before_close=None) -> None:
    """Listen until `stop` is set. handler_cancellation: a client that disconnects cancels
    its handler, whose `finally` aborts the request in the engine. `before_close` (run in
    a thread) stops the engine first, so in-flight handlers end with an error chunk."""
    runner = web.AppRunner(server.app(), handler_cancellation=True, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UsageError(f"cannot listen on {host}:{port} ({e.strerror}); choose another server.port") from None
    print(f"serving {server.model_name} on http://{host}:{port} (OpenAI-compatible; GET /health)", flush=True)
    try:
        await stop.wait()
    finally:
        if before_close is not None:
            await asyncio.to_thread(before_close)
        await runner.cleanup()
