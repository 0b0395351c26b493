#include "tests/testing/session.h"

#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

std::unique_ptr<Session> CpuSession(const std::string& model) {
  SessionOptions options;
  options.device = "cpu";
  options.model = model;
  absl::StatusOr<std::unique_ptr<Session>> s = Session::Create(options);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

}  // namespace testing
}  // namespace memprofd
