# The two commands of a fresh machine: `make plan` and `make test`.
STACK ?= prod-us-east-1
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: plan test clean

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

plan: $(VENV)/.installed
	$(PY) -m plan $(STACK)

test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n auto tests

clean:
	rm -rf $(VENV) .pytest_cache
