#!/usr/bin/env bash
# Installs, with apt-get, the Debian 12 packages memprofd needs to build, test
# and run — only those missing, so a second run does nothing. Run as root (or
# with sudo available).
set -euo pipefail

packages=(
  # toolchain
  build-essential cmake pkg-config
  # libraries (DESIGN.md): LibTorch, gRPC, protobuf, Abseil, prometheus-cpp, GoogleTest
  libtorch-dev libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev prometheus-cpp-dev libgtest-dev libgmock-dev grpc-proto
  # a fast CPU BLAS for LibTorch (Debian's default reference BLAS is ~20x slower)
  libopenblas0-pthread
  # tests: the Prometheus server and promtool, and the independent Python client and
  # references (Debian's python3 with grpcio, protobuf, numpy and torch)
  prometheus python3 python3-grpcio python3-protobuf python3-numpy python3-torch
  # demo and tests
  curl procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
