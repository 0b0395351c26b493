#include "tests/testing/operation.h"

#include "gtest/gtest.h"

namespace memprofd {
namespace testing {

OperationView WaitFor(const Operation& op,
                      absl::FunctionRef<bool(const OperationView&)> until,
                      absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  OperationView v = op.View();
  while (!until(v) && !v.done && absl::Now() < deadline) {
    v = op.WaitForChange(v.version, deadline);
  }
  if (!until(v) && !v.done) {
    ADD_FAILURE() << "operation " << op.id() << " still " << OperationStateName(v.state)
                  << " after " << timeout;
  }
  return v;
}

OperationView WaitDone(const Operation& op, absl::Duration timeout) {
  return WaitFor(
      op, [](const OperationView& v) { return v.done; }, timeout);
}

}  // namespace testing
}  // namespace memprofd
