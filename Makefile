# The two set-up commands are `make demo` and `make test`; both install first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Python's bytecode cache stays on (its default) even where the environment turns it off:
# without it every test process, server, study driver and Ray worker compiles this project
# from source again, and pytest re-rewrites every test module (the fast tier: 2m48s -> 1m55s
# on 2 cores). The caches are __pycache__ folders, which git ignores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo test test-fast lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || { \
	  echo "error: Python 3.11 is needed, and '$(PYTHON)' is $$(command -v $(PYTHON) >/dev/null && $(PYTHON) --version 2>/dev/null || echo 'not found')." >&2; \
	  echo "Install Python 3.11, then name it: make demo PYTHON=python3.11 (or make test PYTHON=...)" >&2; \
	  exit 1; }
	@echo "== installing into $(VENV): this project (-e) with torch 2.13 (pinned; the build pip finds), Ray Tune/Train,"
	@echo "   Optuna, optuna-dashboard, FastAPI, uvicorn, SQLAlchemy, psycopg and the dev tools"
	@echo "   (pytest, pytest-xdist, ruff, import-linter, schemathesis); a few minutes on a fresh machine"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)
	@echo "== installed; $(VENV)/bin/hpo is the CLI"

# The service end to end: hpo serve (SQLite + local Ray), the digits TPE+ASHA study
# submitted over REST, its progress, the best trial, the dashboard address, a clean stop.
demo: install
	BIN=$(BIN) bash examples/serve-demo.sh examples/digits-tpe-asha.yaml

lint: install
	$(BIN)/lint-imports
	$(BIN)/ruff check .

# Everything, in 2 processes (pytest-xdist; each has its own local Ray when a test needs one):
# the suite waits on Ray, servers and subprocesses about a third of the time on 2 cores.
# The 25 slowest tests are listed at the end (the suite's time is theirs, mostly).
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25

# The fast tier: lint and every test that needs neither Ray nor a server and is not marked
# slow (markers in pyproject.toml, set from fixtures by tests/tiers.py), in 2 processes.
test-fast: lint
	$(BIN)/python -m pytest -q -n 2 -m "not ray and not server and not slow"

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
