#ifndef MEMPROFD_SERVER_SESSION_METRICS_H_
#define MEMPROFD_SERVER_SESSION_METRICS_H_

// The engine's metrics. Gauges and counters are produced at scrape time from
// what the session and the memory recorder publish (copies and atomics), so
// a scrape never waits for the owner thread; the step and snapshot duration
// histograms are fed as the session reports each one (SessionObserver).
// Names in base units; counters end in _total; labels of low cardinality
// only (device, phase, category, outcome).
// Thread-safe: Collect runs on the metrics server's thread, the observer
// calls on the session's.

#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <vector>

#include "core/session/session.h"

namespace memprofd {

class SessionMetrics : public prometheus::Collectable, public SessionObserver {
 public:
  // Reads `session`, which must outlive the scrapes; Attach it to be told of
  // steps and snapshots.
  explicit SessionMetrics(Session* session);
  // A SessionMetrics registered as `session`'s observer.
  static std::shared_ptr<SessionMetrics> Attach(Session* session);

  std::vector<prometheus::MetricFamily> Collect() const override;

  void OnStep(const SessionStepReport& report) override;
  void OnSnapshotPublished(const snapshot::SnapshotManifest& manifest) override;

 private:
  Session* const session_;
  // The histograms live in a registry of their own, collected with the rest.
  const std::shared_ptr<prometheus::Registry> histograms_;
  prometheus::Histogram& step_seconds_;
  prometheus::Histogram& snapshot_seconds_;
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_SESSION_METRICS_H_
