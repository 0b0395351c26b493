#include "server/work_queue.h"

#include <utility>

#include "core/common/threads.h"

namespace memprofd {

WorkQueue::WorkQueue(std::string thread_name, int nice)
    : thread_([this, name = std::move(thread_name), nice] { Loop(name, nice); }) {}

WorkQueue::~WorkQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void WorkQueue::Post(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(std::move(job));
}

void WorkQueue::Loop(const std::string& thread_name, int nice) {
  NameAndLowerThisThread(thread_name, nice);
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !jobs_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, and everything posted has run
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace memprofd
