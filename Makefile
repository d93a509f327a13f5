# Two entry points for a fresh machine with Python 3.11: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test

$(STAMP): setup.cfg pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test,tpu]'
	touch $(STAMP)

# SQuAD files for the demo's last stage: $(SQUAD_DIR), by default the shared data folder when present.
SQUAD_DIR ?= $(wildcard ../shared/data/squad)

demo: $(STAMP)
	SQUAD_DIR="$(SQUAD_DIR)" $(VENV)/bin/python -m bert_jax.demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests
