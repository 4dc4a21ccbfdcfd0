# The two commands (README): `make train` runs the main job, `make test` runs the tests.
# Both bootstrap uv into .tools/ if it is not on PATH, then use the lock file.
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
export OMP_NUM_THREADS ?= 1

.PHONY: train test sync bench gpu-check

.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install -q uv

sync: $(UV)
	$(UV) sync --frozen

train: sync
	$(UV) run --frozen python launch/train.py $(ARGS)

test: sync
	$(UV) run --frozen pytest $(PYTEST_ARGS)

bench: sync
	$(UV) run --frozen python benchmarks/train_overhead.py

# The GPU acceptance check (README "GPU status"): NCCL training, collectives, the reference
# engine and transport verdicts on this machine's 1-8 GPUs, one table, non-zero on a mismatch.
gpu-check: sync
	$(UV) run --frozen python launch/gpu_check.py $(ARGS)
