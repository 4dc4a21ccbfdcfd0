# The two commands (README): `make train` runs the main job, `make test` runs the tests.
# Both bootstrap uv into .tools/ if it is not on PATH, then use the lock file.
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
export OMP_NUM_THREADS ?= 1

.PHONY: train test sync bench

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
