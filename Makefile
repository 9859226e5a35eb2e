# The two commands of a fresh machine: `make plan` and `make test`. `make` alone lists the targets.
STACK ?= prod-us-east-1
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Checkov's own environment (requirements-checkov.txt: its boto3 pin contradicts the test tools')
CHECKOV_VENV := $(VENV)/checkov
# Passed to `python -m plan`: JSON=plan.json writes the plan document, DIAGRAM=docs/x.svg draws the picture,
# ARGS= anything else (for example ARGS="--against old.json").
PLAN_ARGS = $(if $(JSON),--json $(JSON)) $(if $(DIAGRAM),--diagram $(DIAGRAM)) $(ARGS)
PLAN ?= plan.json
# PYTHON named on the command line (or in the environment) and an existing $(VENV) of another Python version:
# rebuild $(VENV) with it, rather than keep planning with the old one. PYTHON's version is empty when it is missing,
# which the recipe then reports as missing.
_version = import sys; print("%d.%d" % sys.version_info[:2])
ifneq ($(filter command line environment,$(origin PYTHON)),)
VENV_VERSION := $(shell test -x $(PY) && $(PY) -c '$(_version)' 2>/dev/null)
WANT_VERSION := $(shell $(PYTHON) -c '$(_version)' 2>/dev/null)
ifneq ($(VENV_VERSION),)
ifneq ($(VENV_VERSION),$(WANT_VERSION))
REBUILD := $(VENV) has Python $(VENV_VERSION)
endif
endif
endif

.PHONY: help plan check test clean FORCE

help:
	@echo "make plan   [STACK=$(STACK)] [JSON=plan.json] [DIAGRAM=arch.svg] [ARGS=...]  offline plan of a stack (no AWS account)"
	@echo "make check  [PLAN=$(PLAN)]  run the policy pack on a plan document written with JSON="
	@echo "make test   install the test tools into $(VENV) and run the tests"
	@echo "make clean  remove $(VENV)"
	@echo "The first run of plan or test creates $(VENV) and installs requirements (1 to 2 minutes)."

$(VENV)/.installed: requirements.txt $(if $(REBUILD),FORCE)
	@command -v $(PYTHON) >/dev/null 2>&1 || \
	  { echo "$(PYTHON): not found; install Python 3.11 or newer, or name an installed one:" \
	         "make $(MAKECMDGOALS) PYTHON=python3.12" >&2; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || \
	  { echo "gpu-cloud needs Python 3.11 or newer; '$(PYTHON)' is not. Use: make $(MAKECMDGOALS) PYTHON=python3.11" >&2; exit 1; }
	$(if $(REBUILD),@echo "$(REBUILD) and PYTHON=$(PYTHON) is $(WANT_VERSION): rebuilding $(VENV) with it" >&2)
	$(if $(REBUILD),rm -rf $(VENV))
	@echo "installing requirements.txt into $(VENV) (first run only, 1 to 2 minutes)" >&2
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	@echo "installing requirements-dev.txt into $(VENV) (first run only, about a minute)" >&2
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

$(CHECKOV_VENV)/.installed: $(VENV)/.installed requirements-checkov.txt
	@echo "installing requirements-checkov.txt into $(CHECKOV_VENV) (first run only, about 20 seconds)" >&2
	test -x $(CHECKOV_VENV)/bin/python || $(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet -r requirements-checkov.txt
	touch $@

plan: $(VENV)/.installed
	$(PY) -m plan $(STACK) $(PLAN_ARGS)

check: $(VENV)/.installed
	$(PY) -m plan --policy-check $(PLAN)

test: $(VENV)/.installed-dev $(CHECKOV_VENV)/.installed
	$(PY) -m pytest -q -n auto tests

clean:
	rm -rf $(VENV) .pytest_cache

FORCE:
