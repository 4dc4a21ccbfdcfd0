"""The one streaming function: send a request, read its SSE stream, time it.

Timing follows docs/metrics.md "Inference metrics" (as SGLang's and vLLM's serving benchmarks):
- t0 = perf_counter() just before the request is sent;
- TTFT = first event whose choice has non-empty content, minus t0; for a stream whose
  tokens all decode to empty text (special tokens) but which the server's usage counts, the
  first event carrying a token, and the request's row says `empty_text`;
- ITL = gaps between consecutive content events;
- latency (E2E) = the last event that carries a choice, minus t0. The usage-only final
  chunk (`choices: []`) does not move it; it only supplies `completion_tokens`.
Events are stamped when the read that completed them returned, so a chunk split across
reads counts when its last byte arrived.

Every failure (HTTP status, timeout, closed stream, malformed SSE, an error event) ends
the request with ok=False and the error text kept; nothing raises out of here.
"""

from __future__ import annotations

import asyncio
import functools
import resource
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from workloads.inference.loadgen.backends import Backend


@dataclass
class RequestResult:
    ok: bool = False
    error: str | None = None
    prompt_len: int = 0
    output_len: int = 0            # what was asked (max_tokens)
    output_tokens: int = 0         # what came back: usage.completion_tokens, else content events
    output_tokens_from: str = "none"  # "usage" | "chunks" | "none"
    ttft: float = 0.0              # s
    itl: list[float] = field(default_factory=list)  # s, one per content event after the first
    latency: float = 0.0           # s, E2E
    start: float = 0.0             # perf_counter() at send (t0)
    scheduled: float | None = None  # perf_counter() the arrival process asked for
    send_lag: float = 0.0          # s, start - scheduled (the client's own lateness)
    empty_text: bool = False       # every token decoded to empty text: TTFT is the first token chunk's
    # prompt tokens the server answered from its prefix cache, where its usage reports them
    # (usage.prompt_tokens_details.cached_tokens: vLLM --enable-prompt-tokens-details, SGLang
    # --enable-cache-report); None where it does not say
    cached_tokens: int | None = None
    # the prompt as the server tokenised it (usage.prompt_tokens): vLLM adds BOS to a text prompt
    # (CompletionRequest.add_special_tokens defaults to true) and the chat template to a chat one,
    # so it can exceed prompt_len, the client's count; None where the server does not say
    server_prompt_tokens: int | None = None

    def as_row(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "error": self.error, "prompt_len": self.prompt_len, "output_len": self.output_len,
            "output_tokens": self.output_tokens, "output_tokens_from": self.output_tokens_from,
            "ttft_s": self.ttft, "latency_s": self.latency, "itl_s": self.itl, "send_lag_s": self.send_lag,
            **({"empty_text": True} if self.empty_text else {}),
            **({"cached_tokens": self.cached_tokens} if self.cached_tokens is not None else {}),
            **({"server_prompt_tokens": self.server_prompt_tokens} if self.server_prompt_tokens is not None else {}),
        }


class SSEParser:
    """Incremental text/event-stream parser (WHATWG rules, tolerant): lines end in \\n,
    \\r\\n or \\r; ':' starts a comment; fields other than `data` are ignored; an event
    ends at a blank line; several data lines join with \\n.

    Works on bytes with C-level split/replace and decodes only the finished events: this
    runs for every read of every stream, so it is on the client's hot path."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        held = b""
        if b"\r" in buf:
            if buf.endswith(b"\r"):  # may be half of \r\n: it waits, with its line, for the next read
                buf, held = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop() + held
        out: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append(b"\n".join(data).decode("utf-8", errors="replace"))
                    data = self._data = []
            elif line.startswith(b"data"):
                value = line[4:]
                if not value:  # a field name alone: its value is empty
                    data.append(b"")
                elif value[:1] == b":":
                    data.append(value[2:] if value[1:2] == b" " else value[1:])
                # else a field whose name only starts with "data": ignored, like comments
        return out

    def close(self) -> list[str]:
        """End of stream: a last event without its blank line still counts."""
        return self.feed(b"\n\n")


def raise_fd_limit() -> None:
    """Thousands of concurrent streams need as many sockets: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def make_session(max_connections: int | None = None, read_bufsize: int = 1 << 18) -> aiohttp.ClientSession:
    """One session for a whole load point. No per-host cap (aiohttp's default is 100,
    which would silently queue concurrency 128 in the client)."""
    raise_fd_limit()
    conn = aiohttp.TCPConnector(limit=max_connections or 0, limit_per_host=0, keepalive_timeout=60,
                                ttl_dns_cache=None, force_close=False)
    return aiohttp.ClientSession(connector=conn, read_bufsize=read_bufsize, trust_env=False)


async def stream_request(session: aiohttp.ClientSession, base_url: str, backend: Backend, spec, model: str,
                         timeout_s: float, extra: dict[str, Any] | None = None,
                         result: RequestResult | None = None, on_first=None) -> RequestResult:
    # `on_first()`: called once, right after the first content event is stamped (the mlperf load
    # mode tells LoadGen its first token there).
    # One function on purpose (over 60 lines): every timestamp of a request is taken in this
    # one loop, with no call between reading a chunk and stamping it.
    r = result or RequestResult()
    r.prompt_len, r.output_len = int(spec.prompt_len), int(spec.output_len)
    body = orjson.dumps(backend.build(spec, model, extra or {}))
    url = base_url.rstrip("/") + backend.path
    parser = SSEParser()
    last_content = None   # perf_counter of the previous content event
    end = None            # perf_counter of the last event carrying a choice
    first = None          # perf_counter of the first event carrying a choice (a token or the finish)
    content_events = 0
    usage = None
    done = finished = False
    r.start = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=_JSON, timeout=_timeout(timeout_s)) as resp:
            if resp.status != 200:
                text = (await resp.text(errors="replace"))[:500]
                r.error = f"HTTP {resp.status} from {url}: {text.strip()}"
                return r
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                for data in parser.feed(chunk):
                    state = _event(data, backend)
                    if state is _DONE:
                        done = True
                        break
                    if isinstance(state, _Error):
                        r.error = state.message
                        return r
                    text, has_choice, fin, u = state
                    usage = u or usage
                    finished |= fin
                    if has_choice:
                        end = now
                        if first is None:
                            first = now
                    if text:
                        if last_content is None:
                            r.ttft = now - r.start
                            if on_first is not None:
                                on_first()
                        else:
                            r.itl.append(now - last_content)
                        last_content = now
                        content_events += 1
                if done:
                    break
            if not done:
                for data in parser.close():
                    if data.strip() == "[DONE]":
                        done = True
    except asyncio.TimeoutError:
        r.error = f"timeout: no complete response within {timeout_s:g} s (load.request_timeout_s)"
        return r
    except aiohttp.ClientError as e:
        r.error = f"{type(e).__name__}: {e}"
        return r
    if not (done or finished):
        r.error = "stream ended before 'data: [DONE]' or a finish_reason (server closed it mid-way)"
        return r
    counted = usage.get("completion_tokens") if usage else None
    if content_events == 0:
        # Tokens that all decode to empty text (special tokens) are still output: with the
        # server's count of them, the request completed, timed from its first token chunk
        # (vLLM's client's rule; SGLang's would wait for text that never comes).
        if not counted or first is None:
            r.error = "stream finished without any output token (no content, and no usage.completion_tokens)"
            return r
        r.ttft, r.empty_text = first - r.start, True
    r.latency = end - r.start
    details = usage.get("prompt_tokens_details") if usage else None
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        r.cached_tokens = details["cached_tokens"]
    if usage and isinstance(usage.get("prompt_tokens"), int):
        r.server_prompt_tokens = usage["prompt_tokens"]
    if counted is not None:
        r.output_tokens, r.output_tokens_from = int(counted), "usage"
    else:
        r.output_tokens, r.output_tokens_from = content_events, "chunks"
    r.ok = True
    return r


_JSON = {"Content-Type": "application/json"}
_DONE = object()


@functools.lru_cache(maxsize=8)
def _timeout(total_s: float) -> aiohttp.ClientTimeout:
    """One (immutable) timeout object per value, not one per request."""
    return aiohttp.ClientTimeout(total=total_s)


@dataclass
class _Error:
    message: str


def _event(data: str, backend: Backend):
    if data == "[DONE]" or data.strip() == "[DONE]":
        return _DONE
    try:
        ev = orjson.loads(data)
    except orjson.JSONDecodeError:
        return _Error(f"malformed SSE data (not JSON): {data[:200]!r}")
    if not isinstance(ev, dict):
        return _Error(f"malformed SSE data (not a JSON object): {data[:200]!r}")
    if "error" in ev or ev.get("object") == "error":
        return _Error(f"server error in stream: {orjson.dumps(ev.get('error', ev)).decode()[:300]}")
    text, has_choice, fin = backend.parse(ev)
    return text, has_choice, fin, ev.get("usage")
