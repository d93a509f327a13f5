#!/usr/bin/env bash
# Runs bert_jax on a Cloud TPU VM pod: create the TPU VM, install the project on every worker, start
# pre-training (or another entry point) on all workers with a gs:// workdir, stream worker 0's log
# until its process exits, and with --delete delete the TPU VM when the script ends (training done,
# a failed step, or Ctrl-C / SIGTERM). --dry_run prints every command instead of running it.
#
#   launch/tpu_vm_pod.sh --name bert-base --zone europe-west4-a --accelerator_type v3-32 \
#       --workdir gs://my-bucket/bert-base -- --config pretrain:base \
#       --config.model.dtype=bfloat16 --config.phases[0].data_dir=gs://my-bucket/p1 \
#       --config.phases[1].data_dir=gs://my-bucket/p2
#
# Everything after `--` goes to the entry point (default bert_jax.train; --module picks another).
# Workers use the image's Python if it is >= 3.11, else install CPython 3.11 with uv (needs internet).
set -euo pipefail

NAME="" ZONE="" ACCELERATOR="" RUNTIME="tpu-ubuntu2204-base" WORKDIR="" MODULE="bert_jax.train"
PROJECT_DIR="bert_jax" DRY_RUN=0 DELETE=0 CREATE=1 FOLLOW=1
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator_type) ACCELERATOR="$2"; shift 2 ;;
    --runtime_version) RUNTIME="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --module) MODULE="$2"; shift 2 ;;
    --no_create) CREATE=0; shift ;;
    --no_follow) FOLLOW=0; shift ;;
    --delete) DELETE=1; shift ;;
    --dry_run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "tpu_vm_pod.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for var in NAME ZONE ACCELERATOR WORKDIR; do
  if [[ -z "${!var}" ]]; then
    flag=$(echo "$var" | tr 'A-Z' 'a-z'); [[ $var == ACCELERATOR ]] && flag=accelerator_type
    echo "tpu_vm_pod.sh: --$flag is required" >&2; exit 2
  fi
done

run() {  # prints the command; runs it unless --dry_run
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ $DRY_RUN == 0 ]]; then "$@"; fi
}
WAITING=""
run_waiting() {  # as run, but in the background while the script waits, so that INT / TERM act at once
  printf '+'; printf ' %q' "$@"; printf '\n'
  if [[ $DRY_RUN == 0 ]]; then "$@" & WAITING=$!; wait "$WAITING"; WAITING=""; fi
}

TPU=(gcloud compute tpus tpu-vm)
ENTRY_ARGS=$(printf ' %q' --workdir "$WORKDIR" "$@")
SRC="$(cd "$(dirname "$0")/.." && pwd)"

if [[ $CREATE == 1 ]]; then
  run "${TPU[@]}" create "$NAME" --zone "$ZONE" --accelerator-type "$ACCELERATOR" --version "$RUNTIME"
fi
if [[ $DELETE == 1 ]]; then
  # From here on, however the script ends, the VM goes (and the training on it): EXIT runs on success
  # and on errors (set -e); INT and TERM exit through it.
  delete_vm() {
    if [[ -n $WAITING ]]; then kill "$WAITING" 2>/dev/null || true; fi
    run "${TPU[@]}" delete "$NAME" --zone "$ZONE" --quiet
  }
  trap delete_vm EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
fi
# Python >= 3.11 on each worker (jax needs it): the image's python3 if new enough (python3.11 first), else
# a standalone CPython 3.11 installed by uv (pip-installed for the user; the Ubuntu 22.04 TPU images ship
# Python 3.10).
FIND_PYTHON='PY=$(command -v python3.11 || true); if [ -z "$PY" ]; then if python3 -c "import sys; sys.exit(sys.version_info < (3, 11))"; then PY=python3; else python3 -m pip install -q --user uv && ~/.local/bin/uv python install 3.11 && PY=$(~/.local/bin/uv python find 3.11); fi; fi'
# The working tree (without .venv, caches or data) to every worker, then the install.
run tar --exclude=.venv --exclude=.git --exclude='*.egg-info' --exclude=__pycache__ -czf /tmp/bert_jax_src.tgz \
  -C "$SRC" .
run "${TPU[@]}" scp /tmp/bert_jax_src.tgz "$NAME:~/" --zone "$ZONE" --worker=all
run "${TPU[@]}" ssh "$NAME" --zone "$ZONE" --worker=all --command \
  "mkdir -p $PROJECT_DIR && tar -xzf bert_jax_src.tgz -C $PROJECT_DIR && cd $PROJECT_DIR && $FIND_PYTHON && \$PY -m venv .venv && .venv/bin/pip install -q -e '.[tpu,gcs]'"
# Every worker runs the same program; jax.distributed finds the pod's other hosts itself. Each worker
# keeps the process id in run.pid.
run "${TPU[@]}" ssh "$NAME" --zone "$ZONE" --worker=all --command \
  "cd $PROJECT_DIR && { nohup .venv/bin/python -m $MODULE --jax_distributed$ENTRY_ARGS > run.log 2>&1 & echo \$! > run.pid; }"
# Worker 0's log until its process exits (tail --pid); with --delete and --no_follow, the same wait
# without the log.
if [[ $FOLLOW == 1 ]]; then
  run_waiting "${TPU[@]}" ssh "$NAME" --zone "$ZONE" --worker=0 --command \
    "cd $PROJECT_DIR && tail -n +1 -F --pid=\$(cat run.pid) run.log"
elif [[ $DELETE == 1 ]]; then
  run_waiting "${TPU[@]}" ssh "$NAME" --zone "$ZONE" --worker=0 --command \
    "cd $PROJECT_DIR && while kill -0 \$(cat run.pid) 2>/dev/null; do sleep 60; done"
fi
