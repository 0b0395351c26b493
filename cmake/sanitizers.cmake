# Sanitizer and fuzzing builds (issue 15). Each lives in a build directory of
# its own, made with clang by the Makefile (`make test-asan`, `test-ubsan`,
# `test-tsan`, `fuzz`); a default build sets none of this.
#
#   MEMPROFD_SANITIZE   comma-separated -fsanitize= list: "address,undefined",
#                       "address", "undefined" or "thread"; empty for none.
#   MEMPROFD_FUZZ       build the libFuzzer targets in fuzz/ (clang only);
#                       project code is compiled with -fsanitize=fuzzer-no-link
#                       so that libFuzzer sees its coverage.
#
# Only project code (and the gtest/absl headers it inlines) is instrumented:
# LibTorch, gRPC, protobuf and Abseil are Debian's and the wheel's builds.
# ASan and UBSan need nothing from them; TSan cannot see the synchronization
# inside uninstrumented libraries, see tests/sanitizers/tsan.supp.

set(MEMPROFD_SANITIZE "" CACHE STRING
    "Sanitizers for project code: address,undefined | address | undefined | thread")
option(MEMPROFD_FUZZ "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)

if(MEMPROFD_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MEMPROFD_FUZZ=ON needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++ in a build directory of its own "
                      "(`make fuzz` does)")
endif()
if(MEMPROFD_SANITIZE MATCHES "thread" AND MEMPROFD_SANITIZE MATCHES "address")
  message(FATAL_ERROR "MEMPROFD_SANITIZE: thread and address cannot be combined")
endif()
if(MEMPROFD_FUZZ AND MEMPROFD_SANITIZE MATCHES "thread")
  message(FATAL_ERROR "MEMPROFD_FUZZ=ON runs under ASan/UBSan, not TSan")
endif()

if(MEMPROFD_SANITIZE)
  set(_memprofd_san_flags -fsanitize=${MEMPROFD_SANITIZE} -fno-omit-frame-pointer -g)
  if(MEMPROFD_SANITIZE MATCHES "undefined")
    # A UBSan report is a test failure, not a line in a log. vptr checks the
    # dynamic type of every polymorphic access, which LibTorch's objects
    # (made by uninstrumented code, with their type_info in libtorch) pass.
    list(APPEND _memprofd_san_flags -fno-sanitize-recover=undefined)
  endif()
  add_compile_options(${_memprofd_san_flags})
  add_link_options(-fsanitize=${MEMPROFD_SANITIZE})
  message(STATUS "memprofd: sanitizers ${MEMPROFD_SANITIZE}")
endif()
if(MEMPROFD_FUZZ)
  add_compile_options(-fsanitize=fuzzer-no-link)
  message(STATUS "memprofd: libFuzzer targets in fuzz/")
endif()

# ATen's inlined parallel_for is compiled with -fopenmp in a normal build
# (see the top-level CMakeLists). clang's -fopenmp emits calls into LLVM's
# libomp, not the wheel's libgomp that LibTorch loads, and TSan cannot see
# OpenMP's barriers: sanitizer builds leave it off, so those loops run on one
# thread (same results, slower).
if(MEMPROFD_SANITIZE OR MEMPROFD_FUZZ)
  set(_memprofd_openmp_default OFF)
else()
  set(_memprofd_openmp_default ON)
endif()
option(MEMPROFD_OPENMP "Compile LibTorch users with -fopenmp" ${_memprofd_openmp_default})
