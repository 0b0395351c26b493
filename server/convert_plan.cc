#include "server/convert_plan.h"

#include <array>
#include <string>
#include <utility>

#include "core/dist/sharding.h"
#include "server/convert.h"

namespace memprofd {
namespace {

void ToProto(const plan::NamedBytes& holder, v1::PlanHolder* p) {
  p->set_name(holder.name);
  p->set_bytes(holder.bytes);
}

// Every category, named as CategoryName names it.
template <typename Message>
void AddCategories(const std::array<int64_t, kNumCategories>& bytes, Message* p) {
  for (int c = 0; c < kNumCategories; ++c) {
    v1::CategoryBytes* pc = p->add_categories_at_peak();
    pc->set_category(std::string(CategoryName(static_cast<Category>(c))));
    pc->set_bytes(bytes[static_cast<size_t>(c)]);
  }
}

}  // namespace

absl::StatusOr<PlanMemorySpec> FromProto(const v1::PlanMemoryRequest& r) {
  PlanMemorySpec spec;
  if (r.model_case() == v1::PlanMemoryRequest::kPreset) spec.preset = r.preset();
  if (r.model_case() == v1::PlanMemoryRequest::kHfConfigDir) {
    spec.hf_config_dir = r.hf_config_dir();
  }
  absl::StatusOr<TrainSpec> train = FromProto(r.train());
  if (!train.ok()) return train.status();
  spec.train = *std::move(train);
  if (r.has_target()) spec.target = r.target();
  if (r.has_capacity_bytes()) spec.capacity_bytes = r.capacity_bytes();
  if (r.has_world_size()) spec.world_size = r.world_size();
  if (r.has_sharding()) spec.sharding = r.sharding();
  return spec;
}

v1::MemoryPlan ToProto(const PlanResult& result) {
  const plan::MemoryPlan& m = result.plan;
  v1::MemoryPlan p;
  p.set_model(result.model);
  p.set_target(std::string(plan::TargetName(result.target)));
  p.set_peak_allocated_bytes(m.peak_allocated_bytes);
  p.set_peak_phase(std::string(plan::PeakPhaseName(m.peak_phase, m.peak_at_setup)));
  p.set_peak_step(m.peak_step);
  AddCategories(m.categories_at_peak, &p);
  p.set_model_state_bytes(m.model_state_bytes);
  p.set_activation_bytes(m.activation_bytes);
  p.set_resident_between_steps_bytes(m.resident_between_steps_bytes);
  for (const plan::PhaseCategoryPeak& peak : m.phase_category_peaks) {
    v1::PlanPhaseCategoryPeak* pp = p.add_phase_category_peaks();
    pp->set_phase(std::string(PhaseName(peak.phase)));
    pp->set_category(std::string(CategoryName(peak.category)));
    pp->set_bytes(peak.bytes);
  }
  for (const plan::NamedBytes& h : m.top_modules_at_peak) {
    ToProto(h, p.add_top_modules_at_peak());
  }
  for (const plan::NamedBytes& h : m.top_ops_at_peak) ToProto(h, p.add_top_ops_at_peak());
  p.set_capacity_bytes(m.capacity_bytes);
  p.set_fits(m.fits);
  p.set_headroom_bytes(m.headroom_bytes);
  p.set_offloaded_bytes(m.offloaded_bytes);
  p.set_offload_in_flight_bytes(m.offload_in_flight_bytes);
  p.set_allocations(m.allocations);
  p.set_reserved_bytes(m.reserved_bytes);
  p.set_host_rss_bytes(m.host_rss_bytes);
  p.set_seconds(m.seconds);
  p.set_world_size(m.world_size);
  p.set_sharding(std::string(ShardingName(m.sharding)));
  for (const plan::RankPlan& rank : m.ranks) {
    v1::RankPlan* pr = p.add_ranks();
    pr->set_rank(rank.rank);
    pr->set_peak_allocated_bytes(rank.peak_allocated_bytes);
    pr->set_peak_phase(
        std::string(plan::PeakPhaseName(rank.peak_phase, rank.peak_at_setup)));
    AddCategories(rank.categories_at_peak, pr);
    pr->set_owned_parameter_count(rank.owned_parameter_count);
  }
  return p;
}

}  // namespace memprofd
