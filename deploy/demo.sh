#!/usr/bin/env bash
# `make run`: starts memprofd on its embedded defaults, drives a short demo
# with memprofctl, then leaves the daemon serving in the foreground until
# Ctrl-C. Steps for capabilities this build lacks are skipped (status lists
# the features built).
set -euo pipefail
BUILD=${1:-build}
MEMPROFD="$BUILD/server/memprofd"
CTL="$BUILD/client/memprofctl"
ADDR=127.0.0.1:50051
METRICS=127.0.0.1:9464
SNAPSHOT_ROOT=${SNAPSHOT_ROOT:-$PWD/$BUILD/demo-snapshots}

extra_flags=()
if "$MEMPROFD" --helpfull 2>/dev/null | grep -q -- "--snapshot_root"; then
  mkdir -p "$SNAPSHOT_ROOT"
  extra_flags+=("--snapshot_root=$SNAPSHOT_ROOT")
fi

"$MEMPROFD" --listen=$ADDR --metrics_listen=$METRICS "${extra_flags[@]}" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid; exit 0' INT TERM

for _ in $(seq 1 100); do
  if "$CTL" --addr=$ADDR --timeout_ms=500 health >/dev/null 2>&1; then break; fi
  if ! kill -0 $pid 2>/dev/null; then
    echo "demo: memprofd did not start (see its message above)" >&2
    exit 1
  fi
  sleep 0.2
done

step() { printf '\n\033[1m$ memprofctl %s\033[0m\n' "$*"; "$CTL" --addr=$ADDR "$@"; }
has() { "$CTL" --addr=$ADDR status --json | grep -q "\"$1\""; }

step status
step health
if has train; then
  step train --steps 40 --batch_size 8 --seq_len 128 --offload
fi
if has snapshots; then
  step snapshot demo-step40
  step snapshots
fi
if has memory; then
  step memory
  step memory dump -o "$BUILD/demo-memory.pickle"
  echo "(open $BUILD/demo-memory.pickle at https://pytorch.org/memory_viz)"
fi

cat <<MSG

memprofd is serving (pid $pid):
  gRPC:    $ADDR            (health, reflection, memprofd.v1.Memprofd)
  metrics: http://$METRICS/metrics
Try next:
  $CTL --addr=$ADDR status
  $CTL --addr=$ADDR operations
  curl -s http://$METRICS/metrics | grep ^memprofd_
Ctrl-C stops it.
MSG
wait $pid
