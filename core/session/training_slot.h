#ifndef MEMPROFD_CORE_SESSION_TRAINING_SLOT_H_
#define MEMPROFD_CORE_SESSION_TRAINING_SLOT_H_

// The session's one place for a training: at most one Train operation is
// queued, planned or running at a time. Take() hands out the place as a
// ticket; the ticket gives it back exactly once, in one of two ways:
// - Finish(op, status, result): the place is free, then the operation is
//   finished, so that a client that saw it finish can start the next
//   training at once;
// - its destructor, when the last copy of a ticket that was never finished
//   goes (work posted for a run that shutdown discarded).
// Every path of a training (started, planned under a budget, calibrated,
// followed from rank 0, refused before it started) holds the ticket and ends
// through it; nothing else clears the place.
//
// Thread-safe. The slot's lock is its own and is never held while calling
// out, so a caller may hold its own lock around Take and held().

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/session/operation.h"

namespace memprofd {

class TrainingSlot {
 public:
  class Ticket {
   public:
    ~Ticket() { Release(); }
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;

    // Gives the place back, then finishes `op` with `status` and `result`.
    void Finish(const std::shared_ptr<Operation>& op, absl::Status status,
                OperationResult result = {}) {
      Release();
      op->Finish(std::move(status), std::move(result));
    }

   private:
    friend class TrainingSlot;
    explicit Ticket(TrainingSlot* slot) : slot_(slot) {}
    void Release() {
      if (!released_.exchange(true)) slot_->Free();
    }
    TrainingSlot* const slot_;
    std::atomic<bool> released_{false};
  };

  // The place, or ABORTED when a training holds it. The slot must outlive
  // every ticket (the session owns both and joins its threads first).
  absl::StatusOr<std::shared_ptr<Ticket>> Take() {
    absl::MutexLock lock(&mu_);
    if (holders_ > 0) {
      return absl::AbortedError(
          "another training operation is queued or running; wait for it or cancel it "
          "(ListOperations shows it)");
    }
    ++holders_;
    return std::shared_ptr<Ticket>(new Ticket(this));
  }

  // A data-parallel follower's run, never refused: rank 0 runs one training
  // at a time, but a follower may still be finishing the one before on its
  // owner thread, where this one queues behind it. The place stays held
  // until both tickets are given back.
  std::shared_ptr<Ticket> TakeInTurn() {
    absl::MutexLock lock(&mu_);
    ++holders_;
    return std::shared_ptr<Ticket>(new Ticket(this));
  }

  // A training holds the place now.
  bool held() const {
    absl::MutexLock lock(&mu_);
    return holders_ > 0;
  }

 private:
  void Free() {
    absl::MutexLock lock(&mu_);
    --holders_;
  }

  mutable absl::Mutex mu_;
  int holders_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_TRAINING_SLOT_H_
