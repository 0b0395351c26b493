// Attribution of every allocation: module, op, category, phase and step at
// allocation time, re-tags, the recorder's cells, breakdowns, step diffs and
// the memory_viz frames and categories.

#include "core/common/attribution.h"

#include <ATen/ATen.h>

#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "core/common/phase.h"
#include "core/memory/breakdown.h"
#include "core/memory/cpu_allocator.h"
#include "core/memory/memory_viz.h"
#include "core/memory/op_attribution.h"
#include "core/memory/recorder.h"
#include "core/memory/tagging.h"
#include "gtest/gtest.h"
#include "tests/memory/test_util.h"

namespace memprofd {
namespace memory {
namespace {

MemoryRecorder& R() { return MemoryRecorder::Global(); }

int64_t Sum(const std::array<int64_t, kNumCategories>& a) {
  return std::accumulate(a.begin(), a.end(), int64_t{0});
}

int64_t CellBytesOf(ModuleId module, Category category) {
  int64_t bytes = 0;
  for (const CellBytes& c : R().LiveCells()) {
    if (c.device == kCpuDevice && c.module == module && c.category == category) {
      bytes += c.bytes;
    }
  }
  return bytes;
}

TEST(AttributionTest, NamesAndCategoriesRoundTrip) {
  std::set<absl::string_view> names;
  for (int i = 0; i < kNumCategories; ++i) {
    const auto c = static_cast<Category>(i);
    EXPECT_FALSE(CategoryName(c).empty()) << i;
    EXPECT_EQ(CategoryFromName(CategoryName(c)), c);
    names.insert(CategoryName(c));
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(kNumCategories));
  // The numbering is stored (history entries): new categories only append.
  EXPECT_EQ(static_cast<int>(Category::kOther), 9);
  EXPECT_EQ(static_cast<int>(Category::kGatheredParameters), 10);
  EXPECT_EQ(CategoryName(Category::kGatheredParameters), "gathered_parameters");
  EXPECT_EQ(CategoryFromName("gathered_parameters"), Category::kGatheredParameters);
  EXPECT_EQ(static_cast<int>(Category::kFrozenParameters), 11);
  EXPECT_EQ(CategoryFromName("frozen_parameters"), Category::kFrozenParameters);
  EXPECT_EQ(CategoryName(static_cast<Category>(kNumCategories)), "unknown");
  EXPECT_FALSE(CategoryFromName("activations").has_value());
  EXPECT_FALSE(CategoryFromName("").has_value());
  EXPECT_EQ(ModuleKindOf("model.layers.3.mlp.down_proj"), ModuleKind::kMlp);
  EXPECT_EQ(ModuleKindOf("model.layers.0.self_attn.q_proj.weight"),
            ModuleKind::kAttention);
  EXPECT_EQ(ModuleKindOf("model.layers.1.input_layernorm"), ModuleKind::kNorm);
  EXPECT_EQ(ModuleKindOf("model.norm"), ModuleKind::kNorm);
  EXPECT_EQ(ModuleKindOf("model.embed_tokens.weight"), ModuleKind::kEmbed);
  EXPECT_EQ(ModuleKindOf("lm_head"), ModuleKind::kHead);
  EXPECT_EQ(ModuleKindOf(""), ModuleKind::kOther);
  const ModuleId a = InternModule("test.attr.a");
  EXPECT_NE(a, 0);
  EXPECT_EQ(InternModule("test.attr.a"), a);
  EXPECT_EQ(ModuleName(a), "test.attr.a");
  EXPECT_EQ(InternModule(""), 0);
  EXPECT_EQ(ModuleName(0), "");
}

TEST(AttributionTest, ScopesReachTheBlockAndCategoriesTileTheAllocator) {
  EnsureAccountingInstalled();
  const ModuleId module = InternModule("test.scopes.block");
  at::Tensor t;
  {
    ModuleScope m(module);
    CategoryScope c(Category::kOptimizerState);
    t = at::empty({1000}, at::kFloat);
  }
  std::optional<Attribution> a = StorageAttribution(t);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->module, module);
  EXPECT_EQ(a->category, Category::kOptimizerState);
  EXPECT_EQ(CellBytesOf(module, Category::kOptimizerState), 4000);
  // Outside a step and any scope: "other".
  at::Tensor u = at::empty({10}, at::kFloat);
  EXPECT_EQ(StorageAttribution(u)->category, Category::kOther);
  EXPECT_EQ(StorageAttribution(u)->module, 0);
  EXPECT_EQ(Sum(R().CategoryBytesOf(kCpuDevice)), R().CurrentBytes(kCpuDevice));
  t = at::Tensor();
  EXPECT_EQ(CellBytesOf(module, Category::kOptimizerState), 0);
  EXPECT_EQ(Sum(R().CategoryBytesOf(kCpuDevice)), R().CurrentBytes(kCpuDevice));
}

TEST(AttributionTest, SavedActivationRetagMovesOnlyTemporaries) {
  EnsureAccountingInstalled();
  const ModuleId module = InternModule("test.retag");
  at::Tensor temp, param;
  BeginStep(900);
  {
    PhaseScope forward(Phase::kForward);
    ModuleScope m(module);
    temp = at::empty({256}, at::kFloat);
    CategoryScope p(Category::kParameters);
    param = at::empty({64}, at::kFloat);
  }
  EndStep(900);
  EXPECT_EQ(StorageAttribution(temp)->category, Category::kTemporaries);
  const int64_t saved0 = R().CategoryBytesOf(kCpuDevice)[4];
  EXPECT_TRUE(MarkSavedActivation(temp.narrow(0, 10, 5)));  // a view: its storage
  EXPECT_FALSE(MarkSavedActivation(param));
  EXPECT_EQ(StorageAttribution(temp)->category, Category::kSavedActivations);
  EXPECT_EQ(StorageAttribution(temp)->module, module);
  EXPECT_EQ(StorageAttribution(param)->category, Category::kParameters);
  EXPECT_EQ(R().CategoryBytesOf(kCpuDevice)[4], saved0 + 1024);
  EXPECT_EQ(CellBytesOf(module, Category::kSavedActivations), 1024);
  EXPECT_EQ(CellBytesOf(module, Category::kTemporaries), 0);
  temp = at::Tensor();  // Freed under its new category: the cell returns to 0.
  EXPECT_EQ(CellBytesOf(module, Category::kSavedActivations), 0);
  EXPECT_EQ(Sum(R().CategoryBytesOf(kCpuDevice)), R().CurrentBytes(kCpuDevice));
  EXPECT_FALSE(TagStorage(at::Tensor(), module, Category::kOther));
}

TEST(AttributionTest, OpCallbacksNameForwardOpsAndBackwardNodesWithTheirModule) {
  EnsureAccountingInstalled();
  const ModuleId module = InternModule("test.ops.linear");
  ASSERT_TRUE(R().StartRecording(100000).ok());
  {
    OpAttribution ops;
    at::Tensor x = at::randn({64, 32}).requires_grad_(true);
    at::Tensor w = at::randn({16, 32}).requires_grad_(true);
    at::Tensor y;
    {
      ModuleScope m(module);
      y = at::linear(x, w);
      EXPECT_EQ(OpName(StorageAttribution(y)->op), "aten::linear");
      EXPECT_EQ(StorageAttribution(y)->module, module);
    }
    at::Tensor loss = y.sum();
    PhaseScope backward(Phase::kBackward);
    loss.backward();
  }
  R().StopRecording();
  const HistorySnapshot h = R().History();
  R().ClearHistory();
  bool backward_alloc_in_module = false;
  for (const HistoryEntry& e : h.entries) {
    if (e.action != HistoryAction::kAlloc || e.phase != Phase::kBackward) continue;
    const std::string op = OpName(e.op);
    if (op.find("Backward") != std::string::npos && e.module == module) {
      backward_alloc_in_module = true;
    }
  }
  EXPECT_TRUE(backward_alloc_in_module)
      << "no backward allocation named a backward node and the forward op's module";
  // Without the callbacks, no op.
  at::Tensor z = at::mm(at::ones({4, 4}), at::ones({4, 4}));
  EXPECT_EQ(StorageAttribution(z)->op, 0);
}

TEST(AttributionTest, StepRecordsGiveBreakdownsAndDiffs) {
  MemoryRecorder r;
  const ModuleId grows = InternModule("test.diff.grows");
  const ModuleId steady = InternModule("test.diff.steady");
  const OpId op = InternOp("test::op");
  auto at = [&](ModuleId m, Category c, Phase p, int64_t step) {
    Attribution a;
    a.module = m;
    a.category = c;
    a.phase = p;
    a.step = step;
    a.op = op;
    return a;
  };
  for (int64_t step = 1; step <= 3; ++step) {
    r.OnStepBegin(step);
    r.OnPhase(Phase::kForward);
    const Attribution g = at(grows, Category::kSavedActivations, Phase::kForward, step);
    const Attribution s = at(steady, Category::kTemporaries, Phase::kForward, step);
    r.RecordAlloc(kCpuDevice, 0x1000, 100 * step, g);
    r.RecordAlloc(kCpuDevice, 0x2000, 50, s);
    r.RecordFree(kCpuDevice, 0x2000, 50, s);
    r.OnPhase(Phase::kBackward);
    r.RecordFree(kCpuDevice, 0x1000, 100 * step, g);
    r.OnPhase(Phase::kIdle);
    r.OnStepEnd(step);
  }
  BreakdownQuery q;
  const MemoryBreakdown b = ComputeBreakdown(r, q);
  EXPECT_EQ(b.step, 3);
  ASSERT_GE(b.rows.size(), 2u);
  EXPECT_EQ(b.rows[0].key, "test.diff.grows");
  EXPECT_EQ(b.rows[0].category, Category::kSavedActivations);
  EXPECT_EQ(b.rows[0].peak_bytes, 300);
  EXPECT_EQ(b.rows[0].peak_phase, Phase::kForward);
  EXPECT_EQ(b.rows[1].peak_bytes, 50);
  ASSERT_EQ(b.ops.size(), 1u);
  EXPECT_EQ(b.ops[0].key, "test::op");
  EXPECT_EQ(b.ops[0].allocated_bytes, 350);
  EXPECT_EQ(b.ops[0].allocated_bytes_total, 150 + 250 + 350);
  q.phase = Phase::kBackward;  // Seeded at entry with what forward left.
  EXPECT_EQ(ComputeBreakdown(r, q).rows[0].peak_bytes, 300);
  q.phase.reset();
  q.by = BreakdownKey::kCategory;
  const MemoryBreakdown by_cat = ComputeBreakdown(r, q);
  ASSERT_FALSE(by_cat.rows.empty());
  EXPECT_EQ(by_cat.rows[0].key, "saved_activations");
  EXPECT_EQ(by_cat.rows[0].peak_bytes, 300);

  absl::StatusOr<MemoryDiff> d = ComputeDiff(r, 1, 3, std::nullopt, kCpuDevice);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->rows.size(), 1u);  // The steady module did not change.
  EXPECT_EQ(d->rows[0].module, "test.diff.grows");
  EXPECT_EQ(d->rows[0].peak_a, 100);
  EXPECT_EQ(d->rows[0].peak_b, 300);
  ASSERT_FALSE(d->categories.empty());
  EXPECT_EQ(d->categories[0].category, Category::kSavedActivations);
  EXPECT_EQ(d->steps_kept, (std::vector<int64_t>{1, 2, 3}));

  const absl::StatusOr<MemoryDiff> missing =
      ComputeDiff(r, 1, 7, std::nullopt, kCpuDevice);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("1, 2, 3"), std::string::npos)
      << missing.status();
  EXPECT_EQ(ComputeDiff(r, 0, 1, std::nullopt, kCpuDevice).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ComputeDiff(r, 1, 2, 0, kCpuDevice).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AttributionTest, BreakdownRequestsAreValidated) {
  BreakdownRequest req;
  absl::StatusOr<BreakdownQuery> q = ParseBreakdownQuery(req, kCpuDevice);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->by, BreakdownKey::kModule);
  EXPECT_EQ(q->top, kDefaultTop);
  EXPECT_FALSE(q->phase.has_value());
  req.by = "layer";
  EXPECT_EQ(ParseBreakdownQuery(req, kCpuDevice).status().code(),
            absl::StatusCode::kInvalidArgument);
  req.by = "op";
  req.phase = "backwards";
  absl::Status bad = ParseBreakdownQuery(req, kCpuDevice).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("backward"), std::string::npos) << bad;
  req.phase = "backward";
  req.top = 0;
  EXPECT_EQ(ParseBreakdownQuery(req, kCpuDevice).status().code(),
            absl::StatusCode::kInvalidArgument);
  req.top = 5;
  q = ParseBreakdownQuery(req, kCpuDevice);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->phase, Phase::kBackward);
  EXPECT_EQ(q->top, 5);
}

TEST(AttributionTest, LargestLiveBlocksNameTheirOrigin) {
  EnsureAccountingInstalled();
  const ModuleId module = InternModule("test.largest");
  at::Tensor big;
  {
    ModuleScope m(module);
    CategoryScope c(Category::kSnapshotStaging);
    big = at::empty({int64_t{64} << 20}, at::kByte);  // Larger than anything else here.
  }
  const std::vector<AttributedBlock> top = LargestLiveBlocks(3);
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(top[0].size, int64_t{64} << 20);
  EXPECT_EQ(top[0].module, "test.largest");
  EXPECT_EQ(top[0].category, Category::kSnapshotStaging);
  for (size_t i = 1; i < top.size(); ++i) EXPECT_LE(top[i].size, top[i - 1].size);
}

TEST(AttributionTest, BlocksKeepTheirOriginAcrossStopAndClear) {
  EnsureAccountingInstalled();
  const ModuleId module = InternModule("test.clear.kept");
  R().ClearHistory();
  ASSERT_TRUE(R().StartRecording(1000).ok());
  at::Tensor kept;
  {
    ModuleScope m(module);
    kept = at::empty({4321}, at::kByte);
  }
  R().StopRecording();
  R().ClearHistory();
  // A fresh recording lists every live block first, with the origin its
  // header kept: the block allocated before the clear is no ghost.
  ASSERT_TRUE(R().StartRecording(100000).ok());
  const HistorySnapshot h = R().History();
  R().StopRecording();
  R().ClearHistory();
  const auto addr = reinterpret_cast<uint64_t>(kept.data_ptr());
  bool found = false;
  for (const HistoryEntry& e : h.entries) {
    if (e.addr == addr && e.action == HistoryAction::kAlloc) {
      found = true;
      EXPECT_EQ(e.module, module);
      EXPECT_EQ(e.size, 4321);
      EXPECT_EQ(e.category, Category::kOther);
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
