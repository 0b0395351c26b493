#ifndef MEMPROFD_SERVER_STREAM_LIMIT_H_
#define MEMPROFD_SERVER_STREAM_LIMIT_H_

// A cap on concurrent streams of one kind whose reactor holds a large
// buffer (DumpMemoryHistory keeps the whole pickle until the client has read
// it). A client that opens such streams and never reads holds that memory
// for as long as it keeps the stream open; the cap bounds the daemon's
// memory at `max` buffers whatever the number of such clients, and the
// streams past it are refused with RESOURCE_EXHAUSTED at once (nothing is
// queued). Thread-safe.

#include <atomic>
#include <memory>

namespace memprofd {

class StreamLimit {
 public:
  explicit StreamLimit(int max) : max_(max) {}

  // A slot held until the last copy of the returned pointer is destroyed
  // (keep it in the reactor's done callback); nullptr when `max` slots are
  // held already.
  std::shared_ptr<void> TryAcquire() {
    int n = held_.load();
    do {
      if (n >= max_) return nullptr;
    } while (!held_.compare_exchange_weak(n, n + 1));
    // Points at this limit (never deleted through it): non-null means held.
    return std::shared_ptr<void>(this, [this](void*) { held_.fetch_sub(1); });
  }

  int max() const { return max_; }
  int held() const { return held_.load(); }

 private:
  const int max_;
  std::atomic<int> held_{0};
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_STREAM_LIMIT_H_
