# make demo   - install what is needed, run local-demo end to end (up, follow, down --fetch-artifacts)
# make test   - install what is needed, run the test suite
# make lock   - re-resolve the GPU machine's lock (payload/requirements-gpu.lock) from its pins
# make gpu-check [ARGS=...] - on a GPU machine: the payload vs a plain Trainer, per mode (bench/README.md)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export SKYPILOT_DISABLE_USAGE_COLLECTION := 1

.PHONY: install test demo render render-check bench clean lock gpu-check gpu-check-smoke gpu-wheels

install: $(STAMP)

$(STAMP): pyproject.toml requirements/dev.txt requirements/skypilot.txt requirements/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# CPU torch first and pinned: an unpinned torch would pull several GB of CUDA wheels.
	$(BIN)/pip install -q --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/dev.txt -r requirements/skypilot.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps skypilot==0.14.1
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

demo: install
	bash scripts/demo.sh

# The GPU stack for the machine that trains, not this one: linux x86_64, Python 3.11, CUDA 12 (the
# torch wheel on PyPI). Wheels only, except deepspeed (pure Python with DS_BUILD_OPS=0). Existing pins
# are kept where they still fit; LOCK_FLAGS=--upgrade re-resolves everything.
UV_VERSION := 0.13.9
GPU_PLATFORM := --python-platform x86_64-manylinux_2_28 --python-version 3.11 --only-binary :all: --no-binary deepspeed
lock:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/uv --version 2>/dev/null | grep -q "$(UV_VERSION)" || \
	  $(BIN)/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(BIN)/uv pip compile -q $(GPU_PLATFORM) $(LOCK_FLAGS) --custom-compile-command "make lock" \
	  payload/requirements-gpu.txt -o payload/requirements-gpu.lock

render: install
	$(BIN)/launch render --all

render-check: install
	$(BIN)/launch render --check

bench: install
	$(BIN)/python bench/bench_cli.py
	@for b in bench/bench_data.py bench/bench_packing.py bench/bench_checkpoint.py bench/bench_manifest.py bench/bench_budget.py bench/bench_gpu_env.py; do \
	  [ -f $$b ] && $(BIN)/python $$b || true; done

# The GPU machine has no network and its own Python: use .venv where there is one, else python3.
GPU_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)

gpu-check:
	$(GPU_PY) bench/gpu_check.py $(ARGS)

gpu-check-smoke: install
	$(BIN)/python bench/gpu_check.py --smoke $(ARGS)

gpu-wheels: install
	$(BIN)/python bench/gpu_wheels.py $(ARGS)

clean:
	rm -rf $(VENV) artifacts .pytest_cache
