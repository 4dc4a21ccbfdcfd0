"""Redaction: the one way fabricbench keeps secrets out of what it writes and prints (records,
W&B config, a server's command line and log, Hydra's error line). A key names a secret by its
last word; a value is a credential by its shape, wherever it appears."""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

REDACTED = "<redacted>"
# A key names a secret when its LAST word does (WANDB_API_KEY, HF_TOKEN,
# AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, password, Authorization, --api-key): a metric
# such as total_token_throughput or a setting such as max_tokens ends in another word.
_SECRET_LAST = {"KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS",
                "AUTHORIZATION", "AUTH", "COOKIE"}
# Values that are credentials wherever they appear (a command line, a header, an error):
# Hugging Face, OpenAI-style, GitHub, Slack and AWS access keys, and HTTP auth schemes.
_SECRET_VALUES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|xox[abposr]-[A-Za-z0-9\-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16})\b"
    r"|(?<=Bearer )[A-Za-z0-9._~+/\-]+=*|(?<=Basic )[A-Za-z0-9+/]+=*"
    r"|(?i:(?<=authorization: ))\S+|(?i:(?<=authorization=))\S+")


def is_secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", str(name).upper()) if w]
    return bool(words) and words[-1] in _SECRET_LAST


_ASSIGNMENT = re.compile(r"^([+~]*[A-Za-z0-9_.\-/]+)=(.*)$", re.S)


def redact_text(text: str, values: Sequence[str] = ()) -> str:
    """Known credential values replaced wherever they occur in free text; also each of
    `values` (see `secret_values`), whatever its shape, replaced literally."""
    for v in values:
        text = text.replace(v, REDACTED)
    return _SECRET_VALUES.sub(REDACTED, text)


def secret_values(environ: Mapping[str, str], shortest: int = 8) -> list[str]:
    """The values of an environment's secret-named variables (HF_TOKEN, WANDB_API_KEY, ...)
    for `redact_text`: a process's own output (an engine's traceback, a dump of its config)
    can carry them verbatim in any shape. Values shorter than `shortest` (a flag such as
    "1") would blank ordinary text, so they are left; longest first, so a value containing
    another is hidden whole."""
    return sorted({v for k, v in environ.items() if is_secret_name(k) and len(v.strip()) >= shortest},
                  key=len, reverse=True)


def _hide(value: Any) -> Any:
    """A secret-named value is hidden unless it cannot be a credential: empty, or a number
    or boolean (a metric or a flag is never a key)."""
    if value is None or value == "" or isinstance(value, (bool, int, float)):
        return value
    return REDACTED


def redact(obj: Any) -> Any:
    """The one redaction of fabricbench: records, W&B config, the server log's command line
    and Hydra's error line all go through it. Hides the value of a mapping key, a `key=value`
    string (a Hydra override such as `+fabric.env.HF_TOKEN=...`) or a `--flag value` pair
    whose name is a secret's, and any known credential value in any string. Numbers stay."""
    if isinstance(obj, dict):
        return {k: (_hide(v) if is_secret_name(k) else redact(v)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [redact(v) for v in obj]
        for i in range(len(out) - 1):  # argv: --hf-token <value>
            flag = obj[i]
            if isinstance(flag, str) and flag.startswith("-") and "=" not in flag and is_secret_name(flag):
                out[i + 1] = _hide(obj[i + 1])
        return out
    if isinstance(obj, str):
        m = _ASSIGNMENT.match(obj.lstrip("-") if obj.startswith("--") else obj)
        if m and is_secret_name(m.group(1).rsplit(".", 1)[-1]) and m.group(2):
            return obj[: obj.index("=")] + "=" + REDACTED
        return redact_text(obj)
    return obj


def redact_argv(argv: Sequence[str]) -> str:
    """A command line as one printable, redacted string."""
    return " ".join(redact(list(argv)))
