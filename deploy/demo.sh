#!/usr/bin/env bash
# `make run`: starts memprofd on its embedded defaults, drives a short demo
# with memprofctl, then leaves the daemon serving in the foreground until
# Ctrl-C.
set -uo pipefail  # a failed demo step is shown, and the demo goes on
BUILD=${1:-build}
MEMPROFD="$BUILD/server/memprofd"
CTL="$BUILD/client/memprofctl"
ADDR=127.0.0.1:50051
METRICS=127.0.0.1:9464
SNAPSHOT_ROOT=${SNAPSHOT_ROOT:-$PWD/$BUILD/demo-snapshots}

mkdir -p "$SNAPSHOT_ROOT"
"$MEMPROFD" --listen=$ADDR --metrics_listen=$METRICS --snapshot_root="$SNAPSHOT_ROOT" &
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

step status
step health
step memory record start --max_entries 200000
step train --steps 40 --batch_size 8 --seq_len 128 --learning_rate 1e-3 --offload
step snapshot "demo-$(date +%Y%m%d-%H%M%S)" --max_shard_size 5MB
step snapshots
step memory
step memory dump -o "$BUILD/demo-memory.pickle"

cat <<MSG

memprofd is serving (pid $pid):
  gRPC:      $ADDR            (health, reflection, memprofd.v1.Memprofd)
  metrics:   http://$METRICS/metrics
  snapshots: $SNAPSHOT_ROOT
  history:   $BUILD/demo-memory.pickle (open at https://pytorch.org/memory_viz)
Try next:
  $CTL --addr=$ADDR status
  $CTL --addr=$ADDR train --steps 300 --gradient_checkpointing --offload
  $CTL --addr=$ADDR memory
  $CTL --addr=$ADDR snapshots
  curl -s http://$METRICS/metrics | grep ^memprofd_
Ctrl-C stops it.
MSG
wait $pid
