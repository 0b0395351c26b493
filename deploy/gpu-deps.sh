#!/usr/bin/env bash
# Packs what the GPU check needs from this Debian host into .gpu-deps/: the
# headers, shared libraries and CMake configs of Abseil and GoogleTest. The
# GPU machine has its own LibTorch (the pip wheel's, with CUDA), CMake, ninja
# and a compiler, but neither of these, and it cannot download anything.
# The tree keeps Debian's /usr layout so the CMake configs find their files
# relative to themselves. About 10 MB; `.gpu-deps` is git-ignored and named
# in the device tool's `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh >/dev/null
dest=.gpu-deps/usr
rm -rf .gpu-deps
mkdir -p "$dest/include" "$dest/lib/x86_64-linux-gnu/cmake"
multiarch=/usr/lib/x86_64-linux-gnu
cp -a /usr/include/absl /usr/include/gtest /usr/include/gmock "$dest/include/"
cp -a "$multiarch"/libabsl_*.so* "$multiarch"/libgtest*.a "$multiarch"/libgmock*.a \
      "$dest/lib/x86_64-linux-gnu/"
cp -a "$multiarch/cmake/absl" "$multiarch/cmake/GTest" "$dest/lib/x86_64-linux-gnu/cmake/"
du -sh .gpu-deps
