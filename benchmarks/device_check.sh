#!/usr/bin/env bash
# The accelerator check: BERT-Base and BERT-Large, phase 1 (128) and phase 2 (512, packed), bfloat16, bert_jax
# beside transformers' BertForPreTraining in the same run (benchmarks/device_check.py; about 5 minutes on one
# H100). Needs the gpu and test extras: pip install -e '.[gpu,test]'. Extra arguments go to the script
# (e.g. --out table.json, --peak_tflops 989).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python}" benchmarks/device_check.py --sizes base,large "$@"
