#ifndef MEMPROFD_SERVER_SESSION_METRICS_H_
#define MEMPROFD_SERVER_SESSION_METRICS_H_

// The engine's metrics, produced at scrape time from what the session and the
// memory recorder publish (copies and atomics), so a scrape never waits for
// the owner thread. Names in base units; counters end in _total; labels of
// low cardinality only (device, phase, category, outcome).
// Thread-safe: Collect runs on the exposer's threads.

#include <prometheus/collectable.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/session/session.h"

namespace memprofd {

class SessionMetrics : public prometheus::Collectable {
 public:
  explicit SessionMetrics(Session* session);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  // A cumulative histogram fed with the durations drained from the session.
  struct Buckets {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bound, not cumulative
    uint64_t count = 0;
    double sum = 0;
    void Observe(double v);
  };

  Session* const session_;
  mutable absl::Mutex mu_;
  mutable Buckets step_seconds_ ABSL_GUARDED_BY(mu_);
  mutable Buckets snapshot_seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_SESSION_METRICS_H_
