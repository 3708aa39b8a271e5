# Two commands do all set-up on a fresh machine:
#   make demo   run masd's demo on loopback with its embedded defaults
#   make test   run the whole test suite (ruff, mypy, pytest)
# Both create the virtualenv .venv on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint typecheck pytest bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@

demo: $(BIN)/.installed
	$(BIN)/masd demo

test: lint typecheck pytest

lint: $(BIN)/.installed
	$(BIN)/ruff check masd tests
	$(BIN)/ruff format --check masd tests

typecheck: $(BIN)/.installed
	$(BIN)/mypy

pytest: $(BIN)/.installed
	$(BIN)/pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
