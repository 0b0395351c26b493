#!/usr/bin/env bash
# Installs what memprofd needs to build, test and run, once, and only what is
# missing, so a second run downloads nothing:
#  1. Debian 12 packages, with apt-get: the toolchain, gRPC, protobuf, Abseil,
#     prometheus-cpp, nlohmann-json, Gloo's headers, GoogleTest, the Prometheus server,
#     Python's venv module.
#  2. One Python venv at $MEMPROFD_VENV (default /opt/memprofd/venv), outside
#     every checkout, from deploy/requirements.txt: the torch wheel whose
#     LibTorch the C++ build links, and the tests' real consumers (transformers,
#     safetensors, accelerate, PyTorch's memory tools) and gRPC client.
# The venv is made by Debian's /usr/bin/python3 (3.11). While its stamp
# matches requirements.txt nothing runs; after a change, pip installs what is
# missing or different into it and downloads only that.
# Run as root (or with sudo available).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
venv="${MEMPROFD_VENV:-/opt/memprofd/venv}"
requirements="$here/requirements.txt"

packages=(
  # toolchain; clang with libFuzzer and the sanitizer runtimes for the fuzz
  # and sanitizer builds (cmake/sanitizers.cmake); openssl makes the TLS
  # tests' certificates; ccache speeds up the second build directory
  build-essential cmake pkg-config clang libclang-rt-14-dev ccache openssl
  # libraries (DESIGN.md): gRPC, protobuf, Abseil, prometheus-cpp, GoogleTest,
  # nlohmann-json (header-only)
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev grpc-proto
  nlohmann-json3-dev
  # Gloo's headers, which LibTorch's c10d ProcessGroupGloo.hpp includes
  libgloo-dev
  # tests: the Prometheus server and promtool; the venv's interpreter
  prometheus python3 python3-venv
  # demo and tests
  curl procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

stamp="$venv/.memprofd-requirements"
if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$stamp"; then
  echo "install-deps: venv $venv is up to date"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "install-deps: creating the venv $venv (torch with its CUDA libraries: ~5 GB, once)"
  $SUDO mkdir -p "$(dirname "$venv")"
  $SUDO /usr/bin/python3 -m venv "$venv"
fi
echo "install-deps: installing $requirements into $venv"
pip_args=(--disable-pip-version-check --no-input -q)
# A local wheelhouse (MEMPROFD_WHEELHOUSE) saves the download where one exists.
if [ -n "${MEMPROFD_WHEELHOUSE:-}" ] && [ -d "$MEMPROFD_WHEELHOUSE" ]; then
  pip_args+=(--find-links "$MEMPROFD_WHEELHOUSE")
fi
$SUDO "$venv/bin/pip" install "${pip_args[@]}" -r "$requirements"
# TRL's wheel itself, for the GPU run kit (deploy/gpu-kit-pack.sh).
trl_pin=$(grep -E '^trl==' "$requirements")
$SUDO "$venv/bin/pip" download "${pip_args[@]}" --no-deps -d "$venv/wheels" "$trl_pin"
# Wheels the kit carries without the venv installing them ("# kit-wheel: " lines).
for pin in $(sed -n 's/^# kit-wheel: //p' "$requirements"); do
  $SUDO "$venv/bin/pip" download "${pip_args[@]}" --no-deps -d "$venv/wheels" "$pin"
done
$SUDO cp "$requirements" "$stamp"
"$venv/bin/python" -c 'import torch; print("install-deps: torch", torch.__version__, "CUDA", torch.version.cuda, "C++11 ABI", torch._C._GLIBCXX_USE_CXX11_ABI)'
