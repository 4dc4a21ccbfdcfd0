"""Local Hugging Face tokenizers, for the load generator and the reference engine alike
(no torch import: the load side stays light)."""

from __future__ import annotations

from pathlib import Path

from workloads.core.errors import UsageError


def load_tokenizer(path: str | None, key: str = "load.tokenizer"):
    """A local Hugging Face tokenizer directory, or None for token-id prompts. `key` is
    the setting that named it, so the one-line error points at what to change."""
    if path in (None, "", "null"):
        return None
    p = Path(str(path)).expanduser()
    if not p.is_dir():
        raise UsageError(f"{key}={path!r} does not exist or is not a directory; give a local tokenizer directory "
                         "(one with tokenizer.json or tokenizer_config.json) or null to send token ids")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad directory
        first = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"{key}={path!r} is not a loadable tokenizer ({type(e).__name__}: {first}); "
                         "point it at a Hugging Face tokenizer directory") from None
