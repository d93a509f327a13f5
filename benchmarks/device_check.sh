#!/usr/bin/env bash
# The accelerator check, in three processes (a crash in one leaves the others' output), on one NVIDIA GPU:
#   1. the gpu kernel set's fused attention (flash_gpu with and without its in-kernel dropout, cuDNN) against
#      plain jnp, value and gradients, bfloat16 at L = 128 and 512, and their fwd+bwd times (under a minute);
#   2. dropout masks on BERT-Large's attention probabilities: flax with threefry, rbg and unsafe_rbg against the
#      hashed dropout (benchmarks/dropout_masks.py; seconds);
#   3. BERT-Base and BERT-Large, phase 1 (128) and packed phase 2 (512), bfloat16, bert_jax beside transformers'
#      BertForPreTraining in the same run (benchmarks/device_check.py): a line per row as it is measured, compile
#      times, then one markdown table. Rows not started within DEADLINE_S seconds (default 300) are skipped, and at
#      DEADLINE_S + 120 the table of the rows done is printed and the check ends, so it always ends with a table.
# Needs the gpu and test extras (pip install -e '.[gpu,test]'), or an image with its own jax, torch and
# transformers. Extra arguments go to stage 3, e.g. --out device_check.json, --peer_compile (the peer under
# torch.compile too), --variants kernels=reference,attention_probs_dropout_prob=0, --extras_sizes large,
# --peak_tflops 989.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python || command -v python3)}"
timeout "${KERNEL_CHECK_TIMEOUT_S:-150}" "$PYTHON" benchmarks/device_check.py --gpu_tests --sizes none \
    || echo "device_check.sh: the kernel checks exited with status $?"
timeout "${DROPOUT_TIMEOUT_S:-90}" "$PYTHON" benchmarks/dropout_masks.py \
    || echo "device_check.sh: dropout_masks.py exited with status $?"
exec "$PYTHON" benchmarks/device_check.py --sizes base,large --deadline_s "${DEADLINE_S:-300}" "$@"
