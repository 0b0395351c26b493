#ifndef MEMPROFD_TESTS_TESTING_OPERATION_H_
#define MEMPROFD_TESTS_TESTING_OPERATION_H_

// Waiting for an Operation (core/session/operation.h) in a test without
// sleeping: the waits follow the operation's versions, so they return as soon
// as the state they wait for is there. Thread-safe.

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "core/session/operation.h"

namespace memprofd {
namespace testing {

// Blocks until `until` holds for the operation's view, or the operation is
// done, or `timeout` has passed; returns the last view. On timeout the
// running test fails (ADD_FAILURE naming the operation and its state); the
// caller checks the returned view for what it needs.
OperationView WaitFor(const Operation& op,
                      absl::FunctionRef<bool(const OperationView&)> until,
                      absl::Duration timeout);

// WaitFor the operation to be done (any final state).
OperationView WaitDone(const Operation& op, absl::Duration timeout = absl::Minutes(2));

}  // namespace testing
}  // namespace memprofd

#endif  // MEMPROFD_TESTS_TESTING_OPERATION_H_
