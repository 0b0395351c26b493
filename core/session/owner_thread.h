#ifndef MEMPROFD_CORE_SESSION_OWNER_THREAD_H_
#define MEMPROFD_CORE_SESSION_OWNER_THREAD_H_

// The session's owner thread: the one thread that runs everything touching
// the model (loads, trainings, the wake-ups of boundary work), one item at a
// time, in the order it was posted. After each item, and once more when it
// stops, it runs the boundary work it was started with (snapshots and evaluations
// waiting for a step boundary: when no training runs, the end of an item is
// that boundary). The session's plan thread (mpd-plan) is a second one,
// without boundary work: memory plans touch no model.
//
// At its start the thread names itself and lowers its priority by the nice
// increment it was given (SessionOptions::bulk_nice), before it runs
// anything, so that the threads it goes on to create (libgomp's pool,
// autograd's, the offloader's, the snapshot writers) inherit both
// (threads.h).
//
// Threads:
// - The owner thread: the posted work and the boundary callback.
// - Any thread: Post, Stop, stopping, joined.
// - Any thread but the owner thread: Join (the session's shutdown).
//
// Invariants:
// - Posted work runs on the owner thread only, one item at a time, in the
//   order Post accepted it; the boundary callback runs after every item and
//   once after the last.
// - Post accepts work until Stop and returns UNAVAILABLE from then on. Every
//   item it accepted runs, after Stop too: work whose operation was cancelled
//   finishes it as CANCELLED itself.
// - No lock of this class is held while work or the boundary callback runs,
//   so they may Post, and callers may Post while holding their own locks.

#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/session/boundary_work.h"

namespace memprofd {

class OwnerThread {
 public:
  // A thread to be named `name` (as top -H shows it), its nice value raised
  // by `nice_increment` (0..kMaxNice; 0 leaves it). With
  // `return_host_memory`, after each item (and its boundary work) it gives
  // the heap's free pages back to the kernel (ReturnFreedHostMemory). Post
  // queues work from now on; nothing runs before Start.
  OwnerThread(std::string name, int nice_increment, bool return_host_memory = false);
  // Starts the thread. `boundary_work` (null: none; otherwise it outlives
  // the thread) runs on it after each item and once when it stops. Once.
  void Start(BoundaryWork* boundary_work);
  // Stop, then Join.
  ~OwnerThread();

  OwnerThread(const OwnerThread&) = delete;
  OwnerThread& operator=(const OwnerThread&) = delete;

  // Queues `work` to run after the work queued before it. UNAVAILABLE once
  // Stop was called (the work is dropped, not run).
  absl::Status Post(std::function<void()> work);

  // Refuses work from now on and lets the thread end once it has run what
  // is queued (then the boundary work, one last time). Returns at once;
  // idempotent.
  void Stop();
  // True once Stop was called.
  bool stopping() const;

  // Waits for the thread to end; call after Stop. True for the call that
  // joined it; false for later ones (and for concurrent ones, once it has
  // ended).
  bool Join();
  // True once a Join has returned.
  bool joined() const;

 private:
  void Loop(BoundaryWork* boundary_work);

  const std::string name_;
  const int nice_increment_;
  const bool return_host_memory_;

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;

  // Serialises Start and Join: the thread is started once, and joined
  // once, by the first caller.
  absl::Mutex join_mu_;
  bool started_ ABSL_GUARDED_BY(join_mu_) = false;
  std::thread thread_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_OWNER_THREAD_H_
