#include "server/labelled_collectables.h"

#include <algorithm>
#include <utility>

namespace memprofd {
namespace {

std::vector<prometheus::ClientMetric::Label> ToLabelList(
    const prometheus::Labels& labels) {
  std::vector<prometheus::ClientMetric::Label> out;
  for (const auto& [name, value] : labels) out.push_back({name, value});
  return out;
}

}  // namespace

LabelledCollectables::LabelledCollectables(const prometheus::Labels& labels)
    : labels_(ToLabelList(labels)) {}

void LabelledCollectables::Add(std::shared_ptr<prometheus::Collectable> collectable) {
  absl::MutexLock lock(&mu_);
  collectables_.push_back(std::move(collectable));
}

std::vector<prometheus::MetricFamily> LabelledCollectables::Collect() const {
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  {
    // Collect outside the lock: a collectable may take its own locks.
    absl::MutexLock lock(&mu_);
    collectables = collectables_;
  }
  std::vector<prometheus::MetricFamily> families;
  for (const auto& c : collectables) {
    for (prometheus::MetricFamily& f : c->Collect()) families.push_back(std::move(f));
  }
  for (prometheus::MetricFamily& f : families) {
    for (prometheus::ClientMetric& m : f.metric) {
      const size_t own = m.label.size();
      for (const auto& label : labels_) {
        const auto end = m.label.begin() + static_cast<std::ptrdiff_t>(own);
        const bool set = std::any_of(m.label.begin(), end,
                                     [&](const auto& l) { return l.name == label.name; });
        if (!set) m.label.push_back(label);
      }
    }
  }
  return families;
}

}  // namespace memprofd
