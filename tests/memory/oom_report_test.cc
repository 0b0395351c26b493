// OOM reports: the capture a real CPU allocation failure leaves, the report
// built from it (largest live allocations with categories and origins,
// per-category totals, recent peaks) and its JSON, and the atomic writer.

#include "core/memory/oom_report.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/json.h"
#include "core/common/phase.h"
#include "core/memory/recorder.h"
#include "test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace memory {
namespace {

uint64_t Address(const at::Tensor& t) {
  return reinterpret_cast<uint64_t>(t.storage().data());
}

// A CPU allocation larger than any machine has: the allocator refuses it.
constexpr int64_t kImpossibleBytes = int64_t{1} << 50;

TEST(OomReportTest, CpuAllocationFailureCapturesTheRequestAndWhatWasLive) {
  EnsureAccountingInstalled();
  TakeOomCapture();  // nothing stale
  MemoryRecorder& recorder = MemoryRecorder::Global();
  ASSERT_TRUE(recorder.StartRecording(10000).ok());
  at::Tensor held;  // 1 MiB, live at the failure
  uint64_t temporary_addr = 0;
  BeginStep(41);
  {
    PhaseScope forward(Phase::kForward);
    held = torch::ones({1 << 18});
    {
      // Freed by the unwinding, after the failure.
      const at::Tensor temporary = torch::ones({1 << 10});
      temporary_addr = Address(temporary);
      EXPECT_THROW(at::empty({kImpossibleBytes}, at::kByte), c10::Error);
    }
  }
  EndStep(41);
  recorder.StopRecording();
  const HistorySnapshot history = recorder.History();
  recorder.ClearHistory();
  std::optional<OomCapture> capture = TakeOomCapture();
  ASSERT_TRUE(capture.has_value());
  EXPECT_FALSE(TakeOomCapture().has_value()) << "taken once";
  EXPECT_EQ(capture->device, kCpuDevice);
  EXPECT_EQ(capture->requested_bytes, kImpossibleBytes);
  EXPECT_EQ(capture->phase, Phase::kForward);
  EXPECT_EQ(capture->step, 41);
  EXPECT_GT(capture->unix_time_ms, 0);
  EXPECT_GE(capture->allocated_bytes, int64_t{1} << 20);
  EXPECT_EQ(capture->reserved_bytes, capture->allocated_bytes);
  EXPECT_GT(capture->total_bytes, 0);
  EXPECT_GE(capture->free_bytes, 0);
  bool found = false;
  for (const LiveBlock& b : capture->live) {
    if (b.addr == Address(held)) {
      found = true;
      EXPECT_EQ(b.size, int64_t{1} << 20);
    }
  }
  EXPECT_TRUE(found) << "the held tensor is among the live allocations";

  OomReportInputs in;
  in.history = history.entries;
  in.history_dropped = history.dropped;
  const OomReport report = BuildOomReport(capture, in);
  int seen = 0;
  for (const LiveAllocation& a : report.largest) {
    if (a.addr != Address(held) && a.addr != temporary_addr) continue;
    ++seen;
    ASSERT_TRUE(a.phase.has_value()) << a.bytes;
    EXPECT_EQ(*a.phase, Phase::kForward);
    EXPECT_EQ(a.step, std::optional<int64_t>(41));
  }
  EXPECT_EQ(seen, 2) << "the held tensor and the temporary, as they were at the failure";
}

TEST(OomReportTest, ReportListsTheLargestWithCategoriesOriginsAndTotals) {
  OomCapture c;
  c.device = kCpuDevice;
  c.requested_bytes = 5000;
  c.phase = Phase::kBackward;
  c.step = 12;
  c.unix_time_ms = 1700000000123;
  c.allocated_bytes = 0;
  c.history_position = 8;  // the 2 entries dropped and the 6 below; the last is after
  // 25 blocks of 100, 200, ... 2500 bytes at 0x1000, 0x2000, ...
  for (int i = 1; i <= 25; ++i) {
    c.live.push_back(
        {kCpuDevice, static_cast<uint64_t>(0x1000 * i), 100 * i, Attribution()});
    c.allocated_bytes += 100 * i;
  }
  OomReportInputs in;
  in.error = "training step: out of memory: ...";
  in.global_step = 12;
  in.category_of[0x1000 * 25] = "parameters";
  in.category_of[0x1000 * 24] = "gradients";
  in.category_of[0x1000 * 1] = "optimizer_state";
  in.offloaded_disk_bytes = 777;
  // Block 23 was allocated in forward of step 12; block 22's first life ended
  // and it came back in backward; block 21 was freed (history says so) but
  // is live again with no newer entry: unknown.
  auto entry = [](HistoryAction action, uint64_t addr, Phase phase, int64_t step) {
    HistoryEntry e;
    e.action = action;
    e.addr = addr;
    e.size = 1;
    e.phase = phase;
    e.step = step;
    e.device = kCpuDevice;
    return e;
  };
  in.history = {entry(HistoryAction::kAlloc, 0x1000 * 23, Phase::kForward, 12),
                entry(HistoryAction::kAlloc, 0x1000 * 22, Phase::kForward, 11),
                entry(HistoryAction::kFree, 0x1000 * 22, Phase::kForward, 11),
                entry(HistoryAction::kAlloc, 0x1000 * 22, Phase::kBackward, 12),
                entry(HistoryAction::kAlloc, 0x1000 * 21, Phase::kForward, 12),
                entry(HistoryAction::kFree, 0x1000 * 21, Phase::kBackward, 12),
                // After the failure (the unwinding): not the live block's origin.
                entry(HistoryAction::kFree, 0x1000 * 23, Phase::kBackward, 12)};
  in.history_dropped = 2;
  for (int s = 1; s <= 11; ++s) {
    StepPeaks p;
    p.step = s;
    p.peaks = {{"cpu", 1000 * s}};
    p.phase_peaks = {{"cpu", Phase::kForward, 900 * s},
                     {"cpu", Phase::kBackward, 1000 * s}};
    in.recent_steps.push_back(p);
  }

  const OomReport r = BuildOomReport(c, in);
  EXPECT_TRUE(r.captured);
  EXPECT_EQ(r.device, "cpu");
  EXPECT_EQ(r.requested_bytes, 5000);
  ASSERT_TRUE(r.phase.has_value());
  EXPECT_EQ(*r.phase, Phase::kBackward);
  EXPECT_EQ(r.live_allocations, 25);
  EXPECT_EQ(r.live_bytes, c.allocated_bytes);
  ASSERT_EQ(r.largest.size(), 20u);
  for (size_t i = 0; i < r.largest.size(); ++i) {
    EXPECT_EQ(r.largest[i].bytes, 100 * (25 - static_cast<int64_t>(i)));
    EXPECT_EQ(r.largest[i].module, "");  // these blocks carry no attribution
    EXPECT_EQ(r.largest[i].op, "");
  }
  EXPECT_EQ(r.largest[0].category, "parameters");
  EXPECT_EQ(r.largest[1].category, "gradients");
  EXPECT_EQ(r.largest[2].category, "unknown");
  ASSERT_TRUE(r.largest[2].phase.has_value());
  EXPECT_EQ(*r.largest[2].phase, Phase::kForward);
  EXPECT_EQ(*r.largest[2].step, 12);
  ASSERT_TRUE(r.largest[3].phase.has_value());
  EXPECT_EQ(*r.largest[3].phase, Phase::kBackward);
  EXPECT_FALSE(r.largest[4].phase.has_value());
  EXPECT_FALSE(r.largest[0].phase.has_value());
  // Totals over every live block, not only the 20 listed.
  EXPECT_EQ(r.categories.parameters, 2500);
  EXPECT_EQ(r.categories.gradients, 2400);
  EXPECT_EQ(r.categories.optimizer_state, 100);
  EXPECT_EQ(r.categories.offloaded_disk, 777);
  EXPECT_EQ(r.categories.parameters + r.categories.gradients +
                r.categories.optimizer_state + r.categories.unknown,
            r.live_bytes);
  ASSERT_EQ(r.recent_steps.size(), 10u);
  EXPECT_EQ(r.recent_steps.front().step, 2);
  EXPECT_EQ(r.recent_steps.back().step, 11);

  absl::StatusOr<Json> json = ParseJson(DumpJson(OomReportToJson(r), 2));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["kind"], "memprofd.oom_report");
  EXPECT_EQ((*json)["request"]["bytes"], 5000);
  EXPECT_EQ((*json)["request"]["phase"], "backward");
  EXPECT_EQ((*json)["request"]["module"], "");
  EXPECT_EQ((*json)["largest_allocations"].size(), 20u);
  EXPECT_EQ((*json)["largest_allocations"][0]["category"], "parameters");
  EXPECT_EQ((*json)["largest_allocations"][0]["address"], "0x19000");
  EXPECT_TRUE((*json)["largest_allocations"][0]["phase"].is_null());
  EXPECT_EQ((*json)["largest_allocations"][2]["step"], 12);
  EXPECT_EQ((*json)["category_bytes"]["gradients"], 2400);
  EXPECT_EQ((*json)["recent_steps"].size(), 10u);
  EXPECT_EQ((*json)["recent_steps"][9]["devices"][0]["phase_peak_bytes"]["backward"],
            11000);
  EXPECT_TRUE((*json)["device"]["free_bytes"].is_null());
}

TEST(OomReportTest, ReportWithoutCaptureSaysSoAndListsNothing) {
  OomReportInputs in;
  in.error = "training step: out of memory: std::bad_alloc";
  in.global_step = 3;
  const OomReport r = BuildOomReport(std::nullopt, in);
  EXPECT_FALSE(r.captured);
  EXPECT_EQ(r.requested_bytes, 0);
  EXPECT_TRUE(r.largest.empty());
  absl::StatusOr<Json> json = ParseJson(DumpJson(OomReportToJson(r)));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["captured"], false);
  EXPECT_EQ((*json)["global_step"], 3);
}

TEST(OomReportTest, WriteFileAtomicallyReplacesWholeAndLeavesNoTemporary) {
  testing::TempDir dir;
  const std::string path = dir.Join("peaks.json");
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second, longer").ok());
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "second, longer");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const absl::Status missing = WriteFileAtomically(dir.Join("no/such/dir/f"), "x");
  EXPECT_TRUE(absl::IsNotFound(missing)) << missing;
  EXPECT_NE(missing.message().find("no/such/dir"), std::string::npos) << missing;
}

// Blocks that carry the allocator's attribution are reported with it: their
// module, op, category, phase and step as they were when allocated, and the
// failed request with the module and op of the thread that asked.
TEST(OomReportTest, AttributedBlocksNameTheirModuleOpAndCategory) {
  OomCapture c;
  c.device = kCpuDevice;
  c.requested_bytes = 1 << 20;
  c.phase = Phase::kBackward;
  c.step = 3;
  c.request_origin.module = InternModule("model.layers.1.mlp.up_proj");
  c.request_origin.op = InternOp("MmBackward0");
  Attribution saved;
  saved.module = InternModule("model.layers.0.self_attn.v_proj");
  saved.op = InternOp("aten::linear");
  saved.category = Category::kSavedActivations;
  saved.phase = Phase::kForward;
  saved.step = 3;
  Attribution param;
  param.module = InternModule("model.embed_tokens.weight");
  param.category = Category::kParameters;
  c.live.push_back({kCpuDevice, 0x1000, 4096, saved});
  c.live.push_back({kCpuDevice, 0x9000, 8192, param});
  c.live.push_back({kCpuDevice, 0x5000, 100, Attribution()});  // none: fallback
  Attribution gathered;
  gathered.module = InternModule("model.layers.2.mlp.up_proj.weight");
  gathered.category = Category::kGatheredParameters;
  gathered.phase = Phase::kBackward;
  gathered.step = 3;
  c.live.push_back({kCpuDevice, 0x7000, 50, gathered});
  c.allocated_bytes = 4096 + 8192 + 100 + 50;
  OomReportInputs in;
  in.category_of[0x1000] = "gradients";  // the block's own category wins

  const OomReport r = BuildOomReport(c, in);
  EXPECT_EQ(r.module, "model.layers.1.mlp.up_proj");
  EXPECT_EQ(r.op, "MmBackward0");
  ASSERT_EQ(r.largest.size(), 4u);
  EXPECT_EQ(r.largest[0].module, "model.embed_tokens.weight");
  EXPECT_EQ(r.largest[0].category, "parameters");
  EXPECT_EQ(r.largest[1].module, "model.layers.0.self_attn.v_proj");
  EXPECT_EQ(r.largest[1].op, "aten::linear");
  EXPECT_EQ(r.largest[1].category, "saved_activations");
  ASSERT_TRUE(r.largest[1].phase.has_value());
  EXPECT_EQ(*r.largest[1].phase, Phase::kForward);
  EXPECT_EQ(*r.largest[1].step, 3);
  EXPECT_EQ(r.largest[2].module, "");
  EXPECT_EQ(r.largest[2].category, "unknown");
  EXPECT_EQ(r.largest[3].category, "gathered_parameters");
  EXPECT_EQ(r.categories.parameters, 8192);
  EXPECT_EQ(r.categories.gathered_parameters, 50);
  EXPECT_EQ(r.categories.saved_activations, 4096);
  EXPECT_EQ(r.categories.activations_and_temporaries, 4096);
  EXPECT_EQ(r.categories.unknown, 100);
  absl::StatusOr<Json> json = ParseJson(DumpJson(OomReportToJson(r), 2));
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ((*json)["request"]["module"], "model.layers.1.mlp.up_proj");
  EXPECT_EQ((*json)["largest_allocations"][1]["op"], "aten::linear");
}

}  // namespace
}  // namespace memory
}  // namespace memprofd
