# Tether — `make run` starts it, `make test` tests it. Both set everything up first.
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
export TETHER_HOME ?= $(CURDIR)/var

.PHONY: run test lint unit bench chaos chaos-ci load install clean

$(STAMP): pyproject.toml scripts/requirements.py
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

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m bench

chaos: $(STAMP)
	$(PY) -m bench.chaos

chaos-ci: $(STAMP)
	$(PY) -m bench.chaos --short

load: $(STAMP)
	$(PY) -m bench.load

clean:
	rm -rf $(VENV) var
