# Tether — `make run` starts it, `make test` tests it. Both set everything up first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
export TETHER_HOME ?= $(CURDIR)/var
# `make test` never shares a home with `make run` in the same checkout (database, the workers'
# status cache, workspaces, static files): the suite and its lint get their own.
TETHER_TEST_HOME ?= $(TETHER_HOME)/test
# Test processes side by side (pytest-xdist; each has its own database, home and Redis database).
# Most tests wait on processes, sockets and leases rather than the CPU, so more than the cores.
TEST_WORKERS ?= 4

# Python caches bytecode here whatever the environment says: with PYTHONDONTWRITEBYTECODE set,
# every process compiled its modules again, and each pytest process rewrote its plugins' modules.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test check lint unit bench chaos chaos-ci chaos-cuts load house install clean

$(STAMP): pyproject.toml scripts/requirements.py scripts/system-packages.sh
	@scripts/system-packages.sh
	@test -x $(PY) || "$$(scripts/find-python.sh)" -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip >/dev/null
	@$(PY) scripts/requirements.py test > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	@touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) manage.py migrate --noinput
	$(PY) manage.py serve

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# Which tests a lane runs, as a pytest marker expression (e.g. TEST_MARKS="not browser"); empty: all.
# Give it here, not as `-m` in PYTEST_ARGS: pytest heeds only the last `-m`, and the lanes add their own.
TEST_MARKS ?=
ALONE_OUT  := $(if $(strip $(TEST_MARKS)),not alone and ($(TEST_MARKS)),not alone)
ALONE_ONLY := $(if $(strip $(TEST_MARKS)),alone and ($(TEST_MARKS)),alone)
# The `alone` tests (a burst that takes most of PostgreSQL's connections, a herd of sockets that
# takes the machine) run after the side-by-side run, one at a time. Exit 5: none was selected.
RUN_ALONE   = $(PY) -m pytest -p no:xdist -m "$(ALONE_ONLY)" $(PYTEST_ARGS) || test $$? -eq 5

# The whole suite on the embedded default (SQLite + the ORM broker): side by side, then the `alone` tests.
test: export TETHER_HOME := $(TETHER_TEST_HOME)
test: lint
	@scripts/system-packages.sh chromium
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "$(ALONE_OUT)" $(PYTEST_ARGS)
	$(RUN_ALONE)

# The fast lane while changing code: lint, then every test that starts no browser, no server or
# worker process and waits on nothing slow (`-m "not slow and not browser"`; the `alone` tests are slow).
check: export TETHER_HOME := $(TETHER_TEST_HOME)
check: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal -m "not slow and not browser and not alone$(if $(strip $(TEST_MARKS)), and ($(TEST_MARKS)))" $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

chaos: $(STAMP)
	$(PY) -m bench.chaos

chaos-ci: $(STAMP)
	$(PY) -m bench.chaos --short

chaos-cuts: $(STAMP)
	$(PY) -m bench.chaos --cuts

# `make load LOAD_ARGS=--burst`: every start and every viewer at the same instant (see bench/load.py).
load: $(STAMP)
	$(PY) -m bench.load $(LOAD_ARGS)

# The house's figures: module and function sizes, complexity, imports, the import contract (scripts/house.py).
house: $(STAMP)
	$(PY) scripts/house.py

clean:
	rm -rf $(VENV) var
