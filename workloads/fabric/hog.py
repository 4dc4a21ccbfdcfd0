"""A CPU/GEMM hog: the noisy neighbour that computes (noise kind `cpu`, workloads/fabric/noise.py).

One process multiplies two fp32 matrices in a loop on one BLAS thread until SIGINT (or
`--seconds`), then writes its own count: GEMMs done, seconds, and GFLOP/s (2·n³ flops per
GEMM). numpy only, so it starts in well under a second, without torch.

    python -m workloads.fabric.hog --out hog-0.json [--size 256] [--seconds 600]
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path


class _Stop(Exception):
    pass


def _stop(signum, frame):
    raise _Stop


def gflops(gemms: int, size: int, seconds: float) -> float:
    return 2 * size**3 * gemms / seconds / 1e9 if seconds > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workloads.fabric.hog")
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=600.0)
    args = ap.parse_args(argv)
    import numpy as np

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    a = np.random.default_rng(0).random((args.size, args.size), dtype=np.float32)
    b = a.T.copy()
    gemms, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < args.seconds:  # a launcher killed outright must not leave it spinning
            a @ b
            gemms += 1
    except _Stop:
        pass
    seconds = time.monotonic() - t0
    Path(args.out).write_text(json.dumps({"gemms": gemms, "size": args.size, "seconds": seconds,
                                          "gflop/s": gflops(gemms, args.size, seconds)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
