#!/usr/bin/env bash
# Pre-training (or any bert_jax entry point) on a laptop CPU with 8 simulated devices: the same code and
# flags as on a TPU pod, e.g.
#   launch/local_cpu.sh --config pretrain:tiny --workdir /tmp/run \
#       --config.phases[0].data_dir=data/p1 --config.phases[1].data_dir=data/p2 --config.mesh.tensor=2
# BERT_JAX_MODULE picks another entry point (default bert_jax.train). glibc's malloc is tuned so that XLA:CPU
# keeps each step's temporary buffer mapped between steps (bert_jax/training/host_malloc.py; BERT_JAX_MALLOC_TUNING=off
# keeps glibc's defaults).
# The Python it runs: $PYTHON if set; else the first of `python3`, `python` on PATH (an activated virtual
# environment's, the one `pip install -e .` installed into) that has bert_jax and jax; else the repository's
# .venv/bin/python if there is one. XLA_FLAGS and JAX_PLATFORMS already set are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
has_bert_jax='import importlib.util as u, sys; sys.exit(not (u.find_spec("bert_jax") and u.find_spec("jax")))'
if [[ -z "${PYTHON:-}" ]]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "$has_bert_jax" >/dev/null 2>&1; then
      PYTHON="$candidate"
      break
    fi
  done
fi
if [[ -z "${PYTHON:-}" && -x .venv/bin/python ]]; then
  PYTHON=.venv/bin/python
fi
if [[ -z "${PYTHON:-}" ]]; then
  echo "local_cpu.sh: no python3 or python on PATH has bert_jax and jax installed, and there is no .venv here:" \
       "activate the environment you installed bert_jax into (pip install -e .), or set PYTHON=/path/to/python" >&2
  exit 1
fi
GLIBC_TUNABLES="$("$PYTHON" -m bert_jax.training.host_malloc)"
export GLIBC_TUNABLES
exec "$PYTHON" -m "${BERT_JAX_MODULE:-bert_jax.train}" "$@"
