# Every target creates .venv on first use and installs effectgate into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench campaign clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

# A fresh world each time: the demo's ledger, checkpoints and services live in
# .effectgate-demo/ (run `effectgate demo` yourself on a kept state directory to
# see a second run stop at the duplicate mail).
demo: $(STAMP)
	rm -rf .effectgate-demo
	$(BIN)/effectgate demo --approve all --state-dir .effectgate-demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest -n 2 -q tests

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

campaign: $(STAMP)
	$(BIN)/python benchmarks/campaign.py --trials 1000 --out benchmarks/results/campaign.json

clean:
	rm -rf $(VENV) .effectgate .effectgate-demo .pytest_cache .mypy_cache .ruff_cache
