#ifndef MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_
#define MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_

// What only the memory tests share; the helpers every test binary uses
// (temporary directories, the venv's Python) are in tests/testing/.

namespace memprofd {
namespace memory {

// Installs the counting CPU allocator and the global recorder as phase
// listener (idempotent); every test that allocates tensors calls it first.
void EnsureAccountingInstalled();

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_MEMORY_TEST_UTIL_H_
