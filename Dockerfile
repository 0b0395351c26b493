# memprofd image: build on Debian 12 against the torch wheel's LibTorch (as
# `make` does), run on Debian 12 slim with the runtime libraries only.
#   docker build -t memprofd:0.1.0 .
#   docker run --rm --gpus all -p 50051:50051 -p 9464:9464 memprofd:0.1.0
# The wheel's LibTorch has CUDA, and its CMake config needs a CUDA toolkit of
# the same major version (13) to configure; Debian ships none, so the build
# stage copies NVIDIA's from CUDA_IMAGE (Ubuntu 22.04's glibc is older than
# Debian 12's, so its nvcc runs there). The binaries still start without a GPU.
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu22.04

FROM ${CUDA_IMAGE} AS cuda

FROM debian:bookworm AS build
WORKDIR /src
COPY --from=cuda /usr/local/cuda /usr/local/cuda
ENV PATH=/usr/local/cuda/bin:$PATH
COPY deploy/install-deps.sh deploy/requirements.txt deploy/
RUN deploy/install-deps.sh && rm -rf /var/lib/apt/lists/* /root/.cache/pip
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEMPROFD_BUILD_TESTS=OFF \
 && cmake --build build -j"$(nproc)" --target memprofd memprofctl \
 && strip build/server/memprofd build/client/memprofctl

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/memprofd memprofd
# LibTorch and its CUDA libraries, at the path the binaries' run path names
# (torch/lib) and where libtorch_cuda's own run path finds them (nvidia/).
ARG SITE=/opt/memprofd/venv/lib/python3.11/site-packages
COPY --from=build ${SITE}/torch/lib ${SITE}/torch/lib
COPY --from=build ${SITE}/nvidia ${SITE}/nvidia
ENV LD_LIBRARY_PATH=${SITE}/nvidia/cu13/lib
COPY --from=build /src/build/server/memprofd /src/build/client/memprofctl /usr/local/bin/
USER memprofd
WORKDIR /var/lib/memprofd
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["memprofctl", "--addr=127.0.0.1:50051", "--timeout_ms=4000", "health"]
ENTRYPOINT ["memprofd", "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]
