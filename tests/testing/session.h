#ifndef MEMPROFD_TESTS_TESTING_SESSION_H_
#define MEMPROFD_TESTS_TESTING_SESSION_H_

// Sessions for tests. Thread-safe.

#include <memory>
#include <string>

#include "core/session/runtime.h"
#include "core/session/session.h"

namespace memprofd {
namespace testing {

// The test binary's Runtime (Runtime::Install()): what main makes once for
// the daemon, each test binary makes once for its sessions and servers. A
// failure to install fails the running test and aborts.
Runtime& ProcessRuntime();

// A session on the CPU whose start model is `model` (a preset name). Null,
// with the running test failed and the status printed, when Create fails.
std::unique_ptr<Session> CpuSession(const std::string& model);

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_SESSION_H_
