// Issue 12's "done when", in-process: a session trains `tiny` with
// attribution on; the largest activation holders in backward are layers'
// attention or MLP modules, the categories tile the allocator at every op of
// the step, and the memory_viz dump names modules and ops and is read by
// PyTorch's own torch.cuda._memory_viz. Also: the checkpoint recompute
// attributes to the layer's modules, and step diffs.

#include "core/common/attribution.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "core/memory/breakdown.h"
#include "core/memory/recorder.h"
#include "core/session/session.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/operation.h"
#include "tests/testing/session.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::memprofd::testing::RunPython;
using ::memprofd::testing::SourcePath;
using ::memprofd::testing::TempDir;
using ::memprofd::testing::WaitDone;

// Largest |categories - allocator| / allocator seen at an op start, and how
// many op starts were checked, while the callback is installed.
std::atomic<int64_t> g_checks{0};
std::atomic<int64_t> g_worst_ppm{0};

std::unique_ptr<at::ObserverContext> CheckTiling(const at::RecordFunction&) {
  const memory::MemoryRecorder& r = memory::MemoryRecorder::Global();
  const std::array<int64_t, kNumCategories> c = r.CategoryBytesOf(memory::kCpuDevice);
  const int64_t sum = std::accumulate(c.begin(), c.end(), int64_t{0});
  const int64_t total = r.CurrentBytes(memory::kCpuDevice);
  if (total > 0) {
    const int64_t ppm = std::llabs(sum - total) * 1'000'000 / total;
    int64_t seen = g_worst_ppm.load();
    while (ppm > seen && !g_worst_ppm.compare_exchange_weak(seen, ppm)) {
    }
  }
  g_checks.fetch_add(1);
  return nullptr;
}

// An integer field of check_memory_viz.py's JSON summary, -1 when absent.
int64_t Field(const std::string& json, const std::string& key) {
  std::smatch m;
  if (std::regex_search(json, m, std::regex("\"" + key + "\": (-?[0-9]+)"))) {
    return std::stoll(m[1]);
  }
  return -1;
}

class AttributionSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SessionOptions options;
    options.device = "cpu";
    options.model = "tiny";
    auto s = Session::Create(options, testing::ProcessRuntime());
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = *std::move(s);
  }

  OperationView Train(int64_t steps, bool checkpointing) {
    TrainSpec spec;
    spec.train.steps = steps;
    spec.train.batch_size = 2;
    spec.train.seq_len = 32;
    spec.train.gradient_checkpointing = checkpointing;
    auto op = session_->StartTraining(spec);
    EXPECT_TRUE(op.ok()) << op.status();
    if (!op.ok()) return OperationView();
    return WaitDone(**op);
  }

  std::unique_ptr<Session> session_;
};

TEST_F(AttributionSessionTest, TinyTrainingIsAttributedByModuleOpAndCategory) {
  ASSERT_TRUE(session_->StartMemoryRecording(1'000'000).ok());
  g_checks = 0;
  g_worst_ppm = 0;
  const at::CallbackHandle handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&CheckTiling)
          .needsInputs(false)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  const OperationView v = Train(2, /*checkpointing=*/false);
  at::removeCallback(handle);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;

  // Categories tile the allocator at every op of the steps (forward and
  // backward nodes), within 0.1%.
  EXPECT_GT(g_checks.load(), 1000);
  EXPECT_LE(g_worst_ppm.load(), 1000) << "categories drifted from the allocator's bytes";

  // The largest saved-activation holders in backward are decoder layers'
  // attention or MLP modules.
  memory::BreakdownRequest req;
  req.by = "module";
  req.phase = "backward";
  req.top = 10000;
  absl::StatusOr<memory::MemoryBreakdown> b = session_->MemoryBreakdown(req);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->step, 2);
  std::vector<memory::BreakdownRow> saved;
  for (const memory::BreakdownRow& r : b->rows) {
    if (r.category == Category::kSavedActivations) saved.push_back(r);
  }
  ASSERT_GE(saved.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const ModuleKind kind = ModuleKindOf(saved[i].key);
    EXPECT_TRUE(absl::StartsWith(saved[i].key, "model.layers.") &&
                (kind == ModuleKind::kAttention || kind == ModuleKind::kMlp))
        << i << ": " << saved[i].key << " holds " << saved[i].peak_bytes;
    EXPECT_GT(saved[i].peak_bytes, 0);
  }
  // Parameters are named, and idle the categories are exact.
  bool named_parameter = false;
  for (const memory::BreakdownRow& r : b->rows) {
    if (r.category == Category::kParameters &&
        r.key == "model.layers.0.mlp.down_proj.weight") {
      named_parameter = r.live_bytes == 1024 * 256 * 4;
    }
  }
  EXPECT_TRUE(named_parameter);
  EXPECT_EQ(b->attributed_bytes, b->allocator_bytes);
  const memory::CategoryBytes c = session_->Counters().categories;
  EXPECT_EQ(c.parameters, 4'000'000 * 4);
  EXPECT_GE(c.optimizer_state, 2 * c.parameters);           // two moments per parameter,
  EXPECT_LE(c.optimizer_state, 2 * c.parameters + 4 * 64);  // and its step counts
  EXPECT_EQ(c.gradients, 0);                                // Set to none after the step.

  // Ops: forward aten ops and backward nodes allocated this step.
  req.by = "op";
  req.phase.reset();
  b = session_->MemoryBreakdown(req);
  ASSERT_TRUE(b.ok()) << b.status();
  bool aten = false, backward = false;
  for (const memory::BreakdownRow& r : b->rows) {
    aten |= absl::StartsWith(r.key, "aten::") && r.allocated_bytes > 0;
    backward |= absl::StrContains(r.key, "Backward") && r.allocated_bytes > 0;
  }
  EXPECT_TRUE(aten);
  EXPECT_TRUE(backward);

  // The dump: frames name modules and ops, events carry categories, and
  // PyTorch's own memory_viz helpers read it.
  absl::StatusOr<std::string> dump = session_->DumpMemoryHistory();
  session_->StopMemoryRecording(/*clear=*/true);
  ASSERT_TRUE(dump.ok()) << dump.status();
  const TempDir tmp;
  std::string summary;
  ASSERT_EQ(RunPython({SourcePath("tests/memory/check_memory_viz.py"),
                       tmp.WriteFile("tiny.pickle", *dump), "--torch"},
                      &summary),
            0)
      << summary;
  EXPECT_NE(summary.find("\"torch_ok\": true"), std::string::npos) << summary;
  EXPECT_GT(Field(summary, "allocs_with_module"), 100) << summary;
  EXPECT_GT(Field(summary, "allocs_with_aten_op"), 100) << summary;
  EXPECT_GT(Field(summary, "allocs_with_backward_op"), 10) << summary;
  EXPECT_GE(Field(summary, "allocs_named_parameters"), 38) << summary;
  for (const char* category :
       {"\"parameters\"", "\"gradients\"", "\"optimizer_state\"", "\"saved_activations\"",
        "\"temporaries\"", "\"unknown\""}) {
    EXPECT_NE(summary.find(category), std::string::npos) << category << " in " << summary;
  }
  // No made-up CPU memory: reserved (the segments) equals what is live.
  EXPECT_EQ(Field(summary, "cpu_reserved_minus_live"), 0) << summary;
}

TEST_F(AttributionSessionTest, ALoraRunShowsTheFrozenBaseAndTheAdaptersApart) {
  TrainSpec spec;
  spec.train.steps = 2;
  spec.train.batch_size = 2;
  spec.train.seq_len = 32;
  spec.train.lora_r = 8;
  spec.train.lora_targets = "all-linear";
  auto op = session_->StartTraining(spec);
  ASSERT_TRUE(op.ok()) << op.status();
  const OperationView v = WaitDone(**op);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;

  int64_t adapter_bytes = 0, adapters = 0;
  const std::optional<ModelSummary> model = session_->Model();
  ASSERT_TRUE(model.has_value());
  for (const ParameterSummary& p : model->parameters) {
    if (absl::StrContains(p.name, ".lora_")) {
      adapter_bytes += p.bytes;
      ++adapters;
    }
  }
  ASSERT_GT(adapters, 0);
  const memory::CategoryBytes c = session_->Counters().categories;
  EXPECT_EQ(c.frozen_parameters, 4'000'000 * 4);    // the whole base, nothing else
  EXPECT_EQ(c.parameters, adapter_bytes);           // the adapters alone
  EXPECT_GE(c.optimizer_state, 2 * adapter_bytes);  // AdamW's for the adapters only
  EXPECT_LE(c.optimizer_state, 2 * adapter_bytes + 4 * adapters);
  EXPECT_EQ(c.gradients, 0);  // set to none after the step

  // By module: the base's weights frozen, the adapters trainable, and the
  // only gradients the backward made are the adapters'.
  memory::BreakdownRequest req;
  req.by = "module";
  req.top = 10000;
  absl::StatusOr<memory::MemoryBreakdown> b = session_->MemoryBreakdown(req);
  ASSERT_TRUE(b.ok()) << b.status();
  std::map<std::pair<std::string, Category>, const memory::BreakdownRow*> rows;
  for (const memory::BreakdownRow& r : b->rows) rows[{r.key, r.category}] = &r;
  const std::string proj = "model.layers.0.mlp.down_proj";
  const auto base = rows.find({proj + ".weight", Category::kFrozenParameters});
  ASSERT_NE(base, rows.end());
  EXPECT_EQ(base->second->live_bytes, 1024 * 256 * 4);
  const auto adapter = rows.find({proj + ".lora_A.weight", Category::kParameters});
  ASSERT_NE(adapter, rows.end());
  EXPECT_EQ(adapter->second->live_bytes, 8 * 1024 * 4);
  int gradient_rows = 0;
  for (const memory::BreakdownRow& r : b->rows) {
    if (r.category != Category::kGradients || r.peak_bytes == 0) continue;
    ++gradient_rows;
    EXPECT_TRUE(absl::StrContains(r.key, ".lora_")) << r.key << " has a gradient";
  }
  EXPECT_GT(gradient_rows, 0);
}

TEST_F(AttributionSessionTest, CheckpointRecomputeAndStepDiffsNameTheLayers) {
  ASSERT_TRUE(session_->StartMemoryRecording(1'000'000).ok());
  const OperationView v = Train(3, /*checkpointing=*/true);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  const memory::HistorySnapshot h = memory::MemoryRecorder::Global().History();
  session_->StopMemoryRecording(/*clear=*/true);
  int64_t recompute_mlp = 0;
  for (const memory::HistoryEntry& e : h.entries) {
    if (e.action != memory::HistoryAction::kAlloc || e.phase != Phase::kBackward)
      continue;
    const std::string module = ModuleName(e.module);
    if (absl::StartsWith(module, "model.layers.") && absl::StrContains(module, ".mlp")) {
      recompute_mlp += e.size;
    }
  }
  EXPECT_GT(recompute_mlp, 0) << "the recompute in backward pushed no MLP module";

  const int64_t last = v.completed;
  absl::StatusOr<memory::MemoryDiff> d = session_->DiffMemory(last - 1, last, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_LE(d->rows.size(), 5u);
  EXPECT_FALSE(d->steps_kept.empty());
  // The first step creates AdamW's state: it grew from step 1 to 2 only in
  // the sense that step 1 had none before its optimizer phase.
  absl::StatusOr<memory::MemoryDiff> first = session_->DiffMemory(1, 2, std::nullopt);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(session_->DiffMemory(1, 999, std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(session_->DiffMemory(0, 1, std::nullopt).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace memprofd
