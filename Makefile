# The two commands of the README's quick start, and their building blocks.
#   make run   - set up the venv and run the baseline stack locally
#   make test  - set up the venv, lint the Python code (ruff, settings in
#                pyproject.toml), then (as root) the Slurm test cluster, the
#                Apptainer toolbox and Charliecloud, and run the whole test suite
#   make lint  - the lint step alone: ruff over the Python code, shellcheck over the
#                scripts of tests/cluster/ and container/ (tests/cluster/shellcheck.sh)
#   make bench - the benchmarks (table + plot), see benchmarks/run.py;
#                make bench BENCH_ARGS=--full adds the million-task rows
PYTHON ?= python3
BENCH_ARGS ?=
# Test processes: most of the suite waits (for Slurm's status checks, a time limit, a gate),
# so more processes than CPUs; the multi-node tests run as two chains (one per set of the test
# cluster's namespaced nodes), each one after another on one of them.
TEST_PROCESSES ?= 6
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: run test lint bench venv cluster purge clean

run: $(STAMP)
	$(VENV)/bin/snakemake --cores 4

# The suite on $(TEST_PROCESSES) processes (the order they get the tests in: tests/conftest.py).
test: $(STAMP) lint
	bash tests/cluster/prepare.sh
	. tests/cluster/env.sh && $(VENV)/bin/pytest -c tests/pytest.ini -n $(TEST_PROCESSES) --dist load \
		--durations=40 tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	bash tests/cluster/shellcheck.sh

# Benchmarks (prints a table, writes benchmarks/output/benchmarks.png); needs Dask and matplotlib.
bench: $(STAMP)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r benchmarks/requirements.txt
	. tests/cluster/env.sh && $(VENV)/bin/python benchmarks/run.py $(BENCH_ARGS)

venv: $(STAMP)

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $(STAMP)

cluster:
	bash tests/cluster/prepare.sh

# Stop and remove the real parts and everything they installed (root): the next `make test`
# starts them from nothing, as on a fresh machine.
purge:
	bash tests/cluster/prepare.sh purge

clean:
	rm -rf results logs state .snakemake
