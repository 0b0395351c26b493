# The README's two commands and a few helpers. Everything real is in CMake.
#   make run    install what is missing, build Release, start memprofd and drive a demo
#   make test   install what is missing, build, run every test (ctest)
#   make check  build and run the fast tests (ctest without the slow, fuzz and
#               gpu_kit labels); no sanitizer or fuzz build
#   make unit   build and run every C++ test case that starts no daemon and is
#               not labelled slow, one process per test binary (about a minute)
#   make bench  build and run the benchmarks (prints figures)
#   make fuzz   build the libFuzzer targets (clang, ASan + UBSan) and run each
#               for FUZZ_SECONDS (default 300)
#   make test-asan | test-ubsan | test-tsan   sanitizer builds (clang), each in
#               a build directory of its own, running the relevant tests

BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test check unit bench format clean \
        fuzz-build fuzz test-sanitized-core test-asan test-ubsan test-tsan

all: build

deps:
	@deploy/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

run: build
	deploy/demo.sh $(BUILD)

test: build fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 1200 -LE unit
	$(MAKE) --no-print-directory test-sanitized-core

# The edit-test loop: the main build's tests without the minutes-long ones
# (label slow), the fuzz smoke runs (fuzz) and the GPU kit's dry run (gpu_kit);
# no build-fuzz tree. `make test` (CI) runs everything.
check: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE 'slow|fuzz|gpu_kit|unit' --timeout 1200

# The unit loop: the same C++ cases as check, without the Python integration
# tests (they start the daemon), each binary in one process (ctest label unit).
unit: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -L unit --timeout 1200

# --- Sanitizers and fuzzing (issue 15; cmake/sanitizers.cmake) -------------
# One clang build directory serves the fuzz targets and the core unit tests
# under ASan + UBSan (CI runs both, through `make test`); the full sanitizer
# builds are separate and run by hand. Suppressions, each with its reason:
# tests/sanitizers/.
CLANGXX ?= clang++
CCACHE := $(shell command -v ccache 2>/dev/null)
SAN_CMAKE = -DCMAKE_CXX_COMPILER=$(CLANGXX) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
            $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=$(CCACHE)) $(CMAKE_FLAGS)
SUPP = $(CURDIR)/tests/sanitizers
SAN_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 \
          LSAN_OPTIONS=suppressions=$(SUPP)/lsan.supp:print_suppressions=0 \
          UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$(SUPP)/ubsan.supp \
          TSAN_OPTIONS=suppressions=$(SUPP)/tsan.supp:halt_on_error=0:report_signal_unsafe=0:allocator_may_return_null=1 \
          OMP_NUM_THREADS=1
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 300
FUZZ_SMOKE_SECONDS ?= 10
# The core libraries whose unit tests CI runs under ASan + UBSan.
# The core unit tests CI runs under ASan + UBSan (train_test's training steps
# take minutes under ASan: make test-asan runs it with everything else).
SAN_CORE_TESTS ?= common_test memory_test model_test snapshot_test

# The CI's sanitizer build leaves the CUDA code paths out (nothing CUDA runs on
# the CI machines, and they double its compile time); make test-asan keeps them.
fuzz-build: deps
	cmake -S . -B $(FUZZ_BUILD) $(SAN_CMAKE) -DMEMPROFD_FUZZ=ON -DMEMPROFD_CUDA=OFF \
	  -DMEMPROFD_SANITIZE=address,undefined -DMEMPROFD_BUILD_SERVER=OFF \
	  -DMEMPROFD_FUZZ_SMOKE_SECONDS=$(FUZZ_SMOKE_SECONDS)
	cmake --build $(FUZZ_BUILD) -j$(JOBS) --target memprofd_fuzzers $(SAN_CORE_TESTS)

# Each fuzz target briefly, then the core unit tests, under ASan + UBSan.
test-sanitized-core: fuzz-build
	cd $(FUZZ_BUILD) && $(SAN_ENV) ctest --output-on-failure -j$(JOBS) --timeout 1200 \
	  -LE 'slow|unit' -E '_NOT_BUILT$$'

fuzz: fuzz-build
	$(SAN_ENV) fuzz/run.sh $(FUZZ_BUILD)/fuzz $(FUZZ_SECONDS)

# Full builds (daemon and integration tests included) under one sanitizer.
test-asan test-ubsan: deps
	cmake -S . -B build-$(@:test-%=%) $(SAN_CMAKE) \
	  -DMEMPROFD_SANITIZE=$(if $(filter test-asan,$@),address,undefined)
	cmake --build build-$(@:test-%=%) -j$(JOBS)
	cd build-$(@:test-%=%) && $(SAN_ENV) ctest --output-on-failure -j$(JOBS) --timeout 1800 \
	  -LE 'slow|gpu_kit|fuzz|unit' -E '_NOT_BUILT$$'

# TSan over the threads memprofd runs: the offloader's writer and read-ahead
# threads (offload_test), the recorder (memory_test), the session's owner
# thread (session_test) and the gRPC handlers (server_test). Their binaries
# link tests/sanitizers/tsan_absl_mutex.cc, which makes Debian's absl::Mutex
# visible to TSan (cmake/memprofd.cmake).
TSAN_TESTS ?= offload_test memory_test session_test server_test
test-tsan: deps
	cmake -S . -B build-tsan $(SAN_CMAKE) -DMEMPROFD_SANITIZE=thread
	cmake --build build-tsan -j$(JOBS) --target $(TSAN_TESTS)
	cd build-tsan && $(SAN_ENV) ctest --output-on-failure -j$(JOBS) --timeout 1800 \
	  -LE 'slow|unit' -E '_NOT_BUILT$$'

bench: build
	deploy/bench.sh $(BUILD)

format:
	find core server client tests bench -name '*.h' -o -name '*.cc' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(FUZZ_BUILD) build-asan build-ubsan build-tsan
