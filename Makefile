# Two commands matter: `make up` (run the local mesh) and `make test` (the whole suite).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the suite's workers: its integration tests mostly wait on processes, so more than the cores
TEST_WORKERS ?= 4

.PHONY: up test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# xds-protos ships an old copy of opentelemetry/proto/*_pb2.py; whichever wheel pip installs
	# last wins, so put opentelemetry-proto's own (newer) files back, or the OTLP exporter fails
	# to import (InstrumentationScope missing).
	$(PY) -m pip install -q --force-reinstall --no-deps \
	  "opentelemetry-proto==$$($(PY) -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/tokenweir up -c examples/mesh.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The serial tests (timings of a box they load) run beside the rest at a higher CPU priority:
# scripts/run-tests.sh says why.
test: $(STAMP)
	bash scripts/ensure-system-deps.sh
	$(MAKE) lint
	VENV=$(VENV) TEST_WORKERS=$(TEST_WORKERS) bash scripts/run-tests.sh

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
