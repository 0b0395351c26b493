#include "core/session/operation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "core/common/utf8.h"

namespace memprofd {

Operation::Operation(std::string id, OperationKind kind, size_t max_events)
    : id_(std::move(id)), kind_(kind), max_events_(max_events) {
  view_.id = id_;
  view_.kind = kind_;
  view_.create_time = absl::Now();
  view_.start_time = absl::InfinitePast();
  view_.end_time = absl::InfinitePast();
}

void Operation::Changed() { ++view_.version; }

void Operation::Notify() {
  std::vector<std::shared_ptr<std::function<void()>>> fns;
  {
    absl::MutexLock lock(&listeners_mu_);
    for (auto& [token, fn] : listeners_) fns.push_back(fn);
  }
  for (auto& fn : fns) (*fn)();
}

void Operation::MarkRunning() {
  {
    absl::MutexLock lock(&mu_);
    if (view_.done) return;
    view_.state = OperationState::kRunning;
    view_.start_time = absl::Now();
    Changed();
  }
  Notify();
}

void Operation::SetProgress(int64_t completed, int64_t total, std::string unit,
                            std::string message) {
  {
    absl::MutexLock lock(&mu_);
    view_.completed = completed;
    view_.total = total;
    view_.unit = CapMessage(unit, kMaxOperationMessageBytes);
    view_.message = CapMessage(message, kMaxOperationMessageBytes);
    Changed();
  }
  Notify();
}

namespace {

// `status` with its message capped (CapMessage) and its payloads kept.
absl::Status CappedStatus(const absl::Status& status) {
  if (status.message().size() <= kMaxOperationMessageBytes) return status;
  absl::Status capped(status.code(),
                      CapMessage(status.message(), kMaxOperationMessageBytes));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    capped.SetPayload(url, payload);
  });
  return capped;
}

}  // namespace

void Operation::Finish(absl::Status status, OperationResult result) {
  status = CappedStatus(status);
  {
    absl::MutexLock lock(&mu_);
    if (view_.done) return;
    view_.done = true;
    view_.end_time = absl::Now();
    if (view_.start_time == absl::InfinitePast()) view_.start_time = view_.end_time;
    if (drain_requested_ && (absl::IsCancelled(status) || absl::IsAborted(status))) {
      if (absl::IsCancelled(status)) {
        status = absl::AbortedError(
            absl::StrCat("memprofd is shutting down and stopped this operation (",
                         status.message(), "); run it again once memprofd serves"));
      }
      view_.reason = std::string(kDrainingReason);
    }
    if (status.ok()) {
      view_.state = OperationState::kSucceeded;
    } else if (status.code() == absl::StatusCode::kCancelled) {
      view_.state = OperationState::kCancelled;
    } else {
      view_.state = OperationState::kFailed;
    }
    view_.error = std::move(status);
    if (view_.state != OperationState::kFailed || !view_.reason.empty()) {
      view_.result = std::move(result);
    }
    Changed();
  }
  Notify();
}

void Operation::AppendEvent(SessionStepReport event) {
  {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
    while (events_.size() > max_events_) {
      events_.pop_front();
      ++first_event_;
    }
    Changed();
  }
  Notify();
}

std::vector<SessionStepReport> Operation::EventsFrom(int64_t from, size_t max,
                                                     int64_t* first) const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionStepReport> out;
  int64_t start = std::max(from, first_event_);
  *first = 0;
  for (int64_t i = start;
       i < first_event_ + static_cast<int64_t>(events_.size()) && out.size() < max; ++i) {
    if (out.empty()) *first = i;
    out.push_back(events_[static_cast<size_t>(i - first_event_)]);
  }
  return out;
}

int64_t Operation::events_total() const {
  absl::MutexLock lock(&mu_);
  return first_event_ - 1 + static_cast<int64_t>(events_.size());
}

void Operation::RequestCancel() {
  {
    absl::MutexLock lock(&mu_);
    if (view_.done || cancel_requested_) return;
    cancel_requested_ = true;
    Changed();
  }
  Notify();
}

void Operation::RequestDrain() {
  {
    absl::MutexLock lock(&mu_);
    if (view_.done || cancel_requested_) return;
    cancel_requested_ = true;
    drain_requested_ = true;
    Changed();
  }
  Notify();
}

bool Operation::cancel_requested() const {
  absl::MutexLock lock(&mu_);
  return cancel_requested_;
}

bool Operation::drain_requested() const {
  absl::MutexLock lock(&mu_);
  return drain_requested_;
}

OperationView Operation::View() const {
  absl::MutexLock lock(&mu_);
  return view_;
}

bool Operation::done() const {
  absl::MutexLock lock(&mu_);
  return view_.done;
}

OperationView Operation::WaitForChange(uint64_t seen_version, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto changed = [this, seen_version]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return view_.done || view_.version > seen_version;
  };
  mu_.AwaitWithDeadline(absl::Condition(&changed), deadline);
  return view_;
}

int Operation::Subscribe(std::function<void()> fn) {
  absl::MutexLock lock(&listeners_mu_);
  int token = next_token_++;
  listeners_[token] = std::make_shared<std::function<void()>>(std::move(fn));
  return token;
}

void Operation::Unsubscribe(int token) {
  absl::MutexLock lock(&listeners_mu_);
  listeners_.erase(token);
}

OperationRegistry::OperationRegistry(size_t max_finished, size_t max_events_per_operation)
    : max_finished_(max_finished), max_events_(max_events_per_operation) {}

std::shared_ptr<Operation> OperationRegistry::Create(OperationKind kind) {
  absl::MutexLock lock(&mu_);
  return CreateLocked(kind);
}

std::shared_ptr<Operation> OperationRegistry::CreateLocked(OperationKind kind) {
  auto op =
      std::make_shared<Operation>(absl::StrCat("op-", next_id_++), kind, max_events_);
  ops_.push_back(op);
  Prune();
  return op;
}

absl::StatusOr<std::shared_ptr<Operation>> OperationRegistry::Admit(OperationKind kind) {
  absl::MutexLock lock(&mu_);
  if (!admitting_) {
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance, or once it is back");
  }
  return CreateLocked(kind);
}

std::vector<std::shared_ptr<Operation>> OperationRegistry::StopAdmitting() {
  absl::MutexLock lock(&mu_);
  admitting_ = false;
  std::vector<std::shared_ptr<Operation>> active;
  for (const auto& op : ops_) {
    if (!op->done()) active.push_back(op);
  }
  return active;
}

bool OperationRegistry::admitting() const {
  absl::MutexLock lock(&mu_);
  return admitting_;
}

void OperationRegistry::Prune() {
  size_t finished = 0;
  for (const auto& op : ops_) finished += op->done() ? 1 : 0;
  for (auto it = ops_.begin(); finished > max_finished_ && it != ops_.end();) {
    if ((*it)->done()) {
      it = ops_.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<Operation>> OperationRegistry::Get(
    const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& op : ops_) {
    if (op->id() == id) return op;
  }
  return absl::NotFoundError(absl::StrCat(
      "no operation with id ", Echo(id),
      "; ListOperations shows the known ones (finished ones are kept for the "
      "last ",
      max_finished_, ")"));
}

std::vector<std::shared_ptr<Operation>> OperationRegistry::List(const OperationKind* kind,
                                                                bool active_only) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Operation>> out;
  for (auto it = ops_.rbegin(); it != ops_.rend(); ++it) {
    if (kind != nullptr && (*it)->kind() != *kind) continue;
    if (active_only && (*it)->done()) continue;
    out.push_back(*it);
  }
  return out;
}

int64_t OperationRegistry::ActiveCount() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& op : ops_) n += op->done() ? 0 : 1;
  return n;
}

absl::string_view OperationKindName(OperationKind kind) {
  switch (kind) {
    case OperationKind::kTrain:
      return "train";
    case OperationKind::kSnapshot:
      return "snapshot";
    case OperationKind::kLoadModel:
      return "load_model";
    case OperationKind::kEvaluate:
      return "evaluate";
    case OperationKind::kPlan:
      return "plan";
  }
  return "unknown";
}

absl::string_view OperationStateName(OperationState state) {
  switch (state) {
    case OperationState::kQueued:
      return "QUEUED";
    case OperationState::kRunning:
      return "RUNNING";
    case OperationState::kSucceeded:
      return "SUCCEEDED";
    case OperationState::kFailed:
      return "FAILED";
    case OperationState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

}  // namespace memprofd
