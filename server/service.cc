#include "server/service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/grpc_status.h"
#include "server/reactors.h"

namespace memprofd {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;
using grpc::ServerWriteReactor;
using grpc::Status;
using grpc::StatusCode;

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr int64_t kMaxWaitMs = 60000;

// Watches an operation: its state now, then on every change, until done.
class WatchOperationStream : public OperationStream<v1::Operation> {
 public:
  using OperationStream::OperationStream;

 protected:
  bool Next(v1::Operation* msg) override {
    OperationView view = op_->View();
    if (sent_any_ && view.version == last_version_) return false;
    if (sent_done_) return false;
    sent_any_ = true;
    last_version_ = view.version;
    sent_done_ = view.done;
    *msg = ToProto(view);
    return true;
  }
  bool Complete() override { return sent_done_; }

 private:
  bool sent_any_ = false;
  bool sent_done_ = false;
  uint64_t last_version_ = 0;
};

}  // namespace

MemprofdService::MemprofdService(Session* session, const TokenAuth* auth,
                                 ServerMetrics* metrics, ServiceInfo info)
    : session_(session), auth_(auth), metrics_(metrics), info_(std::move(info)) {}

std::vector<std::string> MemprofdService::Features() {
  return {"status", "health", "reflection", "operations"};
}

template <typename Fn>
ServerUnaryReactor* MemprofdService::Unary(CallbackServerContext* ctx, const char* method,
                                           Fn fn) {
  const Clock::time_point start = Clock::now();
  Status status = auth_->Check(*ctx);
  if (status.ok()) status = fn();
  metrics_->RecordRpc(method, GrpcCodeName(status.error_code()), SecondsSince(start));
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

ServerUnaryReactor* MemprofdService::Reject(CallbackServerContext* ctx,
                                            const char* method, const Status& status) {
  return Unary(ctx, method, [&] { return status; });
}

template <typename Msg>
ServerWriteReactor<Msg>* MemprofdService::RejectStream(const char* method,
                                                       const Status& status) {
  class Rejected : public ServerWriteReactor<Msg> {
   public:
    explicit Rejected(const Status& s) { this->Finish(s); }
    void OnDone() override { delete this; }
  };
  metrics_->RecordRpc(method, GrpcCodeName(status.error_code()), 0);
  return new Rejected(status);
}

Status MemprofdService::Unimplemented(const char* capability, const char* issue) const {
  return Status(
      StatusCode::UNIMPLEMENTED,
      absl::StrCat(capability, " is not built into this memprofd ", info_.version,
                   " yet (", issue, "); BuildInfo.features lists what is"));
}

ServerUnaryReactor* MemprofdService::GetStatus(CallbackServerContext* ctx,
                                               const v1::GetStatusRequest*,
                                               v1::ServerStatus* resp) {
  return Unary(ctx, "GetStatus", [&] {
    v1::BuildInfo* b = resp->mutable_build();
    b->set_version(info_.version);
    b->set_torch_version(info_.torch_version);
    b->set_grpc_version(info_.grpc_version);
    b->set_cuda_compiled(info_.cuda_compiled);
    b->set_build_type(info_.build_type);
    for (const auto& f : Features()) b->add_features(f);
    resp->set_device(session_->device());
    resp->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - session_->start_time()));
    resp->set_serving_state(session_->draining() ? "DRAINING" : "SERVING");
    resp->set_active_operations(session_->operations().ActiveCount());
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::LoadModel(CallbackServerContext* ctx,
                                               const v1::LoadModelRequest*,
                                               v1::Operation*) {
  return Reject(ctx, "LoadModel", Unimplemented("loading a model", "model and training"));
}

ServerUnaryReactor* MemprofdService::DescribeModel(CallbackServerContext* ctx,
                                                   const v1::DescribeModelRequest*,
                                                   v1::ModelInfo*) {
  return Reject(ctx, "DescribeModel",
                Unimplemented("describing the model", "model and training"));
}

ServerUnaryReactor* MemprofdService::Train(CallbackServerContext* ctx,
                                           const v1::TrainRequest*, v1::Operation*) {
  return Reject(ctx, "Train", Unimplemented("training", "model and training"));
}

ServerWriteReactor<v1::StepReport>* MemprofdService::StreamStepReports(
    CallbackServerContext* ctx, const v1::StreamStepReportsRequest*) {
  Status auth = auth_->Check(*ctx);
  return RejectStream<v1::StepReport>(
      "StreamStepReports",
      auth.ok() ? Unimplemented("streaming step reports", "model and training") : auth);
}

ServerUnaryReactor* MemprofdService::Snapshot(CallbackServerContext* ctx,
                                              const v1::SnapshotRequest*,
                                              v1::Operation*) {
  return Reject(ctx, "Snapshot", Unimplemented("snapshots", "snapshots and checkpoints"));
}

ServerUnaryReactor* MemprofdService::ListSnapshots(CallbackServerContext* ctx,
                                                   const v1::ListSnapshotsRequest*,
                                                   v1::ListSnapshotsResponse*) {
  return Reject(ctx, "ListSnapshots",
                Unimplemented("listing snapshots", "snapshots and checkpoints"));
}

ServerUnaryReactor* MemprofdService::DescribeSnapshot(CallbackServerContext* ctx,
                                                      const v1::DescribeSnapshotRequest*,
                                                      v1::SnapshotManifest*) {
  return Reject(ctx, "DescribeSnapshot",
                Unimplemented("describing snapshots", "snapshots and checkpoints"));
}

ServerUnaryReactor* MemprofdService::DeleteSnapshot(CallbackServerContext* ctx,
                                                    const v1::DeleteSnapshotRequest*,
                                                    v1::DeleteSnapshotResponse*) {
  return Reject(ctx, "DeleteSnapshot",
                Unimplemented("deleting snapshots", "snapshots and checkpoints"));
}

ServerUnaryReactor* MemprofdService::GetOperation(CallbackServerContext* ctx,
                                                  const v1::GetOperationRequest* req,
                                                  v1::Operation* resp) {
  return Unary(ctx, "GetOperation", [&] {
    auto op = session_->operations().Get(req->id());
    if (!op.ok()) return ToGrpcStatus(op.status());
    *resp = ToProto((*op)->View());
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::ListOperations(CallbackServerContext* ctx,
                                                    const v1::ListOperationsRequest* req,
                                                    v1::ListOperationsResponse* resp) {
  return Unary(ctx, "ListOperations", [&] {
    if (!v1::OperationKind_IsValid(req->kind())) {
      return Status(StatusCode::INVALID_ARGUMENT,
                    absl::StrCat("unknown operation kind ", req->kind()));
    }
    OperationKind kind = static_cast<OperationKind>(req->kind());
    const OperationKind* filter =
        req->kind() == v1::OPERATION_KIND_UNSPECIFIED ? nullptr : &kind;
    for (const auto& op : session_->operations().List(filter, req->active_only())) {
      *resp->add_operations() = ToProto(op->View());
    }
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::CancelOperation(
    CallbackServerContext* ctx, const v1::CancelOperationRequest* req,
    v1::Operation* resp) {
  return Unary(ctx, "CancelOperation", [&] {
    auto op = session_->operations().Get(req->id());
    if (!op.ok()) return ToGrpcStatus(op.status());
    if ((*op)->done()) {
      return Status(StatusCode::FAILED_PRECONDITION,
                    absl::StrCat("operation ", req->id(), " is already done"));
    }
    (*op)->RequestCancel();
    *resp = ToProto((*op)->View());
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::WaitOperation(CallbackServerContext* ctx,
                                                   const v1::WaitOperationRequest* req,
                                                   v1::Operation* resp) {
  const char* kMethod = "WaitOperation";
  Status auth = auth_->Check(*ctx);
  if (!auth.ok()) return Reject(ctx, kMethod, auth);
  if (req->timeout_ms() < 0) {
    return Reject(ctx, kMethod,
                  Status(StatusCode::INVALID_ARGUMENT,
                         "timeout_ms must be >= 0 (0 means the maximum, 60000)"));
  }
  auto op = session_->operations().Get(req->id());
  if (!op.ok()) return Reject(ctx, kMethod, ToGrpcStatus(op.status()));
  int64_t ms =
      req->timeout_ms() == 0 ? kMaxWaitMs : std::min(req->timeout_ms(), kMaxWaitMs);
  const Clock::time_point start = Clock::now();
  auto* reactor = new WaitOperationReactor(
      *op, absl::Now() + absl::Milliseconds(ms),
      [resp](const OperationView& view) { *resp = ToProto(view); },
      [this, start, kMethod](const Status& s) {
        metrics_->RecordRpc(kMethod, GrpcCodeName(s.error_code()), SecondsSince(start));
      });
  reactor->Start();
  return reactor;
}

ServerWriteReactor<v1::Operation>* MemprofdService::WatchOperation(
    CallbackServerContext* ctx, const v1::WatchOperationRequest* req) {
  const char* kMethod = "WatchOperation";
  Status auth = auth_->Check(*ctx);
  if (!auth.ok()) return RejectStream<v1::Operation>(kMethod, auth);
  auto op = session_->operations().Get(req->id());
  if (!op.ok()) return RejectStream<v1::Operation>(kMethod, ToGrpcStatus(op.status()));
  const Clock::time_point start = Clock::now();
  auto* stream = new WatchOperationStream(*op, [this, start, kMethod](const Status& s) {
    metrics_->RecordRpc(kMethod, GrpcCodeName(s.error_code()), SecondsSince(start));
  });
  stream->Start();
  return stream;
}

ServerUnaryReactor* MemprofdService::GetMemoryStats(CallbackServerContext* ctx,
                                                    const v1::GetMemoryStatsRequest*,
                                                    v1::MemoryStats*) {
  return Reject(ctx, "GetMemoryStats",
                Unimplemented("memory statistics", "memory history and observability"));
}

ServerUnaryReactor* MemprofdService::ResetPeakMemory(CallbackServerContext* ctx,
                                                     const v1::ResetPeakMemoryRequest*,
                                                     v1::ResetPeakMemoryResponse*) {
  return Reject(
      ctx, "ResetPeakMemory",
      Unimplemented("resetting memory peaks", "memory history and observability"));
}

ServerUnaryReactor* MemprofdService::StartMemoryRecording(
    CallbackServerContext* ctx, const v1::StartMemoryRecordingRequest*,
    v1::StartMemoryRecordingResponse*) {
  return Reject(
      ctx, "StartMemoryRecording",
      Unimplemented("memory history recording", "memory history and observability"));
}

ServerUnaryReactor* MemprofdService::StopMemoryRecording(
    CallbackServerContext* ctx, const v1::StopMemoryRecordingRequest*,
    v1::StopMemoryRecordingResponse*) {
  return Reject(
      ctx, "StopMemoryRecording",
      Unimplemented("memory history recording", "memory history and observability"));
}

ServerWriteReactor<v1::DumpChunk>* MemprofdService::DumpMemoryHistory(
    CallbackServerContext* ctx, const v1::DumpMemoryHistoryRequest*) {
  Status auth = auth_->Check(*ctx);
  return RejectStream<v1::DumpChunk>(
      "DumpMemoryHistory", auth.ok() ? Unimplemented("memory history dumps",
                                                     "memory history and observability")
                                     : auth);
}

}  // namespace memprofd
