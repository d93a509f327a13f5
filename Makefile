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

demo: $(STAMP)
	$(VENV)/bin/python -m bert_jax.demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests
