#ifndef MEMPROFD_CORE_SESSION_SESSION_H_
#define MEMPROFD_CORE_SESSION_SESSION_H_

// The daemon's engine: one owner thread that runs everything touching the
// model (loads, training steps, snapshots), and the registry of operations it
// works through. RPC handlers never block on it: they enqueue work and get an
// Operation back, and read published copies.

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/operation.h"

namespace memprofd {

struct SessionOptions {
  // "auto" (cuda:0 when LibTorch sees a GPU, else cpu), "cpu", "cuda:N".
  std::string device = "auto";
};

// Thread-safe unless a method says otherwise.
class Session {
 public:
  // INVALID_ARGUMENT for an unparsable device; UNIMPLEMENTED for cuda:N on a
  // build without CUDA; FAILED_PRECONDITION for a GPU that is not there.
  static absl::StatusOr<std::unique_ptr<Session>> Create(const SessionOptions& options);

  // Cancels active operations and joins the owner thread.
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The compute device, "cpu" or "cuda:N".
  const std::string& device() const { return device_; }
  absl::Time start_time() const { return start_time_; }
  OperationRegistry& operations() { return operations_; }

  // Runs `work` on the owner thread, after the work queued before it.
  // UNAVAILABLE once Shutdown has begun.
  absl::Status Post(std::function<void()> work);

  // Stops accepting work, asks every active operation to cancel, lets the
  // owner thread finish the current item (a training step stops at its step
  // boundary) and joins it. Queued items still run so that their operations
  // finish (as CANCELLED). Idempotent.
  void Shutdown();

  bool draining() const;

 private:
  explicit Session(std::string device);
  void OwnerLoop();

  const std::string device_;
  const absl::Time start_time_;
  OperationRegistry operations_;

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread owner_;
};

// Resolves "auto", "cpu", "cuda", "cuda:N" against this build and machine.
absl::StatusOr<std::string> ResolveDevice(const std::string& requested);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SESSION_H_
