#!/bin/bash
# The wheels a GPU machine without a package index needs beside its image's own Python 3.12,
# torch, numpy, aiohttp, ... (the image of the first runs, docs/gpu.md), at the lock's versions,
# into .gpu/whl (git-ignored through .git/info/exclude). run.sh installs them onto PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.gpu/whl
mkdir -p "$out"
UV=.tools/bin/uv
pins=$($UV export --frozen --no-hashes --no-dev)
pin() { grep -i "^$1==" <<<"$pins" | cut -d' ' -f1; }
binary=(orjson pydantic-core pydantic annotated-types typing-inspection typing-extensions hjson hydra-core omegaconf)
.tools/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$out" $(for p in "${binary[@]}"; do pin "$p"; done)
# sdists only on PyPI; DeepSpeed builds without its ops when no torch is importable, which is
# how the lock installs it (its ops are JIT-built on first use)
.tools/bin/python -m pip wheel -q --no-deps -w "$out" "$(pin deepspeed)" "$(pin antlr4-python3-runtime)"
ls "$out"
