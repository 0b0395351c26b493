#include "core/session/owner_thread.h"

#include <utility>

#include "core/common/host_heap.h"
#include "core/common/threads.h"

namespace memprofd {

OwnerThread::OwnerThread(std::string name, int nice_increment, bool return_host_memory)
    : name_(std::move(name)),
      nice_increment_(nice_increment),
      return_host_memory_(return_host_memory) {}

void OwnerThread::Start(BoundaryWork* boundary_work) {
  absl::MutexLock join_lock(&join_mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this, boundary_work] { Loop(boundary_work); });
}

OwnerThread::~OwnerThread() {
  Stop();
  Join();
}

absl::Status OwnerThread::Post(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance");
  }
  queue_.push_back(std::move(work));
  return absl::OkStatus();
}

void OwnerThread::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

bool OwnerThread::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_;
}

bool OwnerThread::Join() {
  absl::MutexLock join_lock(&join_mu_);
  if (!thread_.joinable()) return false;
  thread_.join();
  absl::MutexLock lock(&mu_);
  joined_ = true;
  return true;
}

bool OwnerThread::joined() const {
  absl::MutexLock lock(&mu_);
  return joined_;
}

void OwnerThread::Loop(BoundaryWork* boundary_work) {
  // Set first: what this thread starts later inherits both (threads.h).
  NameAndLowerThisThread(name_, nice_increment_);
  auto run_boundary_work = [boundary_work] {
    if (boundary_work != nullptr) boundary_work->RunBoundaryWork();
  };
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) break;  // stopping and nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
    run_boundary_work();
    if (return_host_memory_) ReturnFreedHostMemory();
  }
  run_boundary_work();
}

}  // namespace memprofd
