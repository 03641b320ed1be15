# The two set-up commands are `make demo` and `make test`; both install first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required, found " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The service end to end: hpo serve (SQLite + local Ray), the digits TPE+ASHA study
# submitted over REST, its progress, the best trial, the dashboard address, a clean stop.
demo: install
	BIN=$(BIN) bash examples/serve-demo.sh examples/digits-tpe-asha.yaml

lint: install
	$(BIN)/lint-imports
	$(BIN)/ruff check .

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
