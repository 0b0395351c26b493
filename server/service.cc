#include "server/service.h"

#include <chrono>
#include <optional>
#include <string>
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

// The step reports of a TRAIN operation from a given step, live until done.
class StepReportStream : public OperationStream<v1::StepReport> {
 public:
  StepReportStream(std::shared_ptr<Operation> op, int64_t from_step, StreamDoneFn on_done)
      : OperationStream(std::move(op), std::move(on_done)),
        next_(std::max<int64_t>(1, from_step)) {}

 protected:
  bool Next(v1::StepReport* msg) override {
    // done is read before the events: events are appended before Finish, so
    // when done is seen every event is there.
    done_ = op_->done();
    int64_t first = 0;
    std::vector<std::any> events = op_->EventsFrom(next_, 1, &first);
    if (events.empty()) return false;
    next_ = first + 1;
    *msg = ToProto(std::any_cast<const SessionStepReport&>(events.front()));
    return true;
  }
  bool Complete() override { return done_; }

 private:
  int64_t next_;
  bool done_ = false;
};

// Streams a byte string in chunks.
class ChunkStream : public grpc::ServerWriteReactor<v1::DumpChunk> {
 public:
  ChunkStream(std::string data, StreamDoneFn on_done)
      : data_(std::move(data)), on_done_(std::move(on_done)) {
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      final_ = Status(StatusCode::CANCELLED, "client went away");
      Finish(final_);
      return;
    }
    Next();
  }
  void OnDone() override {
    if (on_done_) on_done_(final_);
    delete this;
  }

 private:
  static constexpr size_t kChunk = 1 << 20;
  void Next() {
    if (offset_ >= data_.size()) {
      Finish(Status::OK);
      return;
    }
    const size_t n = std::min(kChunk, data_.size() - offset_);
    chunk_.set_data(data_.substr(offset_, n));
    offset_ += n;
    StartWrite(&chunk_);
  }
  const std::string data_;
  StreamDoneFn on_done_;
  size_t offset_ = 0;
  v1::DumpChunk chunk_;
  Status final_;
};

}  // namespace

MemprofdService::MemprofdService(Session* session, const TokenAuth* auth,
                                 ServerMetrics* metrics, ServiceInfo info)
    : session_(session), auth_(auth), metrics_(metrics), info_(std::move(info)) {}

std::vector<std::string> MemprofdService::Features() {
  return {"status", "health",  "reflection", "operations", "model",
          "train",  "offload", "snapshots",  "memory"};
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
    resp->set_active_operations(session_->ActiveOperationCount());
    if (std::optional<ModelSummary> model = session_->Model()) {
      *resp->mutable_model() = ToProto(*model, /*with_parameters=*/false);
    }
    SessionCounters counters = session_->Counters();
    if (counters.last_step) *resp->mutable_last_step() = ToProto(*counters.last_step);
    *resp->mutable_offload_totals() = ToProto(counters.offload_totals);
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::LoadModel(CallbackServerContext* ctx,
                                               const v1::LoadModelRequest* req,
                                               v1::Operation* resp) {
  return Unary(ctx, "LoadModel", [&] {
    absl::StatusOr<LoadModelSpec> spec = FromProto(*req);
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->LoadModel(*spec);
    if (!op.ok()) return ToGrpcStatus(op.status());
    *resp = ToProto((*op)->View());
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::DescribeModel(CallbackServerContext* ctx,
                                                   const v1::DescribeModelRequest*,
                                                   v1::ModelInfo* resp) {
  return Unary(ctx, "DescribeModel", [&] {
    std::optional<ModelSummary> model = session_->Model();
    if (!model) {
      return Status(StatusCode::FAILED_PRECONDITION,
                    "no model is loaded; LoadModel first");
    }
    *resp = ToProto(*model, /*with_parameters=*/true);
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::Train(CallbackServerContext* ctx,
                                           const v1::TrainRequest* req,
                                           v1::Operation* resp) {
  return Unary(ctx, "Train", [&] {
    absl::StatusOr<TrainSpec> spec = FromProto(*req);
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartTraining(*spec);
    if (!op.ok()) return ToGrpcStatus(op.status());
    *resp = ToProto((*op)->View());
    return Status::OK;
  });
}

ServerWriteReactor<v1::StepReport>* MemprofdService::StreamStepReports(
    CallbackServerContext* ctx, const v1::StreamStepReportsRequest* req) {
  const char* kMethod = "StreamStepReports";
  Status auth = auth_->Check(*ctx);
  if (!auth.ok()) return RejectStream<v1::StepReport>(kMethod, auth);
  auto op = session_->GetOperation(req->operation_id());
  if (!op.ok()) return RejectStream<v1::StepReport>(kMethod, ToGrpcStatus(op.status()));
  if ((*op)->kind() != OperationKind::kTrain) {
    return RejectStream<v1::StepReport>(
        kMethod,
        Status(StatusCode::INVALID_ARGUMENT,
               absl::StrCat("operation ", req->operation_id(),
                            " is not a training operation; it has no step reports")));
  }
  const Clock::time_point start = Clock::now();
  auto* stream = new StepReportStream(
      *op, req->from_step(), [this, start, kMethod](const Status& s) {
        metrics_->RecordRpc(kMethod, GrpcCodeName(s.error_code()), SecondsSince(start));
      });
  stream->Start();
  return stream;
}

ServerUnaryReactor* MemprofdService::Snapshot(CallbackServerContext* ctx,
                                              const v1::SnapshotRequest* req,
                                              v1::Operation* resp) {
  return Unary(ctx, "Snapshot", [&] {
    absl::StatusOr<SnapshotSpec> spec = FromProto(*req);
    if (!spec.ok()) return ToGrpcStatus(spec.status());
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartSnapshot(*spec);
    if (!op.ok()) return ToGrpcStatus(op.status());
    *resp = ToProto((*op)->View());
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::ListSnapshots(CallbackServerContext* ctx,
                                                   const v1::ListSnapshotsRequest*,
                                                   v1::ListSnapshotsResponse* resp) {
  return Unary(ctx, "ListSnapshots", [&] {
    auto list = session_->ListSnapshots();
    if (!list.ok()) return ToGrpcStatus(list.status());
    for (const auto& m : *list)
      *resp->add_snapshots() = ToProto(m, SnapshotMode::kBlocking);
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::DescribeSnapshot(
    CallbackServerContext* ctx, const v1::DescribeSnapshotRequest* req,
    v1::SnapshotManifest* resp) {
  return Unary(ctx, "DescribeSnapshot", [&] {
    auto m = session_->DescribeSnapshot(req->name());
    if (!m.ok()) return ToGrpcStatus(m.status());
    *resp = ToProto(*m, SnapshotMode::kBlocking);
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::DeleteSnapshot(CallbackServerContext* ctx,
                                                    const v1::DeleteSnapshotRequest* req,
                                                    v1::DeleteSnapshotResponse*) {
  return Unary(ctx, "DeleteSnapshot",
               [&] { return ToGrpcStatus(session_->DeleteSnapshot(req->name())); });
}

ServerUnaryReactor* MemprofdService::GetOperation(CallbackServerContext* ctx,
                                                  const v1::GetOperationRequest* req,
                                                  v1::Operation* resp) {
  return Unary(ctx, "GetOperation", [&] {
    auto op = session_->GetOperation(req->id());
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
    std::optional<OperationKind> kind;
    if (req->kind() != v1::OPERATION_KIND_UNSPECIFIED) {
      kind = static_cast<OperationKind>(req->kind());
    }
    for (const auto& op : session_->ListOperations(kind, req->active_only())) {
      *resp->add_operations() = ToProto(op->View());
    }
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::CancelOperation(
    CallbackServerContext* ctx, const v1::CancelOperationRequest* req,
    v1::Operation* resp) {
  return Unary(ctx, "CancelOperation", [&] {
    auto op = session_->CancelOperation(req->id());
    if (!op.ok()) return ToGrpcStatus(op.status());
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
  auto op = session_->GetOperation(req->id());
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
  auto op = session_->GetOperation(req->id());
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
                                                    v1::MemoryStats* resp) {
  return Unary(ctx, "GetMemoryStats", [&] {
    *resp = ToProto(session_->MemoryStats(), session_->Counters().categories);
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::ResetPeakMemory(CallbackServerContext* ctx,
                                                     const v1::ResetPeakMemoryRequest*,
                                                     v1::ResetPeakMemoryResponse*) {
  return Unary(ctx, "ResetPeakMemory", [&] {
    session_->ResetPeakMemory();
    return Status::OK;
  });
}

ServerUnaryReactor* MemprofdService::StartMemoryRecording(
    CallbackServerContext* ctx, const v1::StartMemoryRecordingRequest* req,
    v1::StartMemoryRecordingResponse*) {
  return Unary(ctx, "StartMemoryRecording", [&] {
    // 0 on the wire means "the default" (memory.proto).
    std::optional<int64_t> max_entries;
    if (req->max_entries() != 0) max_entries = req->max_entries();
    return ToGrpcStatus(session_->StartMemoryRecording(max_entries));
  });
}

ServerUnaryReactor* MemprofdService::StopMemoryRecording(
    CallbackServerContext* ctx, const v1::StopMemoryRecordingRequest* req,
    v1::StopMemoryRecordingResponse*) {
  return Unary(ctx, "StopMemoryRecording", [&] {
    session_->StopMemoryRecording(req->clear());
    return Status::OK;
  });
}

ServerWriteReactor<v1::DumpChunk>* MemprofdService::DumpMemoryHistory(
    CallbackServerContext* ctx, const v1::DumpMemoryHistoryRequest*) {
  const char* kMethod = "DumpMemoryHistory";
  Status auth = auth_->Check(*ctx);
  if (!auth.ok()) return RejectStream<v1::DumpChunk>(kMethod, auth);
  absl::StatusOr<std::string> pickle = session_->DumpMemoryHistory();
  if (!pickle.ok())
    return RejectStream<v1::DumpChunk>(kMethod, ToGrpcStatus(pickle.status()));
  const Clock::time_point start = Clock::now();
  return new ChunkStream(*std::move(pickle), [this, start, kMethod](const Status& s) {
    metrics_->RecordRpc(kMethod, GrpcCodeName(s.error_code()), SecondsSince(start));
  });
}

}  // namespace memprofd
