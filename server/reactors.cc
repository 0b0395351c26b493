#include "server/reactors.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "server/convert.h"

namespace memprofd {

WaitOperationReactor::WaitOperationReactor(std::shared_ptr<Operation> op,
                                           absl::Time deadline, Respond respond,
                                           StreamDoneFn on_done)
    : op_(std::move(op)),
      deadline_(deadline),
      respond_(std::move(respond)),
      on_done_(std::move(on_done)),
      link_(std::make_shared<Link>()) {
  link_->reactor = this;
}

void WaitOperationReactor::Start() {
  std::shared_ptr<Link> link = link_;
  token_ = op_->Subscribe([link] {
    absl::MutexLock lock(&link->mu);
    if (link->reactor != nullptr) link->reactor->CheckLocked(false);
  });
  alarm_.Set(absl::ToChronoTime(deadline_), [link](bool fired) {
    absl::MutexLock lock(&link->mu);
    if (fired && link->reactor != nullptr) link->reactor->CheckLocked(true);
  });
  absl::MutexLock lock(&link_->mu);
  CheckLocked(false);
}

void WaitOperationReactor::CheckLocked(bool timed_out) {
  if (finished_) return;
  OperationView view = op_->View();
  if (view.done || timed_out) {
    respond_(view);
    FinishLocked(grpc::Status::OK);
  }
}

void WaitOperationReactor::FinishLocked(const grpc::Status& status) {
  if (finished_) return;
  finished_ = true;
  final_status_ = status;
  Finish(status);
}

void WaitOperationReactor::OnCancel() {
  absl::MutexLock lock(&link_->mu);
  FinishLocked(ToGrpcStatus(absl::CancelledError("wait cancelled")));
}

void WaitOperationReactor::OnDone() {
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;
  }
  op_->Unsubscribe(token_);
  alarm_.Cancel();
  if (on_done_) on_done_(final_status_);
  delete this;
}

bool WatchOperationStream::Next(v1::Operation* msg) {
  OperationView view = op_->View();
  if (sent_any_ && view.version == last_version_) return false;
  if (sent_done_) return false;
  sent_any_ = true;
  last_version_ = view.version;
  sent_done_ = view.done;
  *msg = ToProto(view);
  return true;
}

StepReportStream::StepReportStream(std::shared_ptr<Operation> op, int64_t from_step,
                                   StreamDoneFn on_done)
    : OperationStream(std::move(op), std::move(on_done)),
      next_(std::max<int64_t>(1, from_step)) {}

bool StepReportStream::Next(v1::StepReport* msg) {
  // done is read before the events: events are appended before Finish, so
  // when done is seen every event is there.
  done_ = op_->done();
  int64_t first = 0;
  std::vector<SessionStepReport> events = op_->EventsFrom(next_, 1, &first);
  if (events.empty()) return false;
  next_ = first + 1;
  *msg = ToProto(events.front());
  return true;
}

ChunkStream::ChunkStream(StreamDoneFn on_done)
    : on_done_(std::move(on_done)), link_(std::make_shared<Link>()) {
  link_->stream = this;
}

void ChunkStream::Delivery::operator()(absl::StatusOr<std::string> data) const {
  absl::MutexLock lock(&link_->mu);
  ChunkStream* stream = link_->stream;
  if (stream == nullptr || stream->finished_ || stream->delivered_) return;
  stream->delivered_ = true;
  if (!data.ok()) {
    stream->FinishLocked(ToGrpcStatus(data.status()));
    return;
  }
  stream->data_ = *std::move(data);
  stream->NextLocked();
}

bool ChunkStream::Delivery::wanted() const {
  absl::MutexLock lock(&link_->mu);
  return link_->stream != nullptr && !link_->stream->finished_;
}

void ChunkStream::OnWriteDone(bool ok) {
  absl::MutexLock lock(&link_->mu);
  if (!ok) {
    FinishLocked(ToGrpcStatus(absl::CancelledError("client went away")));
    return;
  }
  NextLocked();
}

void ChunkStream::OnCancel() {
  // Once writing, the write in flight fails and OnWriteDone finishes; before
  // the delivery nothing else would.
  absl::MutexLock lock(&link_->mu);
  if (!delivered_) FinishLocked(ToGrpcStatus(absl::CancelledError("dump cancelled")));
}

void ChunkStream::OnDone() {
  {
    absl::MutexLock lock(&link_->mu);
    link_->stream = nullptr;
  }
  if (on_done_) on_done_(final_);
  delete this;
}

void ChunkStream::NextLocked() {
  if (offset_ >= data_.size()) {
    FinishLocked(grpc::Status::OK);
    return;
  }
  const size_t n = std::min(kChunk, data_.size() - offset_);
  chunk_.set_data(data_.substr(offset_, n));
  offset_ += n;
  StartWrite(&chunk_);
}

void ChunkStream::FinishLocked(const grpc::Status& status) {
  if (finished_) return;
  finished_ = true;
  final_ = status;
  Finish(status);
}

}  // namespace memprofd
