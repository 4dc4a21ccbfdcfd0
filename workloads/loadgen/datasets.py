"""Datasets: `load(tokenizer) -> list[RequestSpec]`, one small class per kind.

- random: input and output lengths drawn uniformly from [L·r, L] (SGLang's
  `--random-range-ratio`; r = 1 gives exactly L). Prompts are random token ids: sent as
  ids when there is no tokenizer (the completions API accepts a list of ints), else
  decoded to text and re-measured with the tokenizer.
- sharegpt: a local ShareGPT-format JSON file (a list of {"conversations": [{"from":
  "human", "value": ...}, {"from": "gpt", ...}]}); the first human turn is the prompt,
  the reply's token count the output length unless `output_len` fixes it. Pairs with a
  prompt or reply under 4 tokens, a prompt over 1024 or a total over 2048 are dropped,
  as vLLM's benchmark does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import UsageError


@dataclass(frozen=True)
class RequestSpec:
    prompt: str | list[int]
    prompt_len: int   # tokens
    output_len: int   # tokens asked for (max_tokens, with ignore_eos)


def load_tokenizer(path: str | None):
    if path in (None, "", "null"):
        return None
    p = Path(str(path)).expanduser()
    if not p.exists():
        raise UsageError(f"load.tokenizer={path!r} does not exist; give a local tokenizer directory "
                         "(one with tokenizer.json or tokenizer_config.json) or null to send token ids")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except Exception as e:  # transformers raises many types for a bad directory
        raise UsageError(f"load.tokenizer={path!r} is not a loadable tokenizer ({type(e).__name__}: {e}); "
                         "point it at a Hugging Face tokenizer directory") from None


def _lengths(rng: np.random.Generator, n: int, length: int, ratio: float, what: str) -> np.ndarray:
    if length <= 0:
        raise UsageError(f"load.dataset.{what}={length} must be a positive number of tokens")
    if not 0.0 <= ratio <= 1.0:
        raise UsageError(f"load.dataset.range_ratio={ratio} must be in [0, 1] (1 = exact lengths)")
    lo = max(int(length * ratio), 1)
    return rng.integers(lo, length + 1, size=n)  # uniform on [L·r, L], both ends included


@dataclass(frozen=True)
class RandomDataset:
    num_prompts: int
    input_len: int
    output_len: int
    range_ratio: float = 1.0
    vocab_size: int = 1000
    seed: int = 0

    def load(self, tokenizer=None) -> list[RequestSpec]:
        rng = np.random.default_rng(self.seed)
        ins = _lengths(rng, self.num_prompts, self.input_len, self.range_ratio, "input_len")
        outs = _lengths(rng, self.num_prompts, self.output_len, self.range_ratio, "output_len")
        vocab = len(tokenizer) if tokenizer is not None else self.vocab_size
        specs = []
        for i, (n_in, n_out) in enumerate(zip(ins.tolist(), outs.tolist())):
            # Different ids per request so a prefix cache cannot answer from an earlier one.
            ids = rng.integers(0, vocab, size=n_in).tolist()
            if tokenizer is None:
                specs.append(RequestSpec(ids, n_in, n_out))
            else:
                text = tokenizer.decode(ids, skip_special_tokens=True)
                specs.append(RequestSpec(text, len(tokenizer.encode(text, add_special_tokens=False)), n_out))
        return specs


@dataclass(frozen=True)
class ShareGPTDataset:
    path: str
    num_prompts: int
    output_len: int | None = None
    seed: int = 0

    def load(self, tokenizer=None) -> list[RequestSpec]:
        if tokenizer is None:
            raise UsageError("load.dataset.kind=sharegpt needs load.tokenizer=<local tokenizer dir> to count tokens")
        entries = _read_sharegpt(self.path)
        order = np.random.default_rng(self.seed).permutation(len(entries))
        specs: list[RequestSpec] = []
        for i in order.tolist():
            prompt, reply = entries[i]
            n_in = len(tokenizer.encode(prompt, add_special_tokens=False))
            n_out = self.output_len or len(tokenizer.encode(reply, add_special_tokens=False))
            if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
                continue
            specs.append(RequestSpec(prompt, n_in, int(n_out)))
            if len(specs) == self.num_prompts:
                break
        if not specs:
            raise UsageError(f"{self.path}: no conversation has a usable first human/gpt pair "
                             "(4 to 1024 prompt tokens, at most 2048 in all)")
        return specs


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise UsageError(f"load.dataset.path={path!r} is not a file; give a local ShareGPT JSON file "
                         "(e.g. ShareGPT_V3_unfiltered_cleaned_split.json)")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p} is not valid JSON ({e}); a ShareGPT file is a JSON list of conversations") from None
    if not isinstance(data, list):
        raise UsageError(f"{p} holds a JSON {type(data).__name__}; a ShareGPT file is a list of "
                         "{{\"conversations\": [{{\"from\": ..., \"value\": ...}}, ...]}}")
    pairs = []
    for entry in data:
        conv = entry.get("conversations") if isinstance(entry, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        try:
            pairs.append((str(conv[0]["value"]), str(conv[1]["value"])))
        except (KeyError, TypeError):
            continue
    if not pairs:
        raise UsageError(f"{p} has no entry with a 'conversations' list of at least two turns "
                         "({\"from\": ..., \"value\": ...}); is it ShareGPT-format?")
    return pairs


DATASETS = {"random": RandomDataset, "sharegpt": ShareGPTDataset}


def build_dataset(cfg: dict[str, Any], num_prompts: int, vocab_size: int, seed: int):
    kind = cfg.get("kind", "random")
    if kind == "random":
        return RandomDataset(num_prompts, int(cfg["input_len"]), int(cfg["output_len"]),
                             float(cfg.get("range_ratio", 1.0)), vocab_size, seed)
    if kind == "sharegpt":
        if not cfg.get("path"):
            raise UsageError("load.dataset.kind=sharegpt needs load.dataset.path=<local ShareGPT JSON>")
        out = cfg.get("output_len")
        return ShareGPTDataset(str(cfg["path"]), num_prompts, int(out) if out else None, seed)
    raise UsageError(f"load.dataset.kind={kind!r}; use one of {', '.join(DATASETS)}")
