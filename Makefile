# make demo   - install what is needed, run local-demo end to end (up, follow, down --fetch-artifacts)
# make test   - install what is needed, run the test suite
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export SKYPILOT_DISABLE_USAGE_COLLECTION := 1

.PHONY: install test demo render render-check bench clean

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

render: install
	$(BIN)/launch render --all

render-check: install
	$(BIN)/launch render --check

bench: install
	$(BIN)/python bench/bench_cli.py
	@for b in bench/bench_data.py bench/bench_packing.py bench/bench_checkpoint.py; do \
	  [ -f $$b ] && $(BIN)/python $$b || true; done

clean:
	rm -rf $(VENV) artifacts .pytest_cache
