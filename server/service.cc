#include "server/service.h"

#include <chrono>
#include <exception>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dist/sharding.h"
#include "server/convert.h"
#include "server/convert_memory.h"
#include "server/convert_plan.h"
#include "server/grpc_status.h"
#include "server/reactors.h"

namespace memprofd {

using grpc::CallbackServerContext;
using grpc::ServerUnaryReactor;
using grpc::ServerWriteReactor;
using grpc::Status;

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

MemprofdService::MemprofdService(Session* session, const TokenAuth* auth,
                                 ServerMetrics* metrics, ServiceInfo info)
    : session_(session),
      auth_(auth),
      metrics_(metrics),
      info_(std::move(info)),
      dump_builder_("mpd-dumps", session->bulk_nice()) {}

std::vector<std::string> MemprofdService::Features() {
  std::vector<std::string> features = {
      "status",        "health",       "reflection", "operations",  "model",
      "train",         "offload",      "snapshots",  "checkpoints", "resume",
      "memory",        "lr_schedules", "evaluate",   "bf16",        "oom_reports",
      "data_parallel", "memory_plan"};
  // "sharding_optimizer", ...: the levels --sharding accepts.
  for (Sharding level : AllShardings()) {
    if (level != Sharding::kNone) {
      features.push_back(absl::StrCat("sharding_", ShardingName(level)));
    }
  }
  return features;
}

template <typename Fn>
ServerUnaryReactor* MemprofdService::Unary(CallbackServerContext* ctx, const char* method,
                                           Fn fn) {
  const Clock::time_point start = Clock::now();
  absl::Status status = auth_->Check(*ctx);
  // No exception leaves a handler: gRPC would answer an escaped one with
  // UNIMPLEMENTED and no message. Core turns LibTorch's errors into statuses
  // (torch_boundary.h); this is the net under everything else.
  if (status.ok()) {
    try {
      status = fn();
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat(method, " failed: ", e.what()));
    } catch (...) {
      status = absl::InternalError(absl::StrCat(method, " failed: unknown exception"));
    }
  }
  const Status reply = ToGrpcStatus(status);
  metrics_->RecordRpc(method, reply.error_code(), SecondsSince(start));
  ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(reply);
  return reactor;
}

ServerUnaryReactor* MemprofdService::Reject(CallbackServerContext* ctx,
                                            const char* method,
                                            const absl::Status& status) {
  return Unary(ctx, method, [&] { return status; });
}

template <typename Msg>
ServerWriteReactor<Msg>* MemprofdService::RejectStream(const char* method,
                                                       const absl::Status& status) {
  class Rejected : public ServerWriteReactor<Msg> {
   public:
    explicit Rejected(const Status& s) { this->Finish(s); }
    void OnDone() override { delete this; }
  };
  const Status reply = ToGrpcStatus(status);
  metrics_->RecordRpc(method, reply.error_code(), 0);
  return new Rejected(reply);
}

StreamDoneFn MemprofdService::CountWhenDone(const char* method) {
  const Clock::time_point start = Clock::now();
  return [this, start, method](const Status& s) {
    metrics_->RecordRpc(method, s.error_code(), SecondsSince(start));
  };
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
    *resp->mutable_data_parallel() = ToProto(session_->world(), counters.data_parallel);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::LoadModel(CallbackServerContext* ctx,
                                               const v1::LoadModelRequest* req,
                                               v1::Operation* resp) {
  return Unary(ctx, "LoadModel", [&] {
    absl::StatusOr<LoadModelSpec> spec = FromProto(*req);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->LoadModel(*spec);
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::DescribeModel(CallbackServerContext* ctx,
                                                   const v1::DescribeModelRequest*,
                                                   v1::ModelInfo* resp) {
  return Unary(ctx, "DescribeModel", [&] {
    absl::StatusOr<ModelSummary> model = session_->DescribeModel();
    if (!model.ok()) return model.status();
    *resp = ToProto(*model, /*with_parameters=*/true);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::Train(CallbackServerContext* ctx,
                                           const v1::TrainRequest* req,
                                           v1::Operation* resp) {
  return Unary(ctx, "Train", [&] {
    absl::StatusOr<TrainSpec> spec = FromProto(*req);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartTraining(*spec);
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerWriteReactor<v1::StepReport>* MemprofdService::StreamStepReports(
    CallbackServerContext* ctx, const v1::StreamStepReportsRequest* req) {
  const char* kMethod = "StreamStepReports";
  if (absl::Status auth = auth_->Check(*ctx); !auth.ok()) {
    return RejectStream<v1::StepReport>(kMethod, auth);
  }
  auto op = session_->GetTrainingOperation(req->operation_id());
  if (!op.ok()) return RejectStream<v1::StepReport>(kMethod, op.status());
  auto* stream = new StepReportStream(*op, req->from_step(), CountWhenDone(kMethod));
  stream->Start();
  return stream;
}

ServerUnaryReactor* MemprofdService::Snapshot(CallbackServerContext* ctx,
                                              const v1::SnapshotRequest* req,
                                              v1::Operation* resp) {
  return Unary(ctx, "Snapshot", [&] {
    absl::StatusOr<SnapshotSpec> spec = FromProto(*req);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartSnapshot(*spec);
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::ListSnapshots(CallbackServerContext* ctx,
                                                   const v1::ListSnapshotsRequest*,
                                                   v1::ListSnapshotsResponse* resp) {
  return Unary(ctx, "ListSnapshots", [&] {
    auto list = session_->ListSnapshots();
    if (!list.ok()) return list.status();
    for (const auto& m : *list)
      *resp->add_snapshots() = ToProto(m, SnapshotMode::kBlocking);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::DescribeSnapshot(
    CallbackServerContext* ctx, const v1::DescribeSnapshotRequest* req,
    v1::SnapshotManifest* resp) {
  return Unary(ctx, "DescribeSnapshot", [&] {
    auto m = session_->DescribeSnapshot(req->name());
    if (!m.ok()) return m.status();
    *resp = ToProto(*m, SnapshotMode::kBlocking);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::DeleteSnapshot(CallbackServerContext* ctx,
                                                    const v1::DeleteSnapshotRequest* req,
                                                    v1::DeleteSnapshotResponse*) {
  return Unary(ctx, "DeleteSnapshot",
               [&] { return session_->DeleteSnapshot(req->name()); });
}

ServerUnaryReactor* MemprofdService::GetOperation(CallbackServerContext* ctx,
                                                  const v1::GetOperationRequest* req,
                                                  v1::Operation* resp) {
  return Unary(ctx, "GetOperation", [&] {
    auto op = session_->GetOperation(req->id());
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::ListOperations(CallbackServerContext* ctx,
                                                    const v1::ListOperationsRequest* req,
                                                    v1::ListOperationsResponse* resp) {
  return Unary(ctx, "ListOperations", [&] {
    if (!v1::OperationKind_IsValid(req->kind())) {
      return absl::InvalidArgumentError(
          absl::StrCat("kind: unknown operation kind ", req->kind()));
    }
    std::optional<OperationKind> kind;
    if (req->kind() != v1::OPERATION_KIND_UNSPECIFIED) {
      kind = static_cast<OperationKind>(req->kind());
    }
    for (const auto& op : session_->ListOperations(kind, req->active_only())) {
      *resp->add_operations() = ToProto(op->View());
    }
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::CancelOperation(
    CallbackServerContext* ctx, const v1::CancelOperationRequest* req,
    v1::Operation* resp) {
  return Unary(ctx, "CancelOperation", [&] {
    auto op = session_->CancelOperation(req->id());
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::WaitOperation(CallbackServerContext* ctx,
                                                   const v1::WaitOperationRequest* req,
                                                   v1::Operation* resp) {
  const char* kMethod = "WaitOperation";
  if (absl::Status auth = auth_->Check(*ctx); !auth.ok()) {
    return Reject(ctx, kMethod, auth);
  }
  // 0 on the wire means "the longest" (operation.proto).
  std::optional<absl::Duration> timeout;
  if (req->timeout_ms() != 0) timeout = absl::Milliseconds(req->timeout_ms());
  absl::StatusOr<absl::Duration> wait = Session::OperationWaitTimeout(timeout);
  if (!wait.ok()) return Reject(ctx, kMethod, wait.status());
  auto op = session_->GetOperation(req->id());
  if (!op.ok()) return Reject(ctx, kMethod, op.status());
  auto* reactor = new WaitOperationReactor(
      *op, absl::Now() + *wait,
      [resp](const OperationView& view) { *resp = ToProto(view); },
      CountWhenDone(kMethod));
  reactor->Start();
  return reactor;
}

ServerWriteReactor<v1::Operation>* MemprofdService::WatchOperation(
    CallbackServerContext* ctx, const v1::WatchOperationRequest* req) {
  const char* kMethod = "WatchOperation";
  if (absl::Status auth = auth_->Check(*ctx); !auth.ok()) {
    return RejectStream<v1::Operation>(kMethod, auth);
  }
  auto op = session_->GetOperation(req->id());
  if (!op.ok()) return RejectStream<v1::Operation>(kMethod, op.status());
  auto* stream = new WatchOperationStream(*op, CountWhenDone(kMethod));
  stream->Start();
  return stream;
}

ServerUnaryReactor* MemprofdService::GetMemoryStats(CallbackServerContext* ctx,
                                                    const v1::GetMemoryStatsRequest* req,
                                                    v1::MemoryStats* resp) {
  return Unary(ctx, "GetMemoryStats", [&] {
    std::optional<MemoryAcrossRanks> ranks;
    if (req->all_ranks()) {
      absl::StatusOr<MemoryAcrossRanks> gathered = session_->MemoryOfAllRanks();
      if (!gathered.ok()) return gathered.status();
      ranks = *std::move(gathered);
    }
    *resp = ToProto(session_->MemoryStats(), session_->Counters().categories);
    if (ranks) AddRanks(*ranks, resp);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::ResetPeakMemory(CallbackServerContext* ctx,
                                                     const v1::ResetPeakMemoryRequest*,
                                                     v1::ResetPeakMemoryResponse*) {
  return Unary(ctx, "ResetPeakMemory", [&] {
    session_->ResetPeakMemory();
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::StartMemoryRecording(
    CallbackServerContext* ctx, const v1::StartMemoryRecordingRequest* req,
    v1::StartMemoryRecordingResponse*) {
  return Unary(ctx, "StartMemoryRecording", [&] {
    // 0 on the wire means "the default" (memory.proto).
    std::optional<int64_t> max_entries;
    if (req->max_entries() != 0) max_entries = req->max_entries();
    return session_->StartMemoryRecording(max_entries);
  });
}

ServerUnaryReactor* MemprofdService::StopMemoryRecording(
    CallbackServerContext* ctx, const v1::StopMemoryRecordingRequest* req,
    v1::StopMemoryRecordingResponse*) {
  return Unary(ctx, "StopMemoryRecording", [&] {
    session_->StopMemoryRecording(req->clear());
    return absl::OkStatus();
  });
}

ServerWriteReactor<v1::DumpChunk>* MemprofdService::DumpMemoryHistory(
    CallbackServerContext* ctx, const v1::DumpMemoryHistoryRequest*) {
  const char* kMethod = "DumpMemoryHistory";
  if (absl::Status auth = auth_->Check(*ctx); !auth.ok()) {
    return RejectStream<v1::DumpChunk>(kMethod, auth);
  }
  // Taken before the pickle is built, so that refused dumps cost nothing.
  std::shared_ptr<void> slot = dump_slots_.TryAcquire();
  if (slot == nullptr) {
    return RejectStream<v1::DumpChunk>(
        kMethod, absl::ResourceExhaustedError(absl::StrCat(
                     kMaxConcurrentDumps,
                     " memory history dumps are being sent already (each holds its "
                     "pickle until the client reads it); retry when one is done, or "
                     "cancel a client that stopped reading")));
  }
  StreamDoneFn count = CountWhenDone(kMethod);
  auto* stream = new ChunkStream(
      [count, slot = std::move(slot)](const grpc::Status& s) { count(s); });
  // Built on the service's own thread (work_queue.h), not this callback thread.
  dump_builder_.Post([session = session_, deliver = stream->delivery()] {
    if (deliver.wanted()) deliver(session->DumpMemoryHistory());
  });
  return stream;
}

ServerUnaryReactor* MemprofdService::GetMemoryBreakdown(
    CallbackServerContext* ctx, const v1::GetMemoryBreakdownRequest* req,
    v1::MemoryBreakdown* resp) {
  return Unary(ctx, "GetMemoryBreakdown", [&]() -> absl::Status {
    absl::StatusOr<memory::MemoryBreakdown> b =
        session_->MemoryBreakdown(FromProto(*req));
    if (!b.ok()) return b.status();
    *resp = ToProto(*b);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::DiffMemory(CallbackServerContext* ctx,
                                                const v1::DiffMemoryRequest* req,
                                                v1::MemoryDiff* resp) {
  return Unary(ctx, "DiffMemory", [&]() -> absl::Status {
    std::optional<int64_t> top;
    if (req->has_top()) top = req->top();
    absl::StatusOr<memory::MemoryDiff> d =
        session_->DiffMemory(req->step_a(), req->step_b(), top);
    if (!d.ok()) return d.status();
    *resp = ToProto(*d);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::Evaluate(CallbackServerContext* ctx,
                                              const v1::EvaluateRequest* req,
                                              v1::Operation* resp) {
  return Unary(ctx, "Evaluate", [&] {
    absl::StatusOr<std::shared_ptr<Operation>> op =
        session_->StartEvaluation(FromProto(*req));
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::GetLastOomReport(CallbackServerContext* ctx,
                                                      const v1::GetLastOomReportRequest*,
                                                      v1::OomReport* resp) {
  return Unary(ctx, "GetLastOomReport", [&] {
    absl::StatusOr<OomReportRecord> record = session_->LastOomReport();
    if (!record.ok()) return record.status();
    *resp = ToProto(*record);
    return absl::OkStatus();
  });
}

ServerUnaryReactor* MemprofdService::PlanMemory(CallbackServerContext* ctx,
                                                const v1::PlanMemoryRequest* req,
                                                v1::Operation* resp) {
  return Unary(ctx, "PlanMemory", [&] {
    absl::StatusOr<PlanMemorySpec> spec = FromProto(*req);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::shared_ptr<Operation>> op = session_->StartPlan(*spec);
    if (!op.ok()) return op.status();
    *resp = ToProto((*op)->View());
    return absl::OkStatus();
  });
}

}  // namespace memprofd
