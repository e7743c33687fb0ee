# Every target creates .venv on first use and installs into it what it needs:
# `make demo` the runtime dependencies only, `make test` the test extra,
# `make notebooks` the notebooks extra, `make bench` the bench extra.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/pip install --progress-bar on

.PHONY: demo test lint typecheck bench bench-latency campaign campaign-pg-faults answer-machine server-kills browser notebooks lowest-deps clean

$(BIN)/python:
	@echo "== creating $(VENV) with $(PY) -m venv"
	$(PY) -m venv $(VENV)
	$(PIP) --upgrade pip

# One stamp per set of extras, remade when pyproject.toml changes.
$(VENV)/.installed-runtime: pyproject.toml | $(BIN)/python
	@echo "== installing effectgate and its runtime dependencies into $(VENV) (first run: about a minute)"
	$(PIP) -e .
	touch $@

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	@echo "== installing effectgate with the '$*' extra into $(VENV) (first run: a few minutes)"
	$(PIP) -e '.[$*]'
	touch $@

# A fresh world each time: the demo's ledger, checkpoints and services live in
# .effectgate-demo/ (run `effectgate demo` yourself on a kept state directory to
# see a second run stop at the duplicate mail).
demo: $(VENV)/.installed-runtime
	rm -rf .effectgate-demo
	$(BIN)/effectgate demo --approve all --state-dir .effectgate-demo

lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy

# Three pytest workers on two cores: a third of the suite's time is spent waiting
# (on child processes, servers and slow-service faults), so a third worker fills
# it (measured on 2 cores: 1,137 s with -n 2, 912 s with -n 3, the same tests passed both ways).
test: $(VENV)/.installed-test lint typecheck
	$(BIN)/python -m pytest -n 3 -q tests

# The review page (web/review, built with npm) in headless Chromium against
# `langgraph dev`: approve, edit, reject, a double click, a reload and a killed
# server, one effect each. Needs Debian's chromium (apt-get install chromium) and
# npm; screenshots go to .browser-shots/.
browser: $(VENV)/.installed-test
	cd web/review && npm ci --no-audit --no-fund
	EFFECTGATE_REQUIRE_BROWSER=1 EFFECTGATE_BROWSER_SHOTS=$(CURDIR)/.browser-shots \
		$(BIN)/python -m pytest -q -p no:cacheprovider -n 0 -s tests/browser

# Pair each notebooks/NN_*.py (jupytext percent format, the source) with its
# .ipynb, then execute every notebook in place so the committed copies carry
# their outputs. Re-run after any change that alters what the walkthroughs print.
notebooks: $(VENV)/.installed-notebooks
	$(BIN)/jupytext --sync notebooks/[0-9]*.py
	cd notebooks && for nb in [0-9]*.ipynb; do \
		echo "== executing notebooks/$$nb"; \
		MPLBACKEND=Agg ../$(BIN)/jupyter nbconvert --to notebook \
			--execute --inplace --ExecutePreprocessor.timeout=120 \
			--ExecutePreprocessor.startup_timeout=180 "$$nb" || exit 1; \
	done
	$(BIN)/jupytext --sync notebooks/[0-9]*.py

bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/run_all.py

# Scale-out under real model latency (500 ms a call): 1, 2, 4, 8 worker processes x 10
# threads in flight, effectgate and plain LangGraph side by side on PostgreSQL
# (EFFECTGATE_TEST_POSTGRES, default the local server's `test` database; a fresh schema
# per run, dropped after). About 10 minutes, mostly waiting on the model's latency.
bench-latency: $(VENV)/.installed-bench $(VENV)/.installed-postgres
	$(BIN)/python benchmarks/bench_latency.py

# The single-thread campaign on SQLite, then 4 `effectgate worker` processes and a
# reviewer on PostgreSQL (a fresh schema per trial on EFFECTGATE_TEST_POSTGRES,
# default the local server).
campaign: $(VENV)/.installed-bench $(VENV)/.installed-postgres
	$(BIN)/python benchmarks/campaign.py --trials 1000 --out benchmarks/results/campaign.json
	$(BIN)/python benchmarks/campaign.py --trials 1000 --systems effectgate-pg-workers \
		--out benchmarks/results/campaign_pg_workers.json

# 4 `effectgate worker` processes and a reviewer on a private PostgreSQL cluster
# (initdb/pg_ctl of the installed PostgreSQL, one per trial running at once) behind a
# TCP proxy: SIGKILLs, pg_terminate_backend, fast and immediate restarts, dropped
# connections and SIGSTOP past the lease, at random moments and at every seam (6.5 s a
# trial with --jobs 2 at rest, measured on 16 trials: about 1.8 hours for 1,000, more
# under load; the suite runs 3 trials).
campaign-pg-faults: $(VENV)/.installed-bench $(VENV)/.installed-postgres
	$(BIN)/python benchmarks/campaign.py --trials 1000 --systems effectgate-pg-faults \
		--jobs 2 --out benchmarks/results/campaign_pg_faults.json

# The answer state machine with more runs and longer ones than the suite's bounded version.
answer-machine: $(VENV)/.installed-test
	EG_ANSWER_MACHINE_EXAMPLES=40 EG_ANSWER_MACHINE_STEPS=20 $(BIN)/python -m pytest -q \
		-p no:cacheprovider tests/answers/test_answer_machine.py

# `langgraph dev` killed at every seam of an approved effect and restarted: one ticket,
# one mail, one note each (about a minute per seam; the suite runs AFTER_EXTERNAL_COMMIT).
server-kills: $(VENV)/.installed-test
	EG_SERVER_KILLS=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 2 \
		tests/server/test_server_kills.py

# The lowest versions pyproject.toml allows for each direct dependency, in a
# throwaway venv, must still run the demo, the CLI and the OpenAI model path.
lowest-deps:
	bash .ci/lowest-deps

clean:
	rm -rf $(VENV) .browser-shots .effectgate .effectgate-demo .pytest_cache .mypy_cache .ruff_cache
