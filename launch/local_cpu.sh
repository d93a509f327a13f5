#!/usr/bin/env bash
# Pre-training (or any bert_jax entry point) on a laptop CPU with 8 simulated devices: the same code and
# flags as on a TPU pod, e.g.
#   launch/local_cpu.sh --config pretrain:tiny --workdir /tmp/run \
#       --config.phases[0].data_dir=data/p1 --config.phases[1].data_dir=data/p2 --config.mesh.tensor=2
# BERT_JAX_MODULE picks another entry point (default bert_jax.train). glibc's malloc is tuned so that XLA:CPU
# keeps each step's temporary buffer mapped between steps (bert_jax/host_malloc.py; BERT_JAX_MALLOC_TUNING=off
# keeps glibc's defaults).
set -euo pipefail
cd "$(dirname "$0")/.."
export XLA_FLAGS="${XLA_FLAGS:---xla_force_host_platform_device_count=8}"
export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
PYTHON="${PYTHON:-.venv/bin/python}"
GLIBC_TUNABLES="$("$PYTHON" -m bert_jax.host_malloc)"
export GLIBC_TUNABLES
exec "$PYTHON" -m "${BERT_JAX_MODULE:-bert_jax.train}" "$@"
