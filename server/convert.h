#ifndef MEMPROFD_SERVER_CONVERT_H_
#define MEMPROFD_SERVER_CONVERT_H_

// Conversions between core:: structs and memprofd.v1 messages. Pure
// functions; thread-safe.

#include "absl/status/statusor.h"
#include "core/memory/memory_stats.h"
#include "core/session/operation.h"
#include "core/session/session.h"
#include "memprofd/v1/memory.pb.h"
#include "memprofd/v1/memprofd.pb.h"
#include "memprofd/v1/model.pb.h"
#include "memprofd/v1/operation.pb.h"
#include "memprofd/v1/snapshot.pb.h"
#include "memprofd/v1/train.pb.h"

namespace memprofd {

// The view with its typed result (train, model, snapshot, evaluate or plan).
v1::Operation ToProto(const OperationView& view);

int64_t UnixMicros(absl::Time t);

// Requests to core specs. Optional fields carry only what the request sets;
// the session merges them over the defaults and validates the result, so
// these check only what the wire format itself can get wrong (a shard size
// that does not parse: INVALID_ARGUMENT naming the field).
absl::StatusOr<TrainSpec> FromProto(const v1::TrainRequest& request);
absl::StatusOr<LoadModelSpec> FromProto(const v1::LoadModelRequest& request);
absl::StatusOr<SnapshotSpec> FromProto(const v1::SnapshotRequest& request);
DataSpec FromProto(const v1::DataSource& source);
EvalSpec FromProto(const v1::EvaluateRequest& request);
v1::EvaluateResult ToProto(const EvalResult& result);

v1::ModelInfo ToProto(const ModelSummary& model, bool with_parameters);
v1::StepReport ToProto(const SessionStepReport& report);
// The int64 field v1::OffloadStats has for `reason` (skipped_<name>); null if
// the proto lacks one.
const google::protobuf::FieldDescriptor* SkippedField(offload::SkipReason reason);
v1::OffloadStats ToProto(const offload::OffloadStats& stats);
v1::TrainResult ToProto(const TrainResult& result);
v1::SnapshotManifest ToProto(const snapshot::SnapshotManifest& manifest,
                             SnapshotMode mode);
v1::MemoryStats ToProto(const memory::MemoryStatsView& stats,
                        const memory::CategoryBytes& categories);
v1::OomReport ToProto(const OomReportRecord& record);
v1::DataParallelStatus ToProto(const WorldSpec& world,
                               const DataParallelCounters& counters);
// Every rank's memory (GetMemoryStats with all_ranks) into `stats`.
void AddRanks(const MemoryAcrossRanks& ranks, v1::MemoryStats* stats);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_CONVERT_H_
