# The two commands of the README: `make demo` and `make test`. Each sets up what it needs.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bootstrap
bootstrap:
	@./scripts/bootstrap

demo: bootstrap
	$(PY) -m scheduledeventsd demo --hooks-dir etc/scheduledeventsd/hooks

lint: bootstrap
	$(VENV)/bin/ruff check scheduledeventsd tests
	$(VENV)/bin/ruff format --check scheduledeventsd tests
	$(VENV)/bin/mypy

test: bootstrap
	$(PY) -m pytest -q
