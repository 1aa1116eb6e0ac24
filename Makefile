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

# The suite writes bytecode even where the environment says not to (PYTHONDONTWRITEBYTECODE=1
# in some images): else each of the 5 collections rewrites and compiles all ~370 test modules
# (19 s of CPU each instead of 9) and every service process a test starts compiles our
# packages again (-16% CPU over a sample of integration and unit files). __pycache__ is ignored.
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest

test: $(STAMP)
	bash scripts/ensure-system-deps.sh
	$(MAKE) lint
	$(PYTEST) -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
	  -m "not serial"
	$(PYTEST) -q -p no:cacheprovider -m serial

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
