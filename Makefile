# Two commands matter: `make up` (run the local mesh) and `make test` (the whole suite).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: up test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

up: $(STAMP)
	$(VENV)/bin/tokenweir up -c examples/mesh.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: $(STAMP)
	bash scripts/ensure-system-deps.sh
	$(MAKE) lint
	$(VENV)/bin/pytest -q -p no:cacheprovider

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
