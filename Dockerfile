# memprofd image: build on Debian 12, run on Debian 12 slim with runtime
# libraries only.
#   docker build -t memprofd:0.1.0 .
#   docker run --rm -p 50051:50051 -p 9464:9464 memprofd:0.1.0

FROM debian:bookworm AS build
WORKDIR /src
COPY deploy/install-deps.sh deploy/install-deps.sh
RUN deploy/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DMEMPROFD_BUILD_TESTS=OFF \
 && cmake --build build -j"$(nproc)" --target memprofd memprofctl \
 && strip build/server/memprofd build/client/memprofctl

FROM debian:bookworm-slim AS runtime
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libtorch1.13 libopenblas0-pthread libgrpc++1.51 libprotobuf32 libabsl20220623 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/memprofd memprofd
COPY --from=build /src/build/server/memprofd /src/build/client/memprofctl /usr/local/bin/
USER memprofd
WORKDIR /var/lib/memprofd
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["memprofctl", "--addr=127.0.0.1:50051", "--timeout_ms=4000", "health"]
ENTRYPOINT ["memprofd", "--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]
