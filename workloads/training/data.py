"""Training data: deterministic synthetic tokens, or a flat binary file of token ids.

Both yield (inputs, labels) pairs of shape (B, T) with labels = inputs shifted by one.
Batches are materialised on the device before timing starts, so the timed loop measures
the model and the fabric, not a data loader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workloads.core.errors import UsageError

TOKEN_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}
# Distinct batches kept on the device and cycled; enough that caching effects average
# out, few enough that a 6.7B run does not spend GPU memory on data.
POOL = 8


def synthetic_batches(*, seed: int, rank: int, vocab: int, micro_batch: int, seq: int, device) -> list:
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank)  # distinct, reproducible per rank
    out = []
    for _ in range(POOL):
        t = torch.randint(0, vocab, (micro_batch, seq + 1), generator=g)
        out.append((t[:, :-1].to(device), t[:, 1:].to(device)))
    return out


def check_token_file(path: str | None, dtype: str) -> Path:
    if not path:
        raise UsageError("data.kind=tokens needs data.path (a flat binary file of token ids)")
    if dtype not in TOKEN_DTYPES:
        raise UsageError(f"data.dtype={dtype!r}; use one of {', '.join(TOKEN_DTYPES)}")
    p = Path(path).expanduser()
    if not p.is_file():
        raise UsageError(f"token file {p} does not exist; set data.path to a flat binary of {dtype} token ids")
    itemsize = np.dtype(TOKEN_DTYPES[dtype]).itemsize
    if p.stat().st_size == 0:
        raise UsageError(f"token file {p} is empty; set data.path to a flat binary of {dtype} token ids")
    if p.stat().st_size % itemsize:
        raise UsageError(f"token file {p} is {p.stat().st_size} bytes, not a whole number of {dtype} ids")
    return p


def token_file_batches(
    *, path: str, dtype: str, seed: int, rank: int, world: int, vocab: int, micro_batch: int, seq: int, device
) -> list:
    p = check_token_file(path, dtype)
    tokens = np.memmap(p, dtype=TOKEN_DTYPES[dtype], mode="r")
    n_samples = (len(tokens) - 1) // seq
    need = micro_batch * world
    if n_samples < need:
        raise UsageError(
            f"token file {p} holds {len(tokens)} tokens: {n_samples} samples of {seq + 1}, "
            f"fewer than one global micro-batch ({need}); use a larger file or a shorter train.seq_length"
        )
    order = np.random.default_rng(seed).permutation(n_samples)
    mine = order[rank::world]  # disjoint per rank, as a DistributedSampler would give
    out = []
    for b in range(min(POOL, len(mine) // micro_batch)):
        idx = mine[b * micro_batch : (b + 1) * micro_batch]
        t = torch.from_numpy(np.stack([tokens[i * seq : i * seq + seq + 1].astype(np.int64) for i in idx]))
        if int(t.max()) >= vocab:
            raise UsageError(f"token file {p} holds id {int(t.max())}, beyond the model's vocabulary ({vocab})")
        out.append((t[:, :-1].to(device), t[:, 1:].to(device)))
    return out
