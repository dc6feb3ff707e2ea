#!/usr/bin/env bash
# Cloud TPU VM pod: create it, copy this checkout to every worker, install, check the
# cluster, train, follow the log, resume after preemption, delete.
#
#   launch/tpu_pod.sh create     # gcloud compute tpus tpu-vm create (SPOT=1: a spot VM)
#   launch/tpu_pod.sh copy       # the tracked files of this checkout -> ~/vmx on all workers
#   launch/tpu_pod.sh install    # venv with vmx[train] and jax[tpu] on all workers
#   launch/tpu_pod.sh check      # every process prints its devices, one all-reduce
#   launch/tpu_pod.sh train [launch/train.py flags]   # on all workers, in the background
#   launch/tpu_pod.sh log        # the last lines of worker 0's log
#   launch/tpu_pod.sh resume [flags]   # after preemption: recreate, copy, install, train
#   launch/tpu_pod.sh delete
#
# Settings (environment): TPU_NAME (vmx), ZONE (us-central2-b), ACCELERATOR (v4-32),
# RUNTIME (tpu-ubuntu2204-base), PROJECT (gcloud's default), SPOT (empty), GIN_FILE
# (contrastive_24l.gin), MODEL_DIR (required for train/resume: a directory every worker
# sees, e.g. a Filestore NFS mount or a gcsfuse-mounted bucket; the run resumes from its
# newest intact checkpoint), VMX_DATA_DIR (optional: where the workers find the data,
# otherwise each downloads what it needs to its cache).
# A spot preemption loses nothing since the last step: the maintenance event's SIGTERM
# makes every worker save the same step (JAX's preemption sync point) and exit 75 with a
# `preempted: ... saved MODEL_DIR/checkpoint_<step>` line in the log; `resume` continues
# from that checkpoint.
set -euo pipefail
TPU_NAME="${TPU_NAME:-vmx}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR="${ACCELERATOR:-v4-32}"
RUNTIME="${RUNTIME:-tpu-ubuntu2204-base}"
GIN_FILE="${GIN_FILE:-contrastive_24l.gin}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone="$ZONE")
if [ -n "${PROJECT:-}" ]; then WHERE+=(--project="$PROJECT"); fi

on_all_workers() {
  "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=all --command="$1"
}

create() {
  local spot=()
  if [ -n "${SPOT:-}" ]; then spot=(--spot); fi
  "${GCLOUD[@]}" create "$TPU_NAME" "${WHERE[@]}" --accelerator-type="$ACCELERATOR" \
    --version="$RUNTIME" "${spot[@]}"
}

copy() {
  local archive
  archive="$(mktemp -d)/vmx.tar.gz"
  git -C "$REPO" ls-files -z | tar -C "$REPO" --null -T - -czf "$archive"
  "${GCLOUD[@]}" scp "$archive" "$TPU_NAME":vmx.tar.gz "${WHERE[@]}" --worker=all
  on_all_workers "mkdir -p ~/vmx && tar -xzf ~/vmx.tar.gz -C ~/vmx"
}

install() {
  on_all_workers "cd ~/vmx && python3 -m venv .venv && . .venv/bin/activate && \
pip install -q -U pip && pip install -q -e '.[train]' 'jax[tpu]>=0.10,<0.11'"
}

run_train() {
  : "${MODEL_DIR:?set MODEL_DIR (a directory every worker sees)}"
  local flags data=""
  flags="$(printf ' %q' "--gin_file=$GIN_FILE" "--gin.MODEL_DIR=$MODEL_DIR" --multihost "$@")"
  if [ -n "${VMX_DATA_DIR:-}" ]; then data="VMX_DATA_DIR=$(printf '%q' "$VMX_DATA_DIR") "; fi
  on_all_workers "cd ~/vmx && . .venv/bin/activate && ${data}nohup python launch/train.py${flags} \
> ~/vmx_train.log 2>&1 < /dev/null &"
  echo "training in the background on every worker; follow it with: $0 log"
}

state() {
  "${GCLOUD[@]}" describe "$TPU_NAME" "${WHERE[@]}" --format='value(state)' 2>/dev/null || true
}

cmd="${1:-}"
if [ $# -gt 0 ]; then shift; fi
case "$cmd" in
  create) create ;;
  copy) copy ;;
  install) install ;;
  check) on_all_workers "cd ~/vmx && . .venv/bin/activate && \
python launch/train.py --multihost --check_cluster" ;;
  train) run_train "$@" ;;
  log) "${GCLOUD[@]}" ssh "$TPU_NAME" "${WHERE[@]}" --worker=0 --command="tail -n 40 ~/vmx_train.log" ;;
  resume)
    # A preempted (spot) or failed TPU VM cannot be restarted: delete and recreate it; the
    # run continues from the newest intact checkpoint in MODEL_DIR.
    s="$(state)"
    echo "TPU $TPU_NAME state: ${s:-absent}"
    if [ "$s" != "READY" ]; then
      if [ -n "$s" ]; then "${GCLOUD[@]}" delete "$TPU_NAME" "${WHERE[@]}" --quiet; fi
      create
      copy
      install
    fi
    run_train "$@" ;;
  delete) "${GCLOUD[@]}" delete "$TPU_NAME" "${WHERE[@]}" --quiet ;;
  *) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
