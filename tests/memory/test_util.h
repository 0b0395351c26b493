#ifndef MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_
#define MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_

#include <string>

#include "gtest/gtest.h"

namespace memprofd {
namespace memory {

// Installs the counting CPU allocator and the global recorder as phase
// listener (idempotent); every test that allocates tensors calls it first.
void EnsureAccountingInstalled();

// A fresh path under the test's temporary directory.
std::string TempPath(const std::string& name);

// Runs `command` through the shell; returns its exit status and fills
// `output` with stdout+stderr.
int RunCommand(const std::string& command, std::string* output);

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_
