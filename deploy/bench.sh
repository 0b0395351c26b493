#!/usr/bin/env bash
# `make bench`: runs every benchmark the build produced and prints figures.
# Benchmarks print ratios measured in one run; they never fail on timings.
set -uo pipefail
BUILD=${1:-build}
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB;" \
     "OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset}"
found=0
# Every benchmark is built in $BUILD/bench (from bench/).
for b in train_bench offload_bench memory_bench snapshot_bench dist_bench plan_bench; do
  exe=$BUILD/bench/$b
  if [ -x "$exe" ]; then
    found=1
    echo
    echo "=== $b"
    "$exe"
  fi
done
[ $found -eq 1 ] || echo "no benchmarks built"
