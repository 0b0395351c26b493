#include "server/reactors.h"

#include <utility>

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
  FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "wait cancelled"));
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

}  // namespace memprofd
