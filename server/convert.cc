#include "server/convert.h"

#include <string>

namespace memprofd {

int64_t UnixMicros(absl::Time t) {
  if (t == absl::InfinitePast()) return 0;
  return absl::ToUnixMicros(t);
}

namespace {

v1::OperationState ToProto(OperationState s) {
  switch (s) {
    case OperationState::kQueued:
      return v1::OPERATION_STATE_QUEUED;
    case OperationState::kRunning:
      return v1::OPERATION_STATE_RUNNING;
    case OperationState::kSucceeded:
      return v1::OPERATION_STATE_SUCCEEDED;
    case OperationState::kFailed:
      return v1::OPERATION_STATE_FAILED;
    case OperationState::kCancelled:
      return v1::OPERATION_STATE_CANCELLED;
  }
  return v1::OPERATION_STATE_UNSPECIFIED;
}

}  // namespace

v1::Operation ToProto(const OperationView& view) {
  v1::Operation op;
  op.set_id(view.id);
  op.set_kind(static_cast<v1::OperationKind>(static_cast<int>(view.kind)));
  op.set_state(ToProto(view.state));
  op.set_done(view.done);
  v1::Progress* p = op.mutable_progress();
  p->set_completed(view.completed);
  p->set_total(view.total);
  p->set_unit(view.unit);
  p->set_message(view.message);
  op.set_create_time_us(UnixMicros(view.create_time));
  op.set_start_time_us(UnixMicros(view.start_time));
  op.set_end_time_us(UnixMicros(view.end_time));
  if (!view.error.ok()) {
    op.mutable_error()->set_code(static_cast<int>(view.error.code()));
    op.mutable_error()->set_message(std::string(view.error.message()));
  }
  return op;
}

}  // namespace memprofd
