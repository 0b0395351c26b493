#include "tests/testing/session.h"

#include <cstdlib>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

Runtime& ProcessRuntime() {
  absl::StatusOr<Runtime*> runtime = Runtime::Install();
  if (!runtime.ok()) {
    ADD_FAILURE() << "Runtime::Install: " << runtime.status();
    std::abort();
  }
  return **runtime;
}

std::unique_ptr<Session> CpuSession(const std::string& model) {
  SessionOptions options;
  options.device = "cpu";
  options.model = model;
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(options, ProcessRuntime());
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

}  // namespace testing
}  // namespace memprofd
