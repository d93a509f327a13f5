#!/usr/bin/env bash
# Runs bert_jax on a Cloud TPU VM pod: create the slice, ship the package (code only) to every worker and
# install it, start pre-training (or another entry point) on all workers, stream worker 0's log until its
# process exits, and with --delete delete the slice when the script ends (training done, a failed step,
# a preemption that breaks the log stream, or Ctrl-C / SIGTERM).
#
#   launch/tpu_vm_pod.sh --name bert-base --zone europe-west4-a --accelerator_type v3-32 \
#       --workdir gs://my-bucket/bert-base --delete -- --config pretrain:base \
#       '--config.phases[0].data_dir=gs://my-bucket/docs' \
#       '--config.phases[1].data_dir=gs://my-bucket/docs'
#
# Check the program first, on any machine: `python -m bert_jax.aot --topology TYPE` with the same --config
# arguments as after `--` (the script prints that command; bert_jax.aot takes gcloud's TYPE as is).
# To resume after a preemption: with --delete the slice is gone, so run the same command again (a new slice;
# the run continues from the newest checkpoint in --workdir). Without --delete, add --no_create while the
# slice is READY; a preempted slice never is again: delete it, then run the command without --no_create.
#
# Options:
#   --name NAME               the TPU VM (with --queued, also the queued resource's name)      required
#   --zone ZONE               e.g. europe-west4-a                                               required
#   --accelerator_type TYPE   gcloud's: v3-32, v4-32, v5litepod-16, v5p-32, v6e-16 (the generations   required
#                             bert_jax.aot compiles for; another type needs --runtime_version)
#   --workdir URI             the run directory, gs://... on a multi-host slice                 required
#   --runtime_version V       the TPU VM image (default: the one for TYPE's generation: v3, v4
#                             tpu-ubuntu2204-base; v5litepod v2-alpha-tpuv5-lite; v5p v2-alpha-tpuv5;
#                             v6e v2-alpha-tpuv6e)
#   --module M                the entry point (default bert_jax.train; e.g. bert_jax.tasks.squad)
#   --spot                    a spot slice (cheaper, preemptible)
#   --queued                  obtain the slice through a queued resource (waits until it is ACTIVE)
#   --no_create               use the existing slice NAME, which must be READY (checked): how to restart the
#                             training on a slice that is still up (the run continues from the newest
#                             checkpoint in --workdir, never from scratch); never after --delete
#   --no_follow               do not stream worker 0's log
#   --delete                  delete the slice (and the queued resource) when the script ends
#   --dry_run                 print every remote command instead of running it (the archive is built)
#   -h, --help                this text
# Everything after `--` goes to the entry point. Only the package ships (the `bert_jax/` sources and the
# build files, from `git archive HEAD` in a git checkout): data and outputs never do. On a multi-host slice
# (more than 8 cores or chips) every worker must reach the workdir and data, so local paths are refused.
# Workers use the image's Python if it is >= 3.11, else install CPython 3.11 with uv (needs internet).
set -euo pipefail

NAME="" ZONE="" ACCELERATOR="" RUNTIME="" WORKDIR="" MODULE="bert_jax.train"
PROJECT_DIR="bert_jax" DRY_RUN=0 DELETE=0 CREATE=1 FOLLOW=1 SPOT=0 QUEUED=0
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator_type) ACCELERATOR="$2"; shift 2 ;;
    --runtime_version) RUNTIME="$2"; shift 2 ;;
    --workdir) WORKDIR="$2"; shift 2 ;;
    --module) MODULE="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --queued) QUEUED=1; shift ;;
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
# The TPU VM image (gcloud's --version / --runtime-version) for JAX on each TPU generation, as Google Cloud's
# "TPU software versions" page gives them (https://cloud.google.com/tpu/docs/runtimes#pytorch_and_jax): v4 and
# older tpu-ubuntu2204-base, v5e v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e (Trillium) v2-alpha-tpuv6e.
# TYPE is gcloud's accelerator type (a v5e slice is v5litepod-N there; bert_jax.aot's topology_for maps it).
runtime_for() {  # TYPE -> the image on stdout; status 1 for a type of no known generation
  [[ $1 =~ ^(v3|v4|v5litepod|v5p|v6e)-[0-9]+$ ]] || return 1
  case "${BASH_REMATCH[1]}" in
    v3|v4) echo tpu-ubuntu2204-base ;;
    v5litepod) echo v2-alpha-tpuv5-lite ;;
    v5p) echo v2-alpha-tpuv5 ;;
    v6e) echo v2-alpha-tpuv6e ;;
  esac
}
if [[ -z $RUNTIME ]]; then
  if ! RUNTIME=$(runtime_for "$ACCELERATOR"); then
    if [[ $ACCELERATOR =~ ^v5e-([0-9]+)$ ]]; then
      echo "tpu_vm_pod.sh: --accelerator_type $ACCELERATOR is bert_jax.aot's name: gcloud's is v5litepod-${BASH_REMATCH[1]}" >&2
    else
      echo "tpu_vm_pod.sh: --accelerator_type $ACCELERATOR is not one of v3-N, v4-N, v5litepod-N, v5p-N, v6e-N (gcloud's names): give --runtime_version to use it as is" >&2
    fi
    exit 2
  fi
fi
# A slice of more than 8 cores (v3) or chips (v4, v5) spans several hosts: every path must be shared.
SIZE=${ACCELERATOR##*-}
if [[ $SIZE =~ ^[0-9]+$ && $SIZE -gt 8 ]]; then
  for value in "--workdir=$WORKDIR" "$@"; do
    case "$value" in
      --workdir=*|--config.*data_dir=*|--config.init_checkpoint=*|--config.train_file=*|--config.predict_file=*)
        path="${value#*=}"
        if [[ -n $path && $path != gs://* ]]; then
          echo "tpu_vm_pod.sh: ${value%%=*}=$path is a local path, but $ACCELERATOR spans several hosts: use a gs:// URI" >&2
          exit 2
        fi ;;
    esac
  done
fi

if [[ $CREATE == 1 ]]; then echo "runtime image: $RUNTIME (for $ACCELERATOR; --runtime_version overrides)"; fi
quote() {  # a word as bash and zsh both read it back: as is when plain, else in single quotes
  if [[ $1 =~ ^[A-Za-z0-9_./:=,@+-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
if [[ $MODULE == bert_jax.train ]]; then  # the program these arguments train, compiled for the slice on any machine
  printf 'aot check (any machine with libtpu): python -m bert_jax.aot --topology %s' "$(quote "$ACCELERATOR")"
  AOT_NEXT=0
  for value in "$@"; do  # the --config arguments: the recipe and its --config.* overrides
    if [[ $AOT_NEXT == 1 || $value == --config || $value == --config=* || $value == --config.* ]]; then
      printf ' %s' "$(quote "$value")"
    fi
    AOT_NEXT=0; [[ $value == --config ]] && AOT_NEXT=1
  done
  printf '\n'
fi

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
QR=(gcloud compute tpus queued-resources)
ENTRY_ARGS=$(printf ' %q' --workdir "$WORKDIR" "$@")
SRC="$(cd "$(dirname "$0")/.." && pwd)"
SPOT_FLAG=(); [[ $SPOT == 1 ]] && SPOT_FLAG=(--spot)

if [[ $CREATE == 0 ]]; then  # resuming on a slice that must still be up: not deleted (--delete), not preempted
  DESCRIBE=("${TPU[@]}" describe "$NAME" --zone "$ZONE" --format='value(state)')
  printf '+'; printf ' %q' "${DESCRIBE[@]}"; printf '\n'
  if [[ $DRY_RUN == 0 ]]; then
    STATE=$("${DESCRIBE[@]}" 2>/dev/null || true)
    if [[ $STATE != READY ]]; then
      echo "tpu_vm_pod.sh: --no_create, but slice $NAME in $ZONE is ${STATE:-not there (deleted, e.g. by a run with --delete)}, not READY: run the same command without --no_create (a new slice; the run resumes from the newest checkpoint in --workdir), after deleting a preempted slice" >&2
      exit 2
    fi
  fi
else
  if [[ $QUEUED == 1 ]]; then
    run "${QR[@]}" create "$NAME" --node-id "$NAME" --zone "$ZONE" --accelerator-type "$ACCELERATOR" \
      --runtime-version "$RUNTIME" "${SPOT_FLAG[@]}"
    run_waiting bash -c "until [ \"\$(${QR[*]} describe $NAME --zone $ZONE --format='value(state.state)')\" = ACTIVE ]; do sleep 30; done"
  else
    run "${TPU[@]}" create "$NAME" --zone "$ZONE" --accelerator-type "$ACCELERATOR" --version "$RUNTIME" \
      "${SPOT_FLAG[@]}"
  fi
fi
ARCHIVE=/tmp/bert_jax_src-$$.tgz
# From here on, however the script ends (EXIT runs on success and on errors, set -e; INT and TERM exit
# through it): the archive goes (kept with --dry_run), and with --delete the slice (and the training on it).
finish() {
  if [[ -n $WAITING ]]; then kill "$WAITING" 2>/dev/null || true; fi
  if [[ $DRY_RUN == 0 ]]; then rm -f "$ARCHIVE"; fi
  if [[ $DELETE == 1 ]]; then
    if [[ $QUEUED == 1 ]]; then
      run "${QR[@]}" delete "$NAME" --zone "$ZONE" --force --quiet
    else
      run "${TPU[@]}" delete "$NAME" --zone "$ZONE" --quiet
    fi
  fi
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Python >= 3.11 on each worker (jax needs it): the image's python3 if new enough (python3.11 first), else
# a standalone CPython 3.11 installed by uv (pip-installed for the user; the Ubuntu 22.04 TPU images ship
# Python 3.10).
FIND_PYTHON='PY=$(command -v python3.11 || true); if [ -z "$PY" ]; then if python3 -c "import sys; sys.exit(sys.version_info < (3, 11))"; then PY=python3; else python3 -m pip install -q --user uv && ~/.local/bin/uv python install 3.11 && PY=$(~/.local/bin/uv python find 3.11); fi; fi'
# The package only: the committed sources (git archive of HEAD) in a checkout, else the same paths from
# the tree; built locally even with --dry_run.
SHIP=(bert_jax setup.cfg pyproject.toml constraints.txt README.md)
if git -C "$SRC" rev-parse --verify -q HEAD > /dev/null 2>&1; then
  if [[ -n $(git -C "$SRC" status --porcelain -- "${SHIP[@]}" 2>/dev/null) ]]; then
    echo "tpu_vm_pod.sh: uncommitted changes under ${SHIP[*]} are not shipped (git archive of HEAD)" >&2
  fi
  printf '+ git archive HEAD -> %s\n' "$ARCHIVE"
  git -C "$SRC" archive --format=tar.gz -o "$ARCHIVE" HEAD -- "${SHIP[@]}"
else
  printf '+ tar %s -> %s\n' "${SHIP[*]}" "$ARCHIVE"
  tar --exclude=__pycache__ -czf "$ARCHIVE" -C "$SRC" "${SHIP[@]}"
fi
if [[ $DRY_RUN == 1 ]]; then echo "archive: $ARCHIVE"; fi
run "${TPU[@]}" scp "$ARCHIVE" "$NAME:~/bert_jax_src.tgz" --zone "$ZONE" --worker=all
run "${TPU[@]}" ssh "$NAME" --zone "$ZONE" --worker=all --command \
  "rm -rf $PROJECT_DIR && mkdir -p $PROJECT_DIR && tar -xzf bert_jax_src.tgz -C $PROJECT_DIR && cd $PROJECT_DIR && $FIND_PYTHON && \$PY -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[tpu,gcs]'"
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
