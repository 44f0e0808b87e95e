# make demo   - install what is needed, run local-demo end to end (up, follow, down --fetch-artifacts)
# make test   - install what is needed, run the test suite
# make lock   - re-resolve the locks (requirements/dev.lock, requirements/dev-macos.lock,
#               requirements/sky-cli.lock, payload/requirements-gpu.lock, payload/requirements-local.lock)
#               from their inputs
# make gpu-check [ARGS=...] - on a GPU machine: the payload vs a plain Trainer, per mode (bench/README.md)
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SKY_CLI := .tools/sky-cli
SKY_STAMP := $(SKY_CLI)/.installed
SKY_LINK := ../../$(SKY_CLI)/bin/sky
export SKYPILOT_DISABLE_USAGE_COLLECTION := 1

.PHONY: cloud-test cloud-test-signals install lint test test-quick demo render render-check bench clean lock lock-check gpu-check gpu-check-smoke gpu-wheels

install: $(STAMP) $(SKY_STAMP)
	@[ "$$(readlink $(BIN)/sky)" = $(SKY_LINK) ] || { ln -sfn $(SKY_LINK) $(BIN)/sky && echo "$(BIN)/sky -> $(SKY_CLI)/bin/sky"; }

# The launcher/test environment is requirements/dev.lock, installed exactly (uv pip sync: what is not in
# the lock is removed, every wheel is checked against its hash). uv itself is bootstrapped at its
# pinned version into .tools/ from the package index. CPU torch (`torch==2.13.0+cpu` in the lock) comes
# from a local wheel folder where this machine has one, else from the PyTorch CPU index; set TORCH_CPU
# to point elsewhere (uv flags).
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE=1 is set (these
# machines, most containers) every `launch` command would recompile its ~3,700 imported modules (issue 32:
# `launch plan` 4.8 s instead of 2.5). The Makefile is a prerequisite so an existing .venv gets them too.
# The project's own launcher/ and payload/ (an editable install, not in site-packages) are compiled by
# compileall for the same reason (~80 modules, ~0.1 s a command; an edited module recompiles in memory).
UV_VERSION := 0.13.9
UV := .tools/bin/uv
TORCH_CPU ?= $(if $(wildcard /opt/wheels/torch-2.13.0+cpu-*.whl),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
export UV_LINK_MODE ?= copy

$(UV):
	test -x .tools/bin/python || $(PY) -m venv .tools
	.tools/bin/python -m pip install -q --disable-pip-version-check uv==$(UV_VERSION)

# The `sky` command is SkyPilot's CLI from its own environment, .tools/sky-cli = requirements/sky-cli.lock
# (the same SkyPilot, with the click<8.2 its CLI needs; .venv has click 8.5 for huggingface-hub, and
# there `sky launch` fails: "False backend is not supported."). .venv/bin/sky, which skypilot's wheel
# writes whenever a sync (re)installs it, is made a link to that `sky` by every `make install` (a check
# when it already is), so `.venv/bin/sky` and `sky` in an activated .venv are the working CLI.
$(SKY_STAMP): requirements/sky-cli.lock Makefile | $(UV)
	test -x $(SKY_CLI)/bin/python || $(UV) venv -q --python $(PY) $(SKY_CLI)
	$(UV) pip sync -q --compile-bytecode --python $(SKY_CLI)/bin/python requirements/sky-cli.lock
	touch $(SKY_STAMP)

# On macOS the same inputs are locked for arm64 (requirements/dev-macos.lock: the plain torch wheel, which is
# the CPU build there); everywhere else the Linux x86_64 lock.
# llama-cpp-python (the GGUF export's tests load the file in llama.cpp) is an sdist: built portable and
# without its tools, tests, server and OpenMP, ~3.5 min on 2 cores
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=OFF
DEV_LOCK := $(if $(filter Darwin,$(shell uname -s)),requirements/dev-macos.lock,requirements/dev.lock)
$(STAMP): pyproject.toml $(DEV_LOCK) Makefile | $(UV)
	test -x $(BIN)/python || $(UV) venv -q --python $(PY) $(VENV)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" DS_BUILD_OPS=0 $(UV) pip sync -q --compile-bytecode --python $(BIN)/python $(TORCH_CPU) $(DEV_LOCK)
	$(UV) pip install -q --compile-bytecode --python $(BIN)/python --no-deps --no-build-isolation -e .
	$(BIN)/python -m compileall -q launcher payload
	$(BIN)/python tests/installed.py  # the metadata of the installed tool's resolves (the tests' are offline), ~15 s
	touch $(STAMP)

# Three processes (pytest-xdist; a file and its module fixtures stay in one). The suite is CPU-bound
# (~720 CPU-s, most of it torch/transformers/peft/TRL imports in the ~100 processes its tests start that
# load them - trainers, torchrun, gpu-check's children: `python scripts/suite_census.py` counts them), but a test also waits on its processes
# (a poll, a signal, a checkpoint): with 2 workers on 2 cores, 117 CPU-s of the cores were idle (7 min 1 s);
# a third worker fills them (idle 28 CPU-s, 6 min 30 s). --durations=10: the 10 slowest.
# TEST_WORKERS=0 runs in this process only. PYTHONDONTWRITEBYTECODE is cleared for the suite: each local
# run's copy of payload/ and each test module (pytest's rewrite) is compiled once, not in every process
# (~0.1 s of CPU each for ~450 processes; the project's own modules are compiled by `make install`).
TEST_WORKERS ?= 3
test: install lint
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --durations=10 --ignore=tests/cloud/scenarios tests

# The unit tests for the inner loop: no test that runs whole programs (a trainer, torchrun, the installed
# launch, an OpenSSH server, SkyPilot's optimizer in a child: tests/conftest.py and @pytest.mark.slow mark
# them, each with its seconds). 727 of 1,189 tests; 1 min 7 s on 2 idle cores; make test stays the full suite.
test-quick: install
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile -m "not slow" --ignore=tests/cloud/scenarios tests

# ruff (pyproject.toml [tool.ruff]) and shellcheck on the shell launch runs (scripts/lint.sh says which;
# shellcheck is installed with apt where it can be, else skipped with the reason). ~3 s.
lint: install
	BIN=$(BIN) bash scripts/lint.sh

# The emulated RunPod (tests/cloud/README.md): the real SkyPilot drives the shipped cloud profiles on
# pods that are namespaces of this machine. Needs root; bakes its pod image once per lock (package index).
cloud-test: install
	@test "$$(id -u)" = 0 || { echo "make cloud-test needs root (network and mount namespaces)"; exit 1; }
	$(BIN)/python -m pytest -p no:cacheprovider -n 0 -rA -m "not signal_walk" --basetemp=/var/tmp/launch-cloud-test tests/cloud/scenarios

# `launch up` signalled at 20 points on the emulated RunPod, each provisioning a pod (~40 min on 2 cores;
# make cloud-test holds one point of it): tests/cloud/scenarios/test_signal_walk.py.
cloud-test-signals: install
	@test "$$(id -u)" = 0 || { echo "make cloud-test-signals needs root (network and mount namespaces)"; exit 1; }
	$(BIN)/python -m pytest -p no:cacheprovider -n 0 -rA -s -m signal_walk --basetemp=/var/tmp/launch-cloud-signals tests/cloud/scenarios

demo: install
	bash scripts/demo.sh

# `make lock` re-resolves every lock from its inputs, keeping existing pins where they still fit
# (LOCK_FLAGS=--upgrade upgrades on purpose), and records the inputs' hash in each lock's header;
# `make lock-check` (CI) fails while a lock is older than its inputs and names the file to refresh.
# - requirements/dev.lock: this machine's (launcher + tests), linux x86_64 / Python 3.11, with hashes;
#   requirements/dev-macos.lock: the same inputs for macOS arm64 (14+), what `make install` uses on a Mac.
# - payload/requirements-local.lock: the training stack of an installed launch on the user's machine
#   (launcher/trainenv.py), every platform in one lock (--universal), Python 3.11, with hashes.
# - requirements/sky-cli.lock: SkyPilot's CLI (`sky`), same platform, with hashes; the same skypilot as
#   dev.lock (lock-check fails otherwise), with SkyPilot's own pins (no overrides).
# - payload/requirements-gpu.lock: the GPU machine's, linux x86_64 / Python 3.11 / CUDA 12 (the torch
#   wheel on PyPI), wheels only except deepspeed (pure Python with DS_BUILD_OPS=0).
PLATFORM := --python-platform x86_64-manylinux_2_28 --python-version 3.11
MAC_PLATFORM := --python-platform aarch64-apple-darwin --python-version 3.11
GPU_PLATFORM := $(PLATFORM) --only-binary :all: --no-binary deepspeed
lock: | $(UV)
	$(UV) pip compile -q $(PLATFORM) --generate-hashes $(TORCH_CPU) $(LOCK_FLAGS) \
	  --overrides requirements/overrides.txt --custom-compile-command "make lock" \
	  pyproject.toml requirements/dev.in -o requirements/dev.lock
	MACOSX_DEPLOYMENT_TARGET=14.0 $(UV) pip compile -q $(MAC_PLATFORM) --generate-hashes $(LOCK_FLAGS) \
	  --overrides requirements/overrides.txt --custom-compile-command "make lock" \
	  pyproject.toml requirements/dev.in -o requirements/dev-macos.lock
	$(UV) pip compile -q --universal --python-version 3.11 --generate-hashes $(TORCH_CPU) $(LOCK_FLAGS) \
	  --custom-compile-command "make lock" payload/requirements-local.txt -o payload/requirements-local.lock
	$(UV) pip compile -q $(PLATFORM) --generate-hashes $(LOCK_FLAGS) --custom-compile-command "make lock" \
	  requirements/sky-cli.in -o requirements/sky-cli.lock
	$(UV) pip compile -q $(GPU_PLATFORM) $(LOCK_FLAGS) --custom-compile-command "make lock" \
	  payload/requirements-gpu.txt -o payload/requirements-gpu.lock
	$(PY) scripts/lock_inputs.py --write

lock-check:
	$(PY) scripts/lock_inputs.py --check

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
	$(GPU_PY) bench/gpu/gpu_check.py $(ARGS)

gpu-check-smoke: install
	$(BIN)/python bench/gpu/gpu_check.py --smoke $(ARGS)

gpu-wheels: install
	$(BIN)/python bench/gpu/gpu_wheels.py $(ARGS)

clean:
	rm -rf $(VENV) .tools artifacts .pytest_cache
