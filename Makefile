# Two entry points for a fresh machine with Python 3.11 or newer: `make demo` and `make test`.
# Both install the exact versions of constraints.txt (setup.cfg holds ranges) into the virtual environment .venv,
# made with PYTHON: by default the first of python3.14 ... python3.11, python3, python on the PATH that is 3.11 or
# newer; `make demo PYTHON=/path/to/python3.12` names one.
# `make demo` installs only the package (what the demo needs); `make test` adds the test extra (the
# reference implementation: torch, transformers), the tpu extra (libtpu: the tests compile TPU programs ahead of time), the
# gpu-aot extra (jax's CUDA plugin, ptxas, cuDNN: the tests compile GPU programs ahead of time, no GPU needed) and the tf
# extra (TensorFlow's checkpoint reader, for Google's original checkpoints).
PYTHON ?= $(shell for p in python3.14 python3.13 python3.12 python3.11 python3 python; do \
    command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null \
    && { echo $$p; break; }; done)
VENV := .venv
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed

.PHONY: demo test

$(VENV)/bin/python:
	@test -n "$(PYTHON)" || { echo "make: no Python 3.11 or newer on the PATH (python3.14 ... python3.11, python3, \
	python); install one or name it: make $(MAKECMDGOALS) PYTHON=/path/to/python3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip

$(DEMO_STAMP): setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -c constraints.txt -e .
	touch $(DEMO_STAMP)

$(TEST_STAMP): setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[test,tpu,tf,gpu-aot]'
	touch $(TEST_STAMP)

# Task files for the demo's fine-tuning stages (and their training text for its corpus): SQuAD in
# $(SQUAD_DIR), GLUE's SST-2 in $(GLUE_DIR)/SST-2; by default the shared data folder when present, else the
# ignored folder .data, where `make demo` fetches them once (the download command, sha256-checked). Offline,
# the fetch says so in one line and the demo runs every stage it has files for, naming the ones it skipped
# and the command that fetches their files.
SQUAD_DIR ?= $(or $(wildcard ../shared/data/squad),.data/squad)
GLUE_DIR ?= $(or $(wildcard ../shared/data/glue),.data/glue)

.data/squad/dev-v1.1.json .data/glue/SST-2/dev.tsv: | $(DEMO_STAMP)
	@mkdir -p .data; $(VENV)/bin/python -m bert_jax.data.download $(if $(findstring squad,$@),squad,glue --tasks sst2) \
	    --output_dir $(dir $(patsubst %/SST-2/dev.tsv,%/,$@)) $(if $(DATA_MIRROR),--base_url $(DATA_MIRROR)) \
	    2>.data/fetch.err || echo "make demo: $(if $(findstring squad,$@),SQuAD,SST-2) not fetched \
	($$(tail -n 1 .data/fetch.err)); the demo skips its stage" >&2; rm -f .data/fetch.err

# The folders are passed only where they exist: offline, the demo skips what was not fetched.
demo: $(DEMO_STAMP) $(filter .data/%,$(SQUAD_DIR)/dev-v1.1.json $(GLUE_DIR)/SST-2/dev.tsv)
	SQUAD_DIR="$$(test -d $(SQUAD_DIR) && echo $(SQUAD_DIR))" GLUE_DIR="$$(test -d $(GLUE_DIR)/SST-2 && echo $(GLUE_DIR))" \
	    $(VENV)/bin/python -m bert_jax.demo

# The tests' data (tests/conftest.py reads BERT_JAX_DATA, default ../shared/data). When neither is there (a
# fresh clone), the public files are downloaded once into the ignored folder .data, checked against their
# sha256, and BERT_JAX_DATA points there. DATA_MIRROR: a mirror URL instead of the official homes.
ifeq ($(BERT_JAX_DATA)$(wildcard ../shared/data),)
export BERT_JAX_DATA := $(CURDIR)/.data
TEST_DATA := .data/README.md
endif

.data/README.md: | $(TEST_STAMP)
	@$(VENV)/bin/python -m bert_jax.data.download all --output_dir .data $(if $(DATA_MIRROR),--base_url $(DATA_MIRROR)) \
	    2>.data.err || { echo "make test: no test data: $$(tail -n 1 .data.err); set BERT_JAX_DATA to a folder \
	with the shared data, or rerun with a network (python -m bert_jax.data.download all --output_dir .data)" >&2; \
	rm -f .data.err; exit 1; }; rm -f .data.err

# Every tier (unit, integration, slow: tests/conftest.py) on TEST_WORKERS pytest-xdist worker processes (2);
# TEST_WORKERS=0 runs them in make's own pytest process.
TEST_WORKERS ?= 2

test: $(TEST_STAMP) $(TEST_DATA)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 tests
