# The two commands a newcomer needs:
#   make demo   - run the zero-loss demo on the embedded default (SQLite, built-in worker)
#   make test   - set everything up and run the whole test suite (PostgreSQL and SQLite passes)
#   make test-fast - the inner loop: unit + ledger tiers, SQLite in memory, no OS process
#                    (~85 s CPU over one xdist worker per core: ~45 s wall on 2 idle cores, estimated)
#   make lint   - only the static checks: ruff, mypy over zeroloss/tests/benchmarks, migrations, check
#   make docs   - the documentation site (MkDocs), built strict into site/
#   make dist   - the sdist and the wheel a private package index serves, checked, into dist/
# Both create their own virtual environment. PYTHON picks the interpreter (3.11+), DJANGO
# pins a Django release, VENV names the environment (one per interpreter/Django pair):
#   make test PYTHON=python3.12 DJANGO='Django>=6.0,<6.2' VENV=.venv-dj6
# PSYCOPG=2 builds the environment with psycopg2 instead of psycopg 3 (Django picks psycopg 3
# whenever both are installed, so that environment has only psycopg2):
#   make test VENV=.venv-pg2 PSYCOPG=2 TEST_ARGS='--only postgres --skip-lint tests/ledger/test_psycopg2.py'

PYTHON ?= python3
VENV ?= .venv
DJANGO ?=
PSYCOPG ?= 3
BIN := $(VENV)/bin
STAMP := $(BIN)/.zeroloss-installed

.PHONY: demo test test-fast lint docs dist bench chaos clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "zeroloss needs Python 3.11 or newer: make ... PYTHON=python3.12")'
	$(PYTHON) -m venv $(VENV)
	@# dependency groups (pyproject.toml [dependency-groups]) need pip 25.1+
	$(BIN)/python -m pip install --quiet --disable-pip-version-check 'pip>=25.1'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e . --group dev $(if $(DJANGO),'$(DJANGO)')
	$(if $(filter 2,$(PSYCOPG)),$(BIN)/python -m pip uninstall --quiet -y psycopg psycopg-binary && $(BIN)/python -m pip install --quiet --disable-pip-version-check 'psycopg2-binary>=2.9')
	@touch $@

# The documentation site, built strict (a broken link or reference fails): site/ (make docs).
# Its own small environment: mkdocstrings reads zeroloss's source, it does not import it.
DOCS_STAMP := .venv-docs/bin/.zeroloss-docs-installed

$(DOCS_STAMP): pyproject.toml
	$(PYTHON) -m venv .venv-docs
	.venv-docs/bin/python -m pip install --quiet --disable-pip-version-check 'pip>=25.1'
	.venv-docs/bin/python -m pip install --quiet --disable-pip-version-check --group docs
	@touch $@

docs: $(DOCS_STAMP)
	.venv-docs/bin/python -m mkdocs build --strict --site-dir site

# What a company puts on its private index until zeroloss is on PyPI (docs/quickstart.md):
# built as a distribution builds it (an isolated PEP 517 build), then checked as PyPI would.
# Its own small environment (build and twine only): no test dependencies needed to package it.
DIST_STAMP := .venv-dist/bin/.zeroloss-dist-installed

$(DIST_STAMP): pyproject.toml
	$(PYTHON) -m venv .venv-dist
	.venv-dist/bin/python -m pip install --quiet --disable-pip-version-check 'build>=1.2' 'twine>=6.1'
	@touch $@

dist: $(DIST_STAMP)
	rm -rf dist
	.venv-dist/bin/python -m build --outdir dist .
	.venv-dist/bin/python -m twine check --strict dist/*

demo: $(STAMP)
	$(BIN)/python -m project.demo.run $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m tests.suite $(TEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m tests.suite --fast $(TEST_ARGS)

lint: $(STAMP)
	$(BIN)/python -m tests.suite --lint-only

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --group bench
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# The fault suite's soak (several minutes; starts its own PostgreSQL and Redis): docs/guarantees.md.
# CHAOS_ARGS=--quick runs its CI profile instead.
chaos: $(STAMP)
	$(BIN)/python -m benchmarks --only faults $(CHAOS_ARGS)

clean:
	rm -rf .venv .venv-* var build dist site *.egg-info
