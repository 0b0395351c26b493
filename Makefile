# The README's two commands and a few helpers. Everything real is in CMake.
#   make run    install what is missing, build Release, start memprofd and drive a demo
#   make test   install what is missing, build, run every test (ctest)
#   make bench  build and run the benchmarks (prints figures)

BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test bench format clean

all: build

deps:
	@deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	deploy/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 1200

bench: build
	deploy/bench.sh $(BUILD)

format:
	find core server client tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
