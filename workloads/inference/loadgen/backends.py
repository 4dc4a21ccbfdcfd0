"""Request backends: the only place that knows the shape of an OpenAI request and chunk.

A backend builds the JSON body for a `RequestSpec` and reads one parsed SSE event into
(content text or None, whether it carried a choice, whether that choice finished); the
usage block is read by client.py for every backend alike. Timing lives in client.py,
never here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from workloads.core.errors import UsageError


class Backend(Protocol):
    name: str
    path: str  # appended to the server's base URL

    def build(self, spec, model: str, extra: dict[str, Any]) -> dict[str, Any]: ...

    def parse(self, event: dict[str, Any]) -> tuple[str | None, bool, bool]:
        """(content text of the first choice or None, whether the event carried a choice with
        a token or a finish (a chat stream's role-only opener does not), whether that choice
        has a finish_reason)."""
        ...


def _common(spec, model: str, extra: dict[str, Any]) -> dict[str, Any]:
    body = {
        "model": model,
        "max_tokens": int(spec.output_len),
        "stream": True,
        # The usage-only final chunk gives the true output token count.
        "stream_options": {"include_usage": True},
        # Both SGLang and vLLM accept ignore_eos as an extra sampling field; without it a
        # request may stop early and its output length is not what was asked.
        "ignore_eos": True,
        "temperature": 0.0,
    }
    body.update(extra)
    return body


@dataclass(frozen=True)
class Completions:
    name: str = "completions"
    path: str = "/v1/completions"

    def build(self, spec, model, extra):
        # A list of ints is a token-id prompt, which the OpenAI completions API accepts.
        return _common(spec, model, extra) | {"prompt": spec.prompt}

    def parse(self, event):
        choices = event.get("choices") or []
        if not choices:
            return None, False, False
        return choices[0].get("text") or None, True, choices[0].get("finish_reason") is not None


@dataclass(frozen=True)
class Chat:
    name: str = "chat"
    path: str = "/v1/chat/completions"

    def build(self, spec, model, extra):
        if not isinstance(spec.prompt, str):
            raise UsageError("load.backend=chat needs text prompts; give load.tokenizer=<local tokenizer dir> "
                             "or use load.backend=completions, which accepts token ids")
        return _common(spec, model, extra) | {"messages": [{"role": "user", "content": spec.prompt}]}

    def parse(self, event):
        choices = event.get("choices") or []
        if not choices:
            return None, False, False
        delta = choices[0].get("delta") or {}
        # Reasoning models stream thinking tokens separately; they are output tokens too.
        text = delta.get("content") or delta.get("reasoning_content") or None
        fin = choices[0].get("finish_reason") is not None
        # vLLM and SGLang open the stream with a role-only delta before any token is made: not a token.
        return text, bool(text) or fin or "role" not in delta, fin


BACKENDS: dict[str, Backend] = {b.name: b for b in (Completions(), Chat())}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise UsageError(f"load.backend={name!r}; use one of {', '.join(BACKENDS)}") from None
