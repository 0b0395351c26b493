#ifndef MEMPROFD_SERVER_LABELLED_COLLECTABLES_H_
#define MEMPROFD_SERVER_LABELLED_COLLECTABLES_H_

// The collectables one /metrics endpoint serves, collected as one, with a set
// of constant labels added to every sample of every family: the rank and node
// of a data-parallel run, so that Prometheus can tell the ranks apart and no
// metric, present or future, can be exported without them. /metrics serves
// this collectable alone.
//
// Invariant: every ClientMetric that Collect returns carries each constant
// label exactly once. A metric that sets one of those labels itself keeps its
// own value (a figure rank 0 gathered about another rank says whose it is);
// the others are appended after the metric's own labels.
//
// Thread-safe: Add and Collect may be called from any thread (Collect runs on
// the metrics server's thread).

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/labels.h>
#include <prometheus/metric_family.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace memprofd {

class LabelledCollectables : public prometheus::Collectable {
 public:
  explicit LabelledCollectables(const prometheus::Labels& labels);

  // Serves `collectable`'s families from now on; keeps it alive.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);

  // The families of every added collectable, in the order they were added,
  // each sample with the constant labels.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::vector<prometheus::ClientMetric::Label> labels_;
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_LABELLED_COLLECTABLES_H_
