#!/usr/bin/env bash
# The GPU check: builds core/ and the unit tests of the libraries with CUDA
# code (offload, memory, snapshot) against the GPU host's own LibTorch (the
# pip wheel's: 2.x with CUDA), runs them, and runs offload_bench on the GPU.
# On a CPU host the same tests skip their CUDA cases; here they must run.
#
# On the build host, once:  deploy/gpu-deps.sh          (fills .gpu-deps/)
# On the GPU machine, from the repository root, with .gpu-deps carried:
#   deploy/gpu-check.sh [OUTDIR]      (logs and gtest XML go to OUTDIR)
# Exit status: 0 all passed, 1 a test failed, 2 no .gpu-deps, 3 configure
# failed, 4 build failed. It never installs anything.
set -uo pipefail
out=${1:-${OUT:-/tmp/memprofd-gpu-check}}
mkdir -p "$out"
exec > >(tee "$out/gpu-check.log") 2>&1

deps=$PWD/.gpu-deps/usr
if [ ! -d "$deps" ]; then
  echo "gpu-check: no .gpu-deps here; run deploy/gpu-deps.sh on the build host and carry it"
  exit 2
fi
py=${PYTHON:-python3}
# TORCH_PREFIX / TORCH_LIB / MEMPROFD_CUDA override these for a dry run on a
# CPU host (MEMPROFD_CUDA=AUTO against Debian's LibTorch).
torch_prefix=${TORCH_PREFIX:-$("$py" -c 'import torch; print(torch.utils.cmake_prefix_path)')} \
  || exit 3
torch_lib=${TORCH_LIB:-$("$py" -c \
  'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')}

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
          "available", torch.cuda.is_available())'
cmake --version | head -n 1
"${CXX:-c++}" --version | head -n 1
nproc

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
build=${BUILD:-/tmp/memprofd-gpu-build}
echo "== configure ($build)"
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DMEMPROFD_BUILD_SERVER=OFF -DMEMPROFD_CUDA="${MEMPROFD_CUDA:-ON}" \
  -DCMAKE_PREFIX_PATH="$deps;$torch_prefix" || exit 3
echo "== build"
start=$(date +%s)
cmake --build "$build" -j"$(nproc)" \
  --target offload_test memory_test snapshot_test offload_bench || exit 4
echo "built in $(( $(date +%s) - start )) s"

export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu:$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
for t in offload_test memory_test snapshot_test; do
  exe=$(find "$build" -type f -name "$t" -perm -u+x | head -n 1)
  echo "== $t"
  # Failures and skips in full, passes as a count (the output is read back
  # through a 12 kB tail).
  timeout 300 "$exe" --gtest_brief=1 --gtest_output="xml:$out/$t.xml" || status=1
done
echo "== offload_bench (cuda)"
timeout 180 "$(find "$build" -type f -name offload_bench -perm -u+x | head -n 1)" 3 4 128 cuda \
  || status=1
echo "gpu-check: exit $status"
exit $status
