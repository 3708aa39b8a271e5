# Two commands do all set-up on a fresh machine:
#   make demo   run masd's demo on loopback with its embedded defaults
#               (installs masd and its runtime dependencies only)
#   make test   run the whole test suite (ruff, mypy, pytest; installs the test tools too)
# Both create the virtualenv .venv on first use.  While changing masd,
#   make check  runs ruff, mypy and every test not marked slow (under 90 s on two cores);
#               make test, which CI runs, runs every test.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test check lint typecheck pytest bench clean package example-secrets openapi

$(BIN)/python:
	@echo "make: creating the virtualenv $(VENV) (first use only)"
	$(PYTHON) -m venv $(VENV)
	@echo "make: upgrading pip in $(VENV)"
	$(BIN)/python -m pip install --quiet --upgrade pip

# masd and what it needs to run: all that `make demo` installs.
$(BIN)/.runtime: pyproject.toml | example-secrets $(BIN)/python
	@echo "make: installing masd and its runtime dependencies into $(VENV)" \
		"(half a minute on first use)"
	$(BIN)/python -m pip install --quiet -e .
	touch $@

# ... and the test tools (pytest, pytest-xdist, hypothesis, jsonschema, ruff, mypy) for
# `make test` and `make check`.
$(BIN)/.installed: pyproject.toml | example-secrets $(BIN)/python
	@echo "make: installing masd, its runtime dependencies and the test tools into $(VENV)" \
		"(about a minute on first use)"
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(BIN)/.runtime $@

# git keeps no file modes: the example's placeholder secrets get the 0600 masd asks of
# every secret, so `masd check-config packaging/masd.toml.example` warns about no mode
# (it refuses the placeholders themselves). Runs before every target that uses the virtualenv.
example-secrets:
	@chmod 600 packaging/secrets-example/*.token

demo: $(BIN)/.runtime
	$(BIN)/masd demo

test: lint typecheck pytest

check: lint typecheck
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow"

lint: $(BIN)/.installed
	$(BIN)/ruff check masd tests
	$(BIN)/ruff format --check masd tests

typecheck: $(BIN)/.installed
	$(BIN)/mypy

# One test process per core (pytest-xdist); a test file's tests all run in one process, so a
# module's fixtures (a running masd, a built package) are set up once.  Tests pick their own
# loopback ports (masd.testing.net) and write only below their tmp_path.
# PYTEST_PARALLEL= (empty) runs them in this one process instead.
PYTEST_PARALLEL ?= -n auto --dist loadfile

pytest: $(BIN)/.installed
	$(BIN)/pytest $(PYTEST_PARALLEL)

# docs/openapi.json, the OpenAPI description GET /openapi.json serves (tests/test_openapi.py
# fails while the file differs from what masd would serve).
openapi: $(BIN)/.runtime
	$(BIN)/python -m masd.edges.http > docs/openapi.json

# The Debian package, dist/masd_<version>_<arch>.deb (see packaging/README.md).
package:
	packaging/deb/build dist

# Benchmarks side by side with the limits and the peers (bench/, docs/performance.md).
# `make bench` takes about 30 minutes and rewrites the measured part of docs/performance.md;
# BENCH_ARGS adds options of `python -m bench.run` (e.g. BENCH_ARGS="--sections intake").
# Needs root for Dovecot and smtp-source/smtp-sink/wrk/dovecot-lmtpd (.ci/setup.d/bench.sh).
BENCH_DIR ?= /var/tmp/masd-bench
BENCH_ARGS ?=

bench: $(BIN)/.installed
	$(BIN)/python -m pip install --quiet -r bench/requirements.txt
	-test -x $(BENCH_DIR)/mailman-venv/bin/runner || { $(PYTHON) -m venv $(BENCH_DIR)/mailman-venv \
		&& $(BENCH_DIR)/mailman-venv/bin/python -m pip install --quiet mailman; }
	$(BIN)/python -m bench.run --workdir $(BENCH_DIR)/run --mailman-venv $(BENCH_DIR)/mailman-venv \
		--out docs/performance.md $(BENCH_ARGS)

# The benchmark with tiny counts (what tests/test_bench_smoke.py runs); prints, writes nothing.
bench-smoke: $(BIN)/.installed
	$(BIN)/python -m bench.run --smoke --workdir $(BENCH_DIR)/smoke

.PHONY: bench-smoke

# CPU per mail and rate of the working tree beside an older commit, alternated on the same
# load (bench/compare.py): make bench-compare REV=0679ee1 [COMPARE_ARGS="--count 2000"].
# COMPARE_ARGS="--instructions --rounds 1" counts instructions per mail under callgrind instead
# (the same for the same work: a change of one per cent shows; needs valgrind).
REV ?= HEAD
COMPARE_ARGS ?=
bench-compare: $(BIN)/.installed
	$(BIN)/python -m bench.compare $(REV) $(COMPARE_ARGS)

.PHONY: bench-compare

# The conformance suite (conformance/README.md): every flow of both roles against this masd.
conformance: $(BIN)/.installed
	$(BIN)/masd conformance run

.PHONY: conformance

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
