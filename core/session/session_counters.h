#ifndef MEMPROFD_CORE_SESSION_SESSION_COUNTERS_H_
#define MEMPROFD_CORE_SESSION_SESSION_COUNTERS_H_

// The session's counters and observers, shared by the parts that count
// (training, snapshots, evaluations, data parallel's alignment) and those that
// read them (Session::Counters, the rank-memory thread). Each part is handed
// references to them at construction; none reaches into the Session.
//
// Thread-safe; each has its own lock, never held while calling out.

#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "core/session/session_types.h"

namespace memprofd {

class CounterBoard {
 public:
  // fn(counters) under the board's lock: quick, and calling nothing that
  // takes another lock.
  void Update(absl::FunctionRef<void(SessionCounters&)> fn) {
    absl::MutexLock lock(&mu_);
    fn(counters_);
  }
  SessionCounters Read() const {
    absl::MutexLock lock(&mu_);
    return counters_;
  }
  // A finished evaluation (an Evaluate operation's, or a training's
  // periodic one).
  void CountEvaluation(const EvalResult& result) {
    Update([&](SessionCounters& c) {
      c.evaluations_total += 1;
      c.last_eval = result;
    });
  }

 private:
  mutable absl::Mutex mu_;
  SessionCounters counters_ ABSL_GUARDED_BY(mu_);
};

class ObserverList {
 public:
  void Add(std::shared_ptr<SessionObserver> observer) {
    absl::MutexLock lock(&mu_);
    observers_.push_back(std::move(observer));
  }
  // A copy, to call without the lock.
  std::vector<std::shared_ptr<SessionObserver>> Get() const {
    absl::MutexLock lock(&mu_);
    return observers_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<SessionObserver>> observers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SESSION_COUNTERS_H_
