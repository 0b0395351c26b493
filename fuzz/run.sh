#!/bin/bash
# Runs memprofd's libFuzzer targets: fuzz/run.sh BINDIR SECONDS [NAME...]
# (all targets when no NAME). Each <NAME>_fuzz in BINDIR runs for SECONDS
# under ASan + UBSan, starting from fuzz/corpus/NAME (read only) and a work
# corpus BINDIR/fuzz-work/NAME/corpus that keeps what it finds between runs.
# Crashes go to BINDIR/fuzz-work/NAME/ (crash-*, leak-*, timeout-*). The pickle
# target's work corpus is then replayed with MEMPROFD_FUZZ_PICKLE_DIR set and
# checked by check_pickles.py with the venv's Python ($MEMPROFD_PYTHON).
# Prints one line per target: executions, seconds, new corpus size, crashes.
# Exit status: non-zero when any target crashed or a check failed.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
bindir="$1"
seconds="$2"
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  names=($(cd "$here/corpus" && ls))
fi
python="${MEMPROFD_PYTHON:-/opt/memprofd/venv/bin/python}"
supp="$here/../tests/sanitizers"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:allocator_may_return_null=1}"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
# LibTorch's intra-op pool is not needed by one small input at a time.
export OMP_NUM_THREADS=1
status=0
for name in "${names[@]}"; do
  bin="$bindir/${name}_fuzz"
  work="$bindir/fuzz-work/$name"
  mkdir -p "$work/corpus"
  log="$work/last.log"
  "$bin" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=6144 \
    -timeout=60 -max_len=65536 -artifact_prefix="$work/" \
    "$work/corpus" "$here/corpus/$name" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  crashes=$(ls "$work" | grep -c -E '^(crash|leak|timeout|oom)-' || true)
  printf 'fuzz %-20s %10s executions in %4s s, corpus %4d, %d crash file(s)%s\n' \
    "$name" "${execs:-?}" "$seconds" "$(ls "$work/corpus" | wc -l)" "$crashes" \
    "$([ $rc -ne 0 ] && echo ", exit $rc: see $log")"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E 'ERROR|FUZZ_CHECK|runtime error|SUMMARY|unexpected status' "$log" | head -20
  fi
  if [ "$name" = pickle ] && [ $rc -eq 0 ]; then
    out="$work/pickles"
    rm -rf "$out" && mkdir -p "$out"
    inputs=$( (ls -d "$work/corpus"/* "$here/corpus/$name"/* 2>/dev/null) | head -2000)
    # shellcheck disable=SC2086
    MEMPROFD_FUZZ_PICKLE_DIR="$out" "$bin" -runs=1 $inputs >"$work/replay.log" 2>&1 || status=1
    "$python" "$here/check_pickles.py" "$out" || status=1
  fi
done
exit $status
