#ifndef MEMPROFD_SERVER_WORK_QUEUE_H_
#define MEMPROFD_SERVER_WORK_QUEUE_H_

// One thread of the server's own that runs posted jobs in the order posted:
// for work too long to do on gRPC's callback threads. Those are few (two in
// Debian's gRPC 1.51), so while one of them builds a memory history pickle
// (tens of milliseconds with a full ring) every other RPC, GetStatus
// included, waits behind it. Thread-safe. The destructor runs what is
// queued, then joins.

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace memprofd {

class WorkQueue {
 public:
  // `thread_name`: what top -H and /proc show for the thread (15 bytes);
  // `nice`: added to its nice value (0..19, threads.h; 0 keeps the
  // process's).
  explicit WorkQueue(std::string thread_name, int nice = 0);
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Runs `job` on the queue's thread after those posted before it.
  void Post(std::function<void()> job);

 private:
  void Loop(const std::string& thread_name, int nice);

  absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_WORK_QUEUE_H_
