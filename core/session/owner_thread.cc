#include "core/session/owner_thread.h"

#include <utility>

#include "core/common/threads.h"

namespace memprofd {

OwnerThread::OwnerThread(std::string name, int nice_increment,
                         std::function<void()> boundary_work)
    : boundary_work_(std::move(boundary_work)) {
  thread_ = std::thread(
      [this, name = std::move(name), nice_increment] { Loop(name, nice_increment); });
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

void OwnerThread::Loop(const std::string& name, int nice_increment) {
  // Set first: what this thread starts later inherits both (threads.h).
  NameAndLowerThisThread(name, nice_increment);
  auto run_boundary_work = [this] {
    if (boundary_work_) boundary_work_();
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
  }
  run_boundary_work();
}

}  // namespace memprofd
