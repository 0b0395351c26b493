// The conversions of memory plans: a PlanMemoryRequest carries only what the
// client set (its training through TrainRequest's own conversion), and a
// PLAN operation comes back with the whole plan, every category named.
#include "server/convert_plan.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "server/convert.h"

namespace memprofd {
namespace {

TEST(ConvertPlanTest, RequestCarriesOnlyWhatTheClientSet) {
  v1::PlanMemoryRequest req;
  absl::StatusOr<PlanMemorySpec> none = FromProto(req);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->preset.empty());
  EXPECT_TRUE(none->hf_config_dir.empty());
  EXPECT_FALSE(none->target.has_value());
  EXPECT_FALSE(none->capacity_bytes.has_value());
  EXPECT_FALSE(none->train.train.batch_size.has_value());
  EXPECT_FALSE(none->train.offload.enabled.has_value());

  req.set_hf_config_dir("/models/llama");
  req.mutable_train()->set_batch_size(4);
  req.mutable_train()->set_gradient_checkpointing(true);
  req.mutable_train()->mutable_offload()->set_enabled(true);
  req.set_target("cuda");
  req.set_capacity_bytes(0);
  absl::StatusOr<PlanMemorySpec> all = FromProto(req);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->hf_config_dir, "/models/llama");
  EXPECT_TRUE(all->preset.empty());
  EXPECT_EQ(all->train.train.batch_size, std::optional<int64_t>(4));
  EXPECT_EQ(all->train.train.gradient_checkpointing, std::optional<bool>(true));
  EXPECT_EQ(all->train.offload.enabled, std::optional<bool>(true));
  EXPECT_EQ(all->target, std::optional<std::string>("cuda"));
  // 0 is set, as every optional field that is set is used as it is.
  EXPECT_EQ(all->capacity_bytes, std::optional<int64_t>(0));

  req.set_preset("small");  // the oneof: the preset replaces the directory
  absl::StatusOr<PlanMemorySpec> preset = FromProto(req);
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->preset, "small");
  EXPECT_TRUE(preset->hf_config_dir.empty());
}

TEST(ConvertPlanTest, AnUnknownOffloadTargetIsRefusedAsInATrain) {
  v1::PlanMemoryRequest req;
  req.mutable_train()->mutable_offload()->set_target(static_cast<v1::OffloadTarget>(9));
  absl::Status s = FromProto(req).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("offload.target"), absl::string_view::npos) << s;
}

TEST(ConvertPlanTest, PlanOperationCarriesTheWholePlan) {
  PlanResult r;
  r.model = "preset:tiny";
  r.target = plan::PlanSpec::Target::kCuda;
  plan::MemoryPlan& m = r.plan;
  m.peak_phase = Phase::kBackward;
  m.peak_step = 2;
  m.categories_at_peak[static_cast<size_t>(Category::kParameters)] = 100;
  m.categories_at_peak[static_cast<size_t>(Category::kGradients)] = 100;
  m.categories_at_peak[static_cast<size_t>(Category::kSavedActivations)] = 300;
  m.peak_allocated_bytes = 500;
  m.model_state_bytes = 200;
  m.activation_bytes = 300;
  m.resident_between_steps_bytes = 300;
  m.phase_category_peaks.push_back({Phase::kForward, Category::kSavedActivations, 300});
  m.top_modules_at_peak.push_back({"model.layers.0.mlp", 250});
  m.top_ops_at_peak.push_back({"aten::linear", 200});
  m.top_ops_at_peak.push_back({"(no op)", 100});
  m.capacity_bytes = 400;
  m.fits = false;
  m.headroom_bytes = -100;
  m.offloaded_bytes = 64;
  m.offload_in_flight_bytes = 32;
  m.host_rss_bytes = 40960;
  m.reserved_bytes = 6 << 20;
  m.allocations = 42;
  m.seconds = 0.25;

  OperationView view;
  view.kind = OperationKind::kPlan;
  view.state = OperationState::kSucceeded;
  view.done = true;
  view.result = r;
  const v1::Operation op = ToProto(view);
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_PLAN);
  ASSERT_EQ(op.result_case(), v1::Operation::kPlan);
  const v1::MemoryPlan& p = op.plan();
  EXPECT_EQ(p.model(), "preset:tiny");
  EXPECT_EQ(p.target(), "cuda");
  EXPECT_EQ(p.peak_allocated_bytes(), 500);
  EXPECT_EQ(p.peak_phase(), "backward");
  EXPECT_EQ(p.peak_step(), 2);
  // Every category is listed, by its name, zeros too; they sum to the peak.
  ASSERT_EQ(p.categories_at_peak_size(), kNumCategories);
  int64_t sum = 0;
  for (int c = 0; c < kNumCategories; ++c) {
    EXPECT_EQ(p.categories_at_peak(c).category(), CategoryName(static_cast<Category>(c)));
    sum += p.categories_at_peak(c).bytes();
  }
  EXPECT_EQ(sum, p.peak_allocated_bytes());
  EXPECT_EQ(p.model_state_bytes() + p.activation_bytes(), p.peak_allocated_bytes());
  EXPECT_EQ(p.resident_between_steps_bytes(), 300);
  ASSERT_EQ(p.phase_category_peaks_size(), 1);
  EXPECT_EQ(p.phase_category_peaks(0).phase(), "forward");
  EXPECT_EQ(p.phase_category_peaks(0).category(), "saved_activations");
  EXPECT_EQ(p.phase_category_peaks(0).bytes(), 300);
  ASSERT_EQ(p.top_modules_at_peak_size(), 1);
  EXPECT_EQ(p.top_modules_at_peak(0).name(), "model.layers.0.mlp");
  ASSERT_EQ(p.top_ops_at_peak_size(), 2);
  EXPECT_EQ(p.top_ops_at_peak(1).name(), "(no op)");
  EXPECT_EQ(p.capacity_bytes(), 400);
  EXPECT_FALSE(p.fits());
  EXPECT_EQ(p.headroom_bytes(), -100);
  EXPECT_EQ(p.offloaded_bytes(), 64);
  EXPECT_EQ(p.offload_in_flight_bytes(), 32);
  EXPECT_EQ(p.reserved_bytes(), 6 << 20);
  EXPECT_EQ(p.host_rss_bytes(), 40960);
  EXPECT_EQ(p.allocations(), 42);
  EXPECT_EQ(p.seconds(), 0.25);
}

}  // namespace
}  // namespace memprofd
