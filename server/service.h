#ifndef MEMPROFD_SERVER_SERVICE_H_
#define MEMPROFD_SERVER_SERVICE_H_

// memprofd.v1.Memprofd over the callback API. It only translates: requests
// become core::Session calls (convert.h), and the absl::Status that core and
// the handlers return becomes grpc::Status in one place (Unary and
// RejectStream, through grpc_status.h); every call is authenticated and
// counted. Handlers never block: long work returns an Operation, waits and
// streams are reactors (reactors.h).
// Thread-safe: gRPC calls it from many threads.

#include <string>
#include <vector>

#include "core/session/session.h"
#include "memprofd/v1/memprofd.grpc.pb.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/reactors.h"
#include "server/stream_limit.h"
#include "server/work_queue.h"

namespace memprofd {

struct ServiceInfo {
  std::string version;
  std::string torch_version;
  std::string grpc_version;
  std::string build_type;
  bool cuda_compiled = false;
};

class MemprofdService final : public v1::Memprofd::CallbackService {
 public:
  MemprofdService(Session* session, const TokenAuth* auth, ServerMetrics* metrics,
                  ServiceInfo info);

  // Capabilities this build implements, as reported in BuildInfo.features.
  static std::vector<std::string> Features();

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const v1::GetStatusRequest* req,
                                      v1::ServerStatus* resp) override;
  grpc::ServerUnaryReactor* LoadModel(grpc::CallbackServerContext* ctx,
                                      const v1::LoadModelRequest* req,
                                      v1::Operation* resp) override;
  grpc::ServerUnaryReactor* DescribeModel(grpc::CallbackServerContext* ctx,
                                          const v1::DescribeModelRequest* req,
                                          v1::ModelInfo* resp) override;
  grpc::ServerUnaryReactor* Train(grpc::CallbackServerContext* ctx,
                                  const v1::TrainRequest* req,
                                  v1::Operation* resp) override;
  grpc::ServerWriteReactor<v1::StepReport>* StreamStepReports(
      grpc::CallbackServerContext* ctx, const v1::StreamStepReportsRequest* req) override;
  grpc::ServerUnaryReactor* Snapshot(grpc::CallbackServerContext* ctx,
                                     const v1::SnapshotRequest* req,
                                     v1::Operation* resp) override;
  grpc::ServerUnaryReactor* ListSnapshots(grpc::CallbackServerContext* ctx,
                                          const v1::ListSnapshotsRequest* req,
                                          v1::ListSnapshotsResponse* resp) override;
  grpc::ServerUnaryReactor* DescribeSnapshot(grpc::CallbackServerContext* ctx,
                                             const v1::DescribeSnapshotRequest* req,
                                             v1::SnapshotManifest* resp) override;
  grpc::ServerUnaryReactor* DeleteSnapshot(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteSnapshotRequest* req,
                                           v1::DeleteSnapshotResponse* resp) override;
  grpc::ServerUnaryReactor* GetOperation(grpc::CallbackServerContext* ctx,
                                         const v1::GetOperationRequest* req,
                                         v1::Operation* resp) override;
  grpc::ServerUnaryReactor* ListOperations(grpc::CallbackServerContext* ctx,
                                           const v1::ListOperationsRequest* req,
                                           v1::ListOperationsResponse* resp) override;
  grpc::ServerUnaryReactor* CancelOperation(grpc::CallbackServerContext* ctx,
                                            const v1::CancelOperationRequest* req,
                                            v1::Operation* resp) override;
  grpc::ServerUnaryReactor* WaitOperation(grpc::CallbackServerContext* ctx,
                                          const v1::WaitOperationRequest* req,
                                          v1::Operation* resp) override;
  grpc::ServerWriteReactor<v1::Operation>* WatchOperation(
      grpc::CallbackServerContext* ctx, const v1::WatchOperationRequest* req) override;
  grpc::ServerUnaryReactor* GetMemoryStats(grpc::CallbackServerContext* ctx,
                                           const v1::GetMemoryStatsRequest* req,
                                           v1::MemoryStats* resp) override;
  grpc::ServerUnaryReactor* ResetPeakMemory(grpc::CallbackServerContext* ctx,
                                            const v1::ResetPeakMemoryRequest* req,
                                            v1::ResetPeakMemoryResponse* resp) override;
  grpc::ServerUnaryReactor* StartMemoryRecording(
      grpc::CallbackServerContext* ctx, const v1::StartMemoryRecordingRequest* req,
      v1::StartMemoryRecordingResponse* resp) override;
  grpc::ServerUnaryReactor* StopMemoryRecording(
      grpc::CallbackServerContext* ctx, const v1::StopMemoryRecordingRequest* req,
      v1::StopMemoryRecordingResponse* resp) override;
  grpc::ServerWriteReactor<v1::DumpChunk>* DumpMemoryHistory(
      grpc::CallbackServerContext* ctx, const v1::DumpMemoryHistoryRequest* req) override;
  grpc::ServerUnaryReactor* GetMemoryBreakdown(grpc::CallbackServerContext* ctx,
                                               const v1::GetMemoryBreakdownRequest* req,
                                               v1::MemoryBreakdown* resp) override;
  grpc::ServerUnaryReactor* DiffMemory(grpc::CallbackServerContext* ctx,
                                       const v1::DiffMemoryRequest* req,
                                       v1::MemoryDiff* resp) override;
  grpc::ServerUnaryReactor* Evaluate(grpc::CallbackServerContext* ctx,
                                     const v1::EvaluateRequest* req,
                                     v1::Operation* resp) override;
  grpc::ServerUnaryReactor* GetLastOomReport(grpc::CallbackServerContext* ctx,
                                             const v1::GetLastOomReportRequest* req,
                                             v1::OomReport* resp) override;
  grpc::ServerUnaryReactor* PlanMemory(grpc::CallbackServerContext* ctx,
                                       const v1::PlanMemoryRequest* req,
                                       v1::Operation* resp) override;

 private:
  // Authenticates, runs `fn` unless auth failed, counts and finishes.
  template <typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* method,
                                  Fn fn);
  // A finished unary reactor with `status`, counted.
  grpc::ServerUnaryReactor* Reject(grpc::CallbackServerContext* ctx, const char* method,
                                   const absl::Status& status);
  // For streams that fail before they start.
  template <typename Msg>
  grpc::ServerWriteReactor<Msg>* RejectStream(const char* method,
                                              const absl::Status& status);
  // For a stream or wait starting now: counts and times it when it ends.
  StreamDoneFn CountWhenDone(const char* method);

  Session* const session_;
  const TokenAuth* const auth_;
  ServerMetrics* const metrics_;
  const ServiceInfo info_;
  // DumpMemoryHistory streams hold their whole pickle until read: at most
  // kMaxConcurrentDumps at once (stream_limit.h), the rest RESOURCE_EXHAUSTED.
  static constexpr int kMaxConcurrentDumps = 4;
  StreamLimit dump_slots_{kMaxConcurrentDumps};
  // Builds their pickles, one at a time, at the session's bulk_nice; last,
  // so that it joins first.
  WorkQueue dump_builder_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_SERVICE_H_
