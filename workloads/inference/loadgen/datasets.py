"""Datasets: `load(tokenizer) -> list[RequestSpec]`, one small class per kind, and the
prompt plan of a sweep (`PromptPlan`): which prompts each point's warm-up and measured
requests send.

- random: input and output lengths drawn uniformly from [L·r, L] (SGLang's
  `--random-range-ratio`; r = 1 gives exactly L). Prompts are random token ids: sent as
  ids when there is no tokenizer (the completions API accepts a list of ints), else
  decoded to text and re-measured with the tokenizer.
- sharegpt: a local ShareGPT-format JSON file (a list of {"conversations": [{"from":
  "human", "value": ...}, {"from": "gpt", ...}]}); the first human turn is the prompt,
  the reply's token count the output length unless `output_len` fixes it. Pairs with a
  prompt or reply under 4 tokens, a prompt over 1024 or a total over 2048 are dropped,
  as vLLM's benchmark does. Repeated prompts in the file are kept once.

Why a plan: vLLM's prefix caching and SGLang's radix cache answer a prompt they have seen
from cache, so a resent prompt skips prefill (TTFT collapses) and with it the TP prefill
all-reduce traffic the fabric comparison measures. So a sweep never resends a prompt:
every point gets its own warm-up prompts and its own measured prompts (slots 2k and 2k+1
for the k-th entry of load.points), disjoint from every other slot's. random draws each
slot from its own seed (load.seed, run, trial, slot: `run_salt`, so another run or trial
draws other prompts too) and redraws any prompt already sent in the sweep; sharegpt deals
the file, shuffled by (load.seed, run, trial), out slot by slot, and when the file is too
small it wraps round (repeats across points, said in the record and warned about).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workloads.core.errors import UsageError
from workloads.models.tokenizer import load_tokenizer  # noqa: F401  (re-exported for the load side)


@dataclass(frozen=True)
class RequestSpec:
    prompt: str | list[int]
    prompt_len: int   # tokens
    output_len: int   # tokens asked for (max_tokens, with ignore_eos)


def prompt_key(prompt: str | list[int]) -> bytes:
    """16-byte digest of a prompt (text or token ids): what "the same prompt" means."""
    raw = prompt.encode() if isinstance(prompt, str) else np.asarray(prompt, dtype=np.int64).tobytes()
    return hashlib.blake2b(raw, digest_size=16, person=b"s" if isinstance(prompt, str) else b"i").digest()


_REDRAWS = 20  # attempts to draw a prompt not yet sent before accepting a repeat (tiny vocab^len)


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
    seed: int | tuple[int, ...] = 0  # a tuple seeds numpy's SeedSequence: (load.seed, slot)

    def load(self, tokenizer=None) -> list[RequestSpec]:
        return self.load_unique(tokenizer, set())[0]

    def load_unique(self, tokenizer, seen: set[bytes]) -> tuple[list[RequestSpec], int]:
        """Prompts none of which is in `seen` (redrawn when one is; `seen` gains them all),
        and how many had to repeat anyway because vocab^length is too small."""
        rng = np.random.default_rng(self.seed)
        ins = _lengths(rng, self.num_prompts, self.input_len, self.range_ratio, "input_len")
        outs = _lengths(rng, self.num_prompts, self.output_len, self.range_ratio, "output_len")
        vocab = len(tokenizer) if tokenizer is not None else self.vocab_size
        specs, repeats = [], 0
        for n_in, n_out in zip(ins.tolist(), outs.tolist()):
            for _ in range(_REDRAWS):
                ids = rng.integers(0, vocab, size=n_in).tolist()
                # Decoding can map different ids to one text: the text is what is sent.
                prompt = ids if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=True)
                key = prompt_key(prompt)
                if key not in seen:
                    break
            else:
                repeats += 1
            seen.add(key)
            n = n_in if tokenizer is None else len(tokenizer.encode(prompt, add_special_tokens=False))
            specs.append(RequestSpec(prompt, n, n_out))
        return specs, repeats


@dataclass(frozen=True)
class ShareGPTDataset:
    path: str
    num_prompts: int
    output_len: int | None = None
    seed: int | tuple[int, ...] = 0

    def load(self, tokenizer=None) -> list[RequestSpec]:
        """Up to num_prompts usable pairs with distinct prompts, in a seeded random order."""
        if tokenizer is None:
            raise UsageError("load.dataset.kind=sharegpt needs load.tokenizer=<local tokenizer dir> to count tokens")
        entries = _read_sharegpt(self.path)
        order = np.random.default_rng(self.seed).permutation(len(entries))
        specs: list[RequestSpec] = []
        seen: set[str] = set()
        for i in order.tolist():
            prompt, reply = entries[i]
            if prompt in seen:  # ShareGPT repeats some first turns; a resend is a cache hit
                continue
            n_in = len(tokenizer.encode(prompt, add_special_tokens=False))
            n_out = self.output_len or len(tokenizer.encode(reply, add_special_tokens=False))
            if n_in < 4 or n_out < 4 or n_in > 1024 or n_in + n_out > 2048:
                continue
            seen.add(prompt)
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


def run_salt(run_id: str, trial: int) -> tuple[int, int]:
    """The run's own part of its prompt seeds: every run (run id) and trial draws other prompts,
    so a server that outlives one run (server=external, a shared endpoint) cannot answer a later
    run's prompts from its prefix cache. A resumed run (same run id) draws the same ones."""
    digest = hashlib.blake2b(str(run_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1, int(trial)  # 63 bits: a JSON-safe integer in the record


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


@dataclass
class PointPrompts:
    warmup: list[RequestSpec]
    measured: list[RequestSpec]
    info: dict[str, Any] = field(default_factory=dict)  # goes into the record as `dataset`


class PromptPlan:
    """The prompts of one sweep: point k (its index in load.points, stable when a resumed
    sweep appends points) sends warm-up slot 2k, then measured slot 2k+1. Slots are built
    in order, skipped (already recorded) points included, so a point's prompts do not
    depend on where a sweep was resumed."""

    def __init__(self, cfg: dict[str, Any], tokenizer, vocab_size: int, seed: int, warmup: int,
                 counts: list[int], warn=print, salt: tuple[int, ...] = ()) -> None:
        self.kind = cfg.get("kind", "random")
        self.cfg, self.tokenizer, self.vocab_size, self.seed = cfg, tokenizer, vocab_size, int(seed)
        self.salt = tuple(int(x) for x in salt)  # the run's own part of every seed (run_salt)
        self.warmup, self.counts = int(warmup), [int(n) for n in counts]
        self._built: dict[int, PointPrompts] = {}
        self._next = 0            # first point not built yet
        self._seen: set[bytes] = set()
        self.short = False        # sharegpt: the file holds fewer prompts than the sweep sends
        if self.kind == "sharegpt":
            self._deal_sharegpt(warn)
        else:
            build_dataset(cfg, 1, vocab_size, seed)  # bad kind / lengths fail here, before a server starts

    def point(self, k: int) -> PointPrompts:
        while self.kind != "sharegpt" and self._next <= k:  # sharegpt is dealt whole at start
            self._built[self._next] = self._random(self._next)
            self._next += 1
        return self._built[k]

    def release(self, k: int) -> None:
        """Drop a point's prompts once sent (a long rate sweep holds thousands per point)."""
        self._built.pop(k, None)

    def _random(self, k: int) -> PointPrompts:
        def slot(s: int, n: int):
            ds = build_dataset(self.cfg, n, self.vocab_size, self.seed)
            return RandomDataset(n, ds.input_len, ds.output_len, ds.range_ratio, ds.vocab_size,
                                 (self.seed, *self.salt, s)).load_unique(self.tokenizer, self._seen)

        warm, wrep = slot(2 * k, self.warmup) if self.warmup else ([], 0)
        meas, mrep = slot(2 * k + 1, self.counts[k])
        return PointPrompts(warm, meas, {
            "kind": "random", "seed": [self.seed, *self.salt, 2 * k + 1],
            "warmup_seed": [self.seed, *self.salt, 2 * k],
            "prompts_unique": len({prompt_key(s.prompt) for s in meas}), "prompts_seen_before": mrep,
            "warmup_seen_before": wrep, "repeats_across_points": mrep > 0})

    def _deal_sharegpt(self, warn) -> None:
        need = sum(self.warmup + n for n in self.counts)
        ds = build_dataset(self.cfg, need, self.vocab_size, (self.seed, *self.salt) if self.salt else self.seed)
        pool = ds.load(self.tokenizer)
        u = len(pool)
        if u <= self.warmup:
            raise UsageError(f"{ds.path}: {u} usable distinct prompts, not more than load.warmup_requests="
                             f"{self.warmup}; lower the warm-up or use a larger ShareGPT file")
        self.short = u < need
        if self.short:
            warn(f"warning: {ds.path} holds {u} usable distinct prompts but this sweep sends {need} (warm-up + "
                 f"measured over {len(self.counts)} points): prompts repeat across points and a server prefix cache "
                 "(SGLang radix cache, vLLM prefix caching) may answer them, lowering TTFT and prefill traffic. Use a "
                 "larger file or fewer requests, or set load.flush_cache_path.")
        cursor, used = 0, set()
        for k, n in enumerate(self.counts):
            # Deal round the shuffled pool: warm-up and measured of one point never overlap.
            warm = [(cursor + i) % u for i in range(self.warmup)]
            meas = [(cursor + self.warmup + i) % u for i in range(min(n, u - self.warmup))]
            cursor += self.warmup + len(meas)
            seen_before = len(used.intersection(meas))
            used.update(warm, meas)
            self._built[k] = PointPrompts([pool[i] for i in warm], [pool[i] for i in meas], {
                "kind": "sharegpt", "seed": [self.seed, *self.salt] if self.salt else self.seed, "file_prompts": u, "prompts_unique": len(meas),
                "prompts_seen_before": seen_before, "repeats_across_points": self.short})
