#ifndef MEMPROFD_SERVER_CONVERT_PLAN_H_
#define MEMPROFD_SERVER_CONVERT_PLAN_H_

// Conversions between the session's memory-plan request and result
// (PlanMemorySpec, PlanResult) and memprofd.v1 messages. Pure functions;
// thread-safe.

#include "absl/status/statusor.h"
#include "core/session/session_types.h"
#include "memprofd/v1/memory.pb.h"
#include "memprofd/v1/memprofd.pb.h"

namespace memprofd {

// Only what the request sets: the model source, the training as
// FromProto(v1::TrainRequest) converts it (its errors: an unknown
// offload.target), the target and the capacity. The session checks the
// rest.
absl::StatusOr<PlanMemorySpec> FromProto(const v1::PlanMemoryRequest& request);
v1::MemoryPlan ToProto(const PlanResult& result);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_CONVERT_PLAN_H_
