# Helpers shared by the project's CMakeLists.

# LibTorch's headers cost 30-50 s per translation unit on two cores; one
# precompiled header, reused by every target that includes LibTorch, pays that
# once. Targets opt in with memprofd_use_torch_pch(target).
add_library(memprofd_torch_pch OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_pch.cc)
target_link_libraries(memprofd_torch_pch PRIVATE ${TORCH_LIBRARIES})
target_precompile_headers(memprofd_torch_pch PRIVATE <torch/torch.h>)

function(memprofd_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM memprofd_torch_pch)
endfunction()

# TSan builds: absl::Mutex's lock and unlock annotated for TSan (Debian's
# Abseil is not built with it; see tests/sanitizers/tsan_absl_mutex.cc).
# Shared, and linked first, so that its definitions come before Abseil's.
if(MEMPROFD_SANITIZE MATCHES "thread")
  add_library(memprofd_tsan_absl_mutex SHARED
              ${PROJECT_SOURCE_DIR}/tests/sanitizers/tsan_absl_mutex.cc)
  target_link_libraries(memprofd_tsan_absl_mutex PRIVATE absl::synchronization
                        ${CMAKE_DL_LIBS})
endif()

# memprofd_test(NAME name SOURCES ... DEPS ... [TIMEOUT seconds]
#               [SLOW gtest-filter [SLOW_TIMEOUT seconds]] [UNIT_SHARDS n]):
# one GoogleTest
# binary, run by ctest, each test case a ctest test (default timeout 600 s).
# The cases SLOW matches (a --gtest_filter pattern, e.g. "AcceptanceTest.*")
# are the ones that take minutes: they get the label `slow` (skipped by
# `ctest -LE slow`, still run by `make test`) and SLOW_TIMEOUT (default:
# TIMEOUT), and hold the ctest resource lock memprofd_cores (they train on
# every core for minutes; tests that measure a training's pace take the same
# lock, so that ctest -j never runs the two side by side).
#
# Besides, the binary's fast cases are registered as one ctest test per shard
# (`<name>.unit`, or `<name>.unit<k>` with UNIT_SHARDS n > 1), labelled `unit`:
# one process runs them all, so LibTorch is loaded once rather than once per
# case (about a second each). `make unit` runs that label; `make check` and
# `make test` leave it out, since they run the same cases one by one. Test bodies find the build's binaries through MEMPROFD_BINARY_DIR,
# the source tree through MEMPROFD_SOURCE_DIR and the venv's interpreter (the
# real consumers and Python references) through MEMPROFD_PYTHON.
function(memprofd_test)
  cmake_parse_arguments(T "TORCH" "NAME;TIMEOUT;SLOW;SLOW_TIMEOUT;UNIT_SHARDS" "SOURCES;DEPS"
                        ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  if(NOT T_SLOW_TIMEOUT)
    set(T_SLOW_TIMEOUT ${T_TIMEOUT})
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  if(TARGET memprofd_tsan_absl_mutex)
    target_link_libraries(${T_NAME} PRIVATE memprofd_tsan_absl_mutex)
  endif()
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} GTest::gmock GTest::gtest_main
                        memprofd_warnings)
  target_compile_definitions(${T_NAME} PRIVATE
    MEMPROFD_BINARY_DIR="${PROJECT_BINARY_DIR}"
    MEMPROFD_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    MEMPROFD_PYTHON="${MEMPROFD_PYTHON}")
  if(T_TORCH)
    memprofd_use_torch_pch(${T_NAME})
  endif()
  if(T_SLOW AND CMAKE_VERSION VERSION_GREATER_EQUAL 3.22)
    # Two discoveries of one binary, split by gtest's filter (TEST_FILTER is
    # CMake 3.22's; older ones register every case unlabelled, below).
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 TEST_FILTER "-${T_SLOW}"
                         TEST_LIST ${T_NAME}_FAST_TESTS
                         PROPERTIES TIMEOUT ${T_TIMEOUT})
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60 TEST_FILTER "${T_SLOW}"
                         TEST_LIST ${T_NAME}_SLOW_TESTS
                         PROPERTIES TIMEOUT ${T_SLOW_TIMEOUT} LABELS slow
                                    RESOURCE_LOCK memprofd_cores)
  else()
    if(T_SLOW)
      message(WARNING "${T_NAME}: CMake ${CMAKE_VERSION} cannot label the cases "
                      "'${T_SLOW}' slow (needs 3.22); they run unlabelled")
      set(T_TIMEOUT ${T_SLOW_TIMEOUT})
    endif()
    gtest_discover_tests(${T_NAME} DISCOVERY_TIMEOUT 60
                         PROPERTIES TIMEOUT ${T_TIMEOUT})
  endif()
  memprofd_unit_tests(${T_NAME} "${T_SLOW}" "${T_UNIT_SHARDS}" ${T_TIMEOUT})
endfunction()

# The `unit` label: the binary's cases that SLOW does not match, one process
# per shard (gtest's own GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX). One intra-op
# thread each: ctest -j runs as many binaries as there are cores, and LibTorch's
# default of one thread per core in each of them oversubscribes the machine
# (on two cores, 89 s with the default against 66 s with one thread).
function(memprofd_unit_tests name slow shards timeout)
  if(NOT shards)
    set(shards 1)
  endif()
  set(args --gtest_brief=1)
  if(slow)
    list(APPEND args "--gtest_filter=-${slow}")
  endif()
  math(EXPR last "${shards} - 1")
  foreach(index RANGE ${last})
    if(shards EQUAL 1)
      set(test_name ${name}.unit)
    else()
      set(test_name ${name}.unit${index})
    endif()
    add_test(NAME ${test_name} COMMAND ${name} ${args})
    set_tests_properties(${test_name} PROPERTIES LABELS unit TIMEOUT ${timeout}
      ENVIRONMENT "GTEST_TOTAL_SHARDS=${shards};GTEST_SHARD_INDEX=${index};OMP_NUM_THREADS=1")
  endforeach()
endfunction()
