#ifndef MEMPROFD_TESTS_TESTING_THREADS_H_
#define MEMPROFD_TESTS_TESTING_THREADS_H_

// What the tests read back of the daemon's thread names (core/common/threads.h).

#include <string>

namespace memprofd {
namespace testing {

// The calling thread's name, as /proc/<pid>/task/<tid>/comm shows it.
std::string ThisThreadName();

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_THREADS_H_
