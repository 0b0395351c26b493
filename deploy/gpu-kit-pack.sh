#!/usr/bin/env bash
# Packs the GPU run kit into .gpu-kit/ (git-ignored; the device tool's `carry`
# takes it to the GPU machine, where deploy/gpu-run.sh runs it):
#   kit/bin/         memprofd, memprofctl, offload_test, memory_test,
#                    snapshot_test (tests/), offload_bench and plan_bench (bench/) from
#                    the build dir, stripped.
#                    They were built against the venv's torch 2.11.0+cu130 (the
#                    PyPI wheel), the build the GPU host runs, so they use the
#                    host's LibTorch and CUDA libraries as they are.
#   kit/lib/         the shared libraries they need that are neither the torch
#                    wheel's (libtorch*, libc10*, nvidia/*, CUDA) nor glibc's:
#                    gRPC, protobuf, Abseil, prometheus-cpp, re2, c-ares, OpenSSL...
#   kit/lib-stdcxx/  Debian's libstdc++ and libgcc_s, used only where the
#                    host's are older than these binaries need.
#   kit/lib-glibc/   Debian's glibc and its loader, used only where the host's
#                    glibc is older than these binaries need (they are then
#                    started through that loader).
#   kit/wheels/      TRL's wheel (the version in the venv) and Liger's (the
#                    requirements' kit-wheel pin), for the baselines.
#   kit/gpu-kit/     a copy of deploy/gpu-kit/*.py (the run uses the tree's).
#   kit/MANIFEST     versions, compiled-in paths, glibc needed, file sizes.
# all in one .gpu-kit/kit.tar.xz, at most 60 MiB.
#
# Usage: deploy/gpu-kit-pack.sh        (BUILD=build, PYTHON=the venv's python)
# Needs the binaries built (cmake --build build --target memprofd memprofctl
# offload_test memory_test snapshot_test offload_bench plan_bench) and pip's network
# access for the one wheel (or a trl-*.whl already in .gpu-kit/).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=${PYTHON:-/opt/memprofd/venv/bin/python}
kit=.gpu-kit
max_bytes=$((60 << 20))

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
k=$stage/kit
mkdir -p "$k/bin" "$k/lib" "$k/lib-stdcxx" "$k/lib-glibc" "$k/wheels" "$k/gpu-kit"

echo "== binaries from $BUILD"
# Each from the build folder of its CMake target, not found by name: the build
# tree also holds gpu-run.sh's wrapper scripts of the same names
# (gpu-kit-work/), and one configured before the benchmarks moved to bench/ a
# stale tests/offload/offload_bench.
for rel in server/memprofd client/memprofctl tests/offload/offload_test \
           tests/memory/memory_test tests/snapshot/snapshot_test bench/offload_bench \
           bench/plan_bench; do
  b=$(basename "$rel")
  f=$BUILD/$rel
  if [ ! -x "$f" ]; then
    echo "gpu-kit-pack: no $b under $BUILD; build it first:" >&2
    echo "  cmake --build $BUILD --target memprofd memprofctl offload_test memory_test snapshot_test offload_bench plan_bench" >&2
    exit 1
  fi
  cp "$f" "$k/bin/$b"
  strip --strip-unneeded "$k/bin/$b"
  printf '  %-14s %s (%s)\n' "$b" "$f" "$(date -r "$f" '+%F %T')"
done

echo "== libraries (ldd)"
missing=$(for b in "$k"/bin/*; do ldd "$b"; done | grep 'not found' | sort -u || true)
if [ -n "$missing" ]; then
  echo "gpu-kit-pack: the binaries do not resolve here:" >&2
  echo "$missing" >&2
  exit 1
fi
for b in "$k"/bin/*; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$path" in
      */torch/lib/*|*/nvidia/*|/usr/local/cuda*) continue ;;  # the host's torch wheel and CUDA
    esac
    case "$soname" in
      # glibc: the host's own, unless it is older than these binaries need
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libutil.so.*|libresolv.so.*|\
      libnsl.so.*|libanl.so.*) dest=lib-glibc ;;
      libstdc++.so.*|libgcc_s.so.*) dest=lib-stdcxx ;;
      *) dest=lib ;;
    esac
    cp -L "$path" "$k/$dest/$soname"
  done
interp=$(readelf -l "$k/bin/memprofd" | sed -n 's/.*program interpreter: \(.*\)]/\1/p')
cp -L "$interp" "$k/lib-glibc/$(basename "$interp")"
chmod u+w "$k"/lib/* "$k"/lib-stdcxx/* "$k"/lib-glibc/*
strip --strip-unneeded "$k"/lib/* "$k"/lib-stdcxx/* 2>/dev/null || true
echo "  $(ls "$k/lib" | wc -l) libraries in lib/, $(ls "$k/lib-stdcxx" | tr '\n' ' ')in lib-stdcxx/," \
  "$(ls "$k/lib-glibc" | wc -l) in lib-glibc/"

# Every library the binaries need outside torch/CUDA/glibc now comes from the kit.
export LD_LIBRARY_PATH="$k/lib:$k/lib-stdcxx"  # (not lib-glibc: ldd itself runs with the system's)
stray=$(for b in "$k"/bin/*; do ldd "$b"; done | awk '$2 == "=>" {print $3}' | sort -u |
  grep -v -e "^$k/" -e '/torch/lib/' -e '/nvidia/' -e '^/usr/local/cuda' |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|libnsl|libanl)\.so|ld-linux' || true)
unset LD_LIBRARY_PATH
if [ -n "$stray" ]; then
  echo "gpu-kit-pack: libraries not taken into the kit:" >&2
  echo "$stray" >&2
  exit 1
fi

echo "== TRL wheel"
trl_version=$("$PY" -c 'import importlib.metadata as m; print(m.version("trl"))')
# From the venv's wheels/ (install-deps.sh keeps it there) or the previous
# kit if either has this version (no network needed), else pip.
venv_wheel=$(ls "$("$PY" -c 'import sys; print(sys.prefix)')/wheels/trl-$trl_version-"*.whl 2>/dev/null | head -n 1)
if [ -n "$venv_wheel" ]; then
  cp "$venv_wheel" "$k/wheels/"
elif ! { [ -f "$kit/kit.tar.xz" ] &&
       tar -xJf "$kit/kit.tar.xz" -C "$stage" --wildcards "kit/wheels/trl-$trl_version-*.whl" \
         2>/dev/null; }; then
  "$PY" -m pip download --quiet --no-deps "trl==$trl_version" -d "$k/wheels"
fi
# Liger's wheel ("# kit-wheel:" in requirements.txt): the venv's wheels/, the
# previous kit, or pip; without it the speed part skips Liger, saying so.
liger_pin=$(sed -n 's/^# kit-wheel: \(liger-kernel==.*\)/\1/p' deploy/requirements.txt)
liger_file=liger_kernel-${liger_pin#liger-kernel==}-py3-none-any.whl
venv_liger="$("$PY" -c 'import sys; print(sys.prefix)')/wheels/$liger_file"
if [ -f "$venv_liger" ]; then
  cp "$venv_liger" "$k/wheels/"
elif ! { [ -f "$kit/kit.tar.xz" ] &&
       tar -xJf "$kit/kit.tar.xz" -C "$stage" "kit/wheels/$liger_file" 2>/dev/null; } &&
     ! "$PY" -m pip download --quiet --no-deps "$liger_pin" -d "$k/wheels"; then
  echo "gpu-kit-pack: no $liger_file (the speed part will skip Liger)" >&2
fi
ls "$k/wheels"

cp deploy/gpu-kit/*.py "$k/gpu-kit/"

# Where the test binaries look for their Python scripts and interpreter
# (compiled in): gpu-run.sh makes these paths exist on the GPU host.
cache_get() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -n 1; }
glibc_needed=$(for f in "$k"/bin/* "$k"/lib/*; do objdump -T "$f"; done 2>/dev/null |
  grep -o 'GLIBC_2\.[0-9.]*' | sort -uV | tail -n 1)
glibcxx_needed=$(for f in "$k"/bin/* "$k"/lib/*; do objdump -T "$f"; done 2>/dev/null |
  grep -o 'GLIBCXX_3\.[0-9.]*' | sort -uV | tail -n 1)
{
  echo "built=$(date -u +%FT%TZ)"
  echo "commit=$(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo -dirty)"
  echo "torch=$("$PY" -c 'import torch; print(torch.__version__)')"
  echo "trl=$trl_version"
  echo "source_dir=$(cache_get CMAKE_HOME_DIRECTORY)"
  echo "python=$(cache_get MEMPROFD_PYTHON)"
  echo "glibc_needed=${glibc_needed#GLIBC_}"
  echo "glibcxx_needed=${glibcxx_needed#GLIBCXX_}"
  echo "interpreter=$(basename "$interp")"
  (cd "$k" && find bin lib lib-stdcxx lib-glibc wheels -type f -printf 'file=%p %s\n' | sort)
} > "$k/MANIFEST"

echo "== pack"
rm -rf "$kit"
mkdir -p "$kit"
XZ_OPT=${XZ_OPT:--9 -T2} tar -C "$stage" -cJf "$kit/kit.tar.xz" kit
bytes=$(stat -c %s "$kit/kit.tar.xz")
unpacked=$(du -sb "$k" | cut -f1)
awk -v b="$bytes" -v u="$unpacked" -v f="$kit/kit.tar.xz" -v c="$(sed -n 's/^commit=//p' "$k/MANIFEST")" \
  'BEGIN { printf "gpu-kit-pack: %s: %.1f MiB (%.1f MiB unpacked), commit %s\n", f, b / 1048576, u / 1048576, c }'
if [ "$bytes" -gt "$max_bytes" ]; then
  echo "gpu-kit-pack: the kit is over 60 MiB (the device tool carries 64 MiB in all)" >&2
  exit 1
fi
