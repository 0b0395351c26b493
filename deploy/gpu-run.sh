#!/usr/bin/env bash
# The GPU run kit: memprofd's prepared check on a GPU machine that has PyTorch
# with CUDA (torch 2.11.0+cu130 as `python3`, transformers, accelerate,
# safetensors) but no Debian packages, no TRL and no network. It runs the kit
# that deploy/gpu-kit-pack.sh packed into .gpu-kit/ (carried with the tree):
#   tests    offload_test, memory_test, snapshot_test: their CUDA cases on the GPU
#   bench    offload_bench on the GPU
#   plan     plan_bench: the memory planner's predicted peak beside the measured
#            peak of the same steps on the GPU (the tiny and small grid, and the
#            daemon's preset at its batch)
#   speed    the daemon's preset at a batch that fills the device (8 x 2048,
#            checkpointing, sdpa) in float32 and bf16, in memprofd, in
#            transformers and in transformers + Liger's fused linear
#            cross-entropy (its carried wheel; skipped, saying so, where it does
#            not import): step time, tokens/s, peak, MFU against the device's
#            dense bf16 peak (drive_daemon.py, trl_baseline.py, report.py)
#   daemon   the real memprofd --device=cuda:0 --model=llama-1b driven by the real
#            memprofctl: training with checkpointing and offloading off / host /
#            disk, a snapshot taken during training, a CUDA memory-history dump,
#            a /metrics scrape, LoRA adapters trained and saved (adapter, merged),
#            SIGTERM (deploy/gpu-kit/drive_daemon.py)
#   hf       transformers loads that snapshot; same tensors, same loss as the
#            daemon's at the next step (check_snapshot_hf.py)
#   viz      torch.cuda._memory_viz reads the dump (check_memory_viz.py)
#   trl      the same model and batch in transformers, plain and with TRL's
#            OffloadActivations from the carried wheel (trl_baseline.py)
#   nccl     where the machine has two or more GPUs: two real memprofd ranks
#            (NCCL) at each sharding level against one process with the global
#            batch (drive_nccl.py); with one GPU it is skipped, saying so
# then prints one table of every check and figure (report.py).
#
# Usage, from the repository root:  deploy/gpu-run.sh [OUTDIR]   (default $OUT)
# Without a CUDA device, or with GPU_KIT_DRY_RUN=1, it is a dry run on the CPU:
# the tiny preset, --device=cpu, offloading to disk (host is a no-op on a CPU),
# CUDA test cases skipping by themselves.
# Knobs: GPU_KIT_PARTS (default tests,bench,plan,speed,daemon,hf,viz,trl,limit,nccl; hf, viz and
# trl need daemon), GPU_KIT_PRESET, GPU_KIT_BATCH, GPU_KIT_SEQ, GPU_KIT_STEPS,
# GPU_KIT_SPEED_BATCH, GPU_KIT_SPEED_SEQ, GPU_KIT_SPEED_STEPS (the speed part's),
# GPU_KIT_BUDGET_S (default 480: parts that would start past it are not run),
# GPU_KIT_CARRIED_GLIBC=1 (start the binaries through the kit's glibc even where
# the host's is new enough), PYTHON (default python3).
# OUTDIR gets: gpu-run.log, results.json, the three gtest XML files, the memory
# history (memory-history.pickle.gz) and logs.tar.gz (every part's log, the
# metrics scrape, the parts' JSON) — 7 files. Bulky things (snapshot, spill
# file) stay in GPU_KIT_WORK (default /tmp/memprofd-gpu-work).
# Exit status: 0 every part and check passed; 1 one failed; 2 no kit; 3 the
# kit's binaries do not resolve on this host.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 2
out=${1:-${OUT:-/tmp/memprofd-gpu-run}}
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=${GPU_KIT_WORK:-/tmp/memprofd-gpu-work}
rm -rf "$work" && mkdir -p "$work"
exec > >(tee "$out/gpu-run.log") 2>&1
tee_pid=$!
trap 'exec 1>&- 2>&-; wait "$tee_pid"' EXIT  # every line in the log before the exit
t_start=$(date +%s)
budget=${GPU_KIT_BUDGET_S:-480}

if [ ! -f .gpu-kit/kit.tar.xz ]; then
  echo "gpu-run: no .gpu-kit/kit.tar.xz here; run deploy/gpu-kit-pack.sh on the build host and carry .gpu-kit"
  exit 2
fi

# ---- Python: the host's python3 with torch (here, a CPU host's venv will do) ----
py=${PYTHON:-python3}
if ! "$py" -c 'import torch' 2>/dev/null && [ -x /opt/memprofd/venv/bin/python ]; then
  py=/opt/memprofd/venv/bin/python
fi
read -r torch_version cuda_count torch_lib nvidia_libs < <("$py" -c '
import glob, os, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
site = os.path.dirname(os.path.dirname(torch.__file__))
nv = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib")))
print(torch.__version__, torch.cuda.device_count() if torch.cuda.is_available() else 0, lib, ":".join(nv) or "-")')
if [ -z "${torch_lib:-}" ]; then
  echo "gpu-run: $py cannot import torch"
  exit 3
fi

if [ "${GPU_KIT_DRY_RUN:-0}" = 1 ] || [ "$cuda_count" = 0 ]; then
  dry=1 device=cpu preset=${GPU_KIT_PRESET:-tiny} batch=${GPU_KIT_BATCH:-4} seq=${GPU_KIT_SEQ:-64}
  steps=${GPU_KIT_STEPS:-4} runs=ckpt-off,ckpt-disk,nockpt-off,nockpt-disk record_run=ckpt-disk
  bench_args=(1 2 64 cpu)
  plan_args=(cpu tiny 0 1x128)
  speed_batch=${GPU_KIT_SPEED_BATCH:-2} speed_seq=${GPU_KIT_SPEED_SEQ:-64} speed_steps=${GPU_KIT_SPEED_STEPS:-3}
else
  dry=0 device=cuda:0 preset=${GPU_KIT_PRESET:-llama-1b} batch=${GPU_KIT_BATCH:-4} seq=${GPU_KIT_SEQ:-512}
  steps=${GPU_KIT_STEPS:-5} runs=ckpt-off,ckpt-host,ckpt-disk,nockpt-off,nockpt-host record_run=ckpt-host
  bench_args=(3 4 128 cuda)
  plan_args=(cuda:0 tiny,small 0)
  plan_1b_args=(cuda:0 "$preset" 0 "${batch}x${seq}")
  speed_batch=${GPU_KIT_SPEED_BATCH:-8} speed_seq=${GPU_KIT_SPEED_SEQ:-2048} speed_steps=${GPU_KIT_SPEED_STEPS:-4}
fi
parts=",${GPU_KIT_PARTS:-tests,bench,plan,speed,daemon,hf,viz,trl,limit,nccl},"
if [ "$dry" = 1 ] && [ "${GPU_KIT_DRY_RUN:-0}" != 1 ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu-run: nvidia-smi lists a GPU but $py's torch sees no CUDA device; not a dry run by mistake:"
  nvidia-smi -L
  exit 3
fi
if [ "$dry" = 1 ]; then echo dry; else echo gpu; fi > "$work/mode"

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
echo "python $py: torch $torch_version, $cuda_count CUDA device(s); $(nproc) cores; $(ldd --version | head -n 1)"
echo "mode: $([ "$dry" = 1 ] && echo "DRY RUN on the CPU" || echo GPU), device $device, preset $preset, batch $batch x $seq, $steps steps per run"

# ---- the kit, unpacked to /tmp ----
kit=${GPU_KIT_DIR:-/tmp/memprofd-gpu-kit}
rm -rf "$kit" && mkdir -p "$kit"
"$py" -c '
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
  .gpu-kit/kit.tar.xz "$kit" || { echo "gpu-run: cannot unpack .gpu-kit/kit.tar.xz"; exit 2; }
kit=$kit/kit
chmod +x "$kit"/bin/*
grep -v '^file=' "$kit/MANIFEST" | tr '\n' ' '
echo

# ---- the libraries: the kit's, then the host torch's own (and its CUDA wheels) ----
nv=${nvidia_libs#-}
ld=$kit/lib:$torch_lib${nv:+:$nv}
# Debian's libstdc++ only where the host's is older than the binaries need.
if LD_LIBRARY_PATH=$ld ldd "$kit"/bin/* 2>&1 | grep -q -E "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found|libstdc\+\+.*not found|libgcc_s.*not found"; then
  ld=$kit/lib:$kit/lib-stdcxx:$torch_lib${nv:+:$nv}
  echo "using the kit's libstdc++ (the host's is older)"
fi
# Debian's glibc only where the host's is older (or GPU_KIT_CARRIED_GLIBC=1): the
# binaries then start through the kit's loader, which takes the library path as
# an argument, so that their children (sh, python) keep the host's glibc.
glibc_needed=$(sed -n 's/^glibc_needed=//p' "$kit/MANIFEST")
host_glibc=$(ldd --version | head -n 1 | grep -oE '[0-9]+\.[0-9]+$')
runner=()
lister=(ldd)
if [ "${GPU_KIT_CARRIED_GLIBC:-0}" = 1 ] ||
   [ "$(printf '%s\n%s\n' "$glibc_needed" "$host_glibc" | sort -V | head -n 1)" != "$glibc_needed" ]; then
  loader=$kit/lib-glibc/$(sed -n 's/^interpreter=//p' "$kit/MANIFEST")
  ld_run=$kit/lib-glibc:$kit/lib:$kit/lib-stdcxx:$torch_lib${nv:+:$nv}
  ld_run=$ld_run:/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu:/usr/lib64:/lib64  # libcuda
  runner=("$loader" --library-path "$ld_run")
  lister=("$loader" --library-path "$ld_run" --list)
  echo "using the kit's glibc and loader (host glibc $host_glibc, the binaries need $glibc_needed);" \
    "the snapshot test that re-executes /proc/self/exe cannot work this way"
fi
problems=$(for b in "$kit"/bin/*; do LD_LIBRARY_PATH=$ld "${lister[@]}" "$b" 2>&1; done |
  grep -E "not found|not a dynamic" | sort -u)
if [ -n "$problems" ]; then
  echo "gpu-run: the kit's binaries do not resolve on this host:"
  echo "$problems"
  echo "(the kit needs glibc >= $glibc_needed; this host has: $(ldd --version | head -n 1))"
  exit 3
fi
echo "libraries: every binary resolves (kit lib/, then $torch_lib)"

# ---- the paths compiled into the test binaries: the repository and the venv's python ----
src_dir=$(sed -n 's/^source_dir=//p' "$kit/MANIFEST")
test_py=$(sed -n 's/^python=//p' "$kit/MANIFEST")
if [ -n "$src_dir" ] && [ ! -e "$src_dir" ]; then
  mkdir -p "$(dirname "$src_dir")" && ln -s "$root" "$src_dir" && echo "linked $src_dir -> $root" ||
    echo "WARNING: cannot create $src_dir; the tests that run its Python scripts will fail"
fi
if [ -n "$test_py" ] && [ ! -x "$test_py" ]; then
  # A shim, not a link: python3 finds its venv from where it is started.
  mkdir -p "$(dirname "$test_py")" &&
    printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec %s "$@"\n' "$(command -v "$py")" > "$test_py" &&
    chmod +x "$test_py" && echo "created $test_py -> $(command -v "$py")" ||
    echo "WARNING: cannot create $test_py; the tests that run Python will fail"
fi

# ---- parts ----
note=""
# part NAME LIMIT_S CMD...: runs CMD within LIMIT_S (and the budget), its output
# in $work/NAME.log with its last lines shown; records status and seconds.
part() {
  local name=$1 limit=$2 t0 rc left
  shift 2
  left=$((budget - ($(date +%s) - t_start)))
  if [ "$left" -lt 20 ]; then
    printf '%s\t%s\t%s\t%s\n' "$name" 125 0 "not run: past the ${budget} s budget" >> "$work/parts.tsv"
    echo "== $name: not run (past the budget)"
    return 125
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit} s)"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" > "$work/$name.log" 2>&1
  rc=$?
  tail -n "${GPU_KIT_TAIL:-4}" "$work/$name.log" | cut -c1-200
  local n=$note
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && n="timed out after ${limit} s${n:+; $n}"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - t0))" "$n" >> "$work/parts.tsv"
  note=""
  return $rc
}
bin_env=(env LD_LIBRARY_PATH="$ld" TEST_TMPDIR="$work/tests-tmp")
mkdir -p "$work/tests-tmp"
# The daemon's binaries through a wrapper that sets their libraries (and only theirs).
for b in memprofd memprofctl; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s %s "$@"\n' "$ld" "${runner[*]}" "$kit/bin/$b" > "$work/$b"
  chmod +x "$work/$b"
done

if [[ $parts == *,tests,* ]]; then
  for t in offload_test memory_test snapshot_test; do
    part "$t" 150 "${bin_env[@]}" "${runner[@]}" "$kit/bin/$t" --gtest_brief=1 --gtest_output="xml:$work/$t.xml"
  done
fi
if [[ $parts == *,bench,* ]]; then
  # (on a loaded 2-core CPU host its two presets take minutes)
  part offload_bench "$([ "$dry" = 1 ] && echo 150 || echo 90)" "${bin_env[@]}" "${runner[@]}" "$kit/bin/offload_bench" "${bench_args[@]}"
fi
if [[ $parts == *,plan,* ]]; then
  part plan_bench "$([ "$dry" = 1 ] && echo 150 || echo 180)" "${bin_env[@]}" "${runner[@]}" "$kit/bin/plan_bench" "${plan_args[@]}"
  # The daemon's own preset and batch (llama-1b at 4 x 512) on the GPU.
  if [ "$dry" = 0 ]; then
    part plan_bench_1b 150 "${bin_env[@]}" "${runner[@]}" "$kit/bin/plan_bench" "${plan_1b_args[@]}"
  fi
fi
# TRL's wheel, unpacked (it is pure Python): the transformers side of the speed
# and trl parts imports it; Liger's likewise, where the kit carries it.
mkdir -p "$work/trl"
"$py" -m zipfile -e "$kit"/wheels/trl-*.whl "$work/trl"
liger_dir=""
for w in "$kit"/wheels/liger_kernel-*.whl; do
  [ -f "$w" ] && mkdir -p "$work/liger" && "$py" -m zipfile -e "$w" "$work/liger" && liger_dir=$work/liger
done
if [[ $parts == *,speed,* ]]; then
  # The one comparison at scale: the same model and batch on every side.
  part speed 240 "$py" deploy/gpu-kit/drive_daemon.py --memprofd "$work/memprofd" \
    --memprofctl "$work/memprofctl" --device "$device" --preset "$preset" --work "$work/speed" \
    --runs ckpt-off,ckpt-off-bf16 --snapshot_run none --record_run none --skip_oom \
    --steps "$speed_steps" --batch_size "$speed_batch" --seq_len "$speed_seq" --out "$work/speed.json"
  if [ -f "$work/speed.json" ]; then
    part speed_hf 240 "$py" deploy/gpu-kit/trl_baseline.py "$work/speed.json" "$device" "$work/trl" \
      "$work/speed_hf.json" ckpt-none,ckpt-none-bf16,ckpt-liger,ckpt-liger-bf16 "$liger_dir"
  fi
fi
if [[ $parts == *,daemon,* ]]; then
  part daemon 300 "$py" deploy/gpu-kit/drive_daemon.py --memprofd "$work/memprofd" \
    --memprofctl "$work/memprofctl" --device "$device" --preset "$preset" --work "$work" \
    --runs "$runs" --snapshot_run ckpt-off --record_run "$record_run" --steps "$steps" \
    --batch_size "$batch" --seq_len "$seq" --lora --out "$work/daemon.json"
  if [ -f "$work/daemon.json" ]; then
    if [[ $parts == *,hf,* ]]; then
      part hf 120 "$py" deploy/gpu-kit/check_snapshot_hf.py "$work/daemon.json" "$device" "$work/hf.json"
    fi
    if [[ $parts == *,viz,* ]] && [ -f "$work/memory-history.pickle" ]; then
      viz_args=()
      [ "$dry" = 0 ] && viz_args=(--expect_cuda)
      part viz 90 "$py" deploy/gpu-kit/check_memory_viz.py "$work/memory-history.pickle" \
        "$work/viz.json" "${viz_args[@]}"
      # The project's own structural check of the same pickle (tests/memory): the
      # viewer's opcodes, blocks tiling segments, allocs matching frees.
      part viz_structure 60 "$py" tests/memory/check_memory_viz.py "$work/memory-history.pickle"
    fi
    if [[ $parts == *,trl,* ]]; then
      part trl 180 "$py" deploy/gpu-kit/trl_baseline.py "$work/daemon.json" "$device" "$work/trl" \
        "$work/trl.json"
    fi
  fi
fi

if [[ $parts == *,limit,* ]]; then
  # --device_memory_limit on the device: a step beyond it fails as an OOM would.
  part limit 120 "$py" deploy/gpu-kit/drive_limit.py --memprofd "$work/memprofd" \
    --memprofctl "$work/memprofctl" --device "$device" --work "$work/limit" --out "$work/limit.json"
fi

if [[ $parts == *,nccl,* ]]; then
  nccl_args=(--gpus "$cuda_count")
  [ "$dry" = 1 ] && nccl_args+=(--cpu)
  [ "$dry" = 0 ] && [ "$cuda_count" -lt 2 ] && note="skipped: $cuda_count GPU; the NCCL part needs two"
  part nccl 240 "$py" deploy/gpu-kit/drive_nccl.py --memprofd "$work/memprofd" \
    --memprofctl "$work/memprofctl" --work "$work/nccl" --out "$work/nccl.json" "${nccl_args[@]}"
fi

# ---- the table, and what comes back in OUTDIR ----
echo
echo "== results ($(($(date +%s) - t_start)) s)"
"$py" deploy/gpu-kit/report.py "$work" "$out/results.json"
status=$?
cp "$work"/*.xml "$out/" 2>/dev/null
[ -f "$work/memory-history.pickle" ] && gzip -c "$work/memory-history.pickle" > "$out/memory-history.pickle.gz"
[ -f "$out/memory-history.pickle.gz" ] && [ "$(stat -c %s "$out/memory-history.pickle.gz")" -gt $((15 << 20)) ] &&
  rm -f "$out/memory-history.pickle.gz" && echo "(memory history over 15 MiB compressed: left in $work)"
(cd "$work" && tar -czf "$out/logs.tar.gz" --exclude='*.pickle' --exclude='snapshots' --exclude='trl' \
  --exclude='liger' \
  --exclude='tests-tmp' --exclude='*.bin' --exclude='memprofd' --exclude='memprofctl' --exclude='*.xml' \
  --exclude='*spill*' .)
echo "gpu-run: exit $status in $(($(date +%s) - t_start)) s; files in $out"
exit $status
