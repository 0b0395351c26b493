// The engine end to end, in-process: the options' validation, device
// resolution, a CPU session's memory history and stats, training stopped at a
// step boundary by shutdown, memory categories and phase peaks against the
// allocator, and a snapshot's extra memory bounded by the staging buffer
// whatever the model size, and a checkpoint resumed in a new session with the
// uninterrupted losses.

#include "core/session/session.h"

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "core/memory/history.h"
#include "core/memory/recorder.h"
#include "core/session/runtime.h"
#include "core/snapshot/loader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/operation.h"
#include "tests/testing/session.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::memprofd::testing::TempDir;
using ::memprofd::testing::WaitDone;
using ::testing::HasSubstr;

TEST(ResolveDeviceTest, NamesAndErrors) {
  EXPECT_EQ(*ResolveDevice("cpu"), "cpu");
#ifndef MEMPROFD_WITH_CUDA
  EXPECT_EQ(*ResolveDevice("auto"), "cpu");
  EXPECT_EQ(ResolveDevice("cuda:0").status().code(), absl::StatusCode::kUnimplemented);
#endif
  EXPECT_EQ(ResolveDevice("tpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveDevice("cuda:x").status().code(), absl::StatusCode::kInvalidArgument);
}

// A rank's "cuda" is its LOCAL_RANK's GPU, so that ranks sharing a host never
// share one (NCCL refuses that).
TEST(ResolveDeviceTest, CudaMeansTheLocalRanksGpu) {
  EXPECT_EQ(*ResolveDevice("cpu", 3), "cpu");
#ifdef MEMPROFD_WITH_CUDA
  if (torch::cuda::device_count() >= 2) {
    EXPECT_EQ(*ResolveDevice("cuda", 1), "cuda:1");
    EXPECT_EQ(*ResolveDevice("auto", 1), "cuda:1");
    EXPECT_EQ(*ResolveDevice("cuda:0", 1), "cuda:0");  // named: as named
  } else {
    absl::StatusOr<std::string> d = ResolveDevice("cuda", 7);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(d.status().message(), HasSubstr("cuda:7, LOCAL_RANK's GPU"));
  }
#else
  EXPECT_EQ(*ResolveDevice("auto", 1), "cpu");
#endif
}

// The process-wide state is made once: every Install returns the same
// Runtime, whose recorder sees the CPU allocator's allocations and frees.
TEST(RuntimeTest, InstallIsOnceAndItsRecorderCountsCpuAllocations) {
  absl::StatusOr<Runtime*> first = Runtime::Install();
  absl::StatusOr<Runtime*> second = Runtime::Install();
  ASSERT_TRUE(first.ok() && second.ok()) << first.status();
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(&testing::ProcessRuntime(), *first);
  const memory::MemoryRecorder& recorder = (*first)->recorder();
  auto cpu_bytes = [&recorder] {
    const memory::MemoryStatsView stats = recorder.Stats();
    return stats.devices.empty() ? int64_t{-1} : stats.devices[0].current_bytes;
  };
  const int64_t before = cpu_bytes();
  int64_t during = 0;
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    during = cpu_bytes();
  }
  const int64_t after = cpu_bytes();
  EXPECT_GE(during - before, int64_t{4} << 20);
  EXPECT_LT(after, during);
}

TEST(ValidateSessionOptionsTest, TheDefaultsPass) {
  EXPECT_TRUE(ValidateSessionOptions(SessionOptions()).ok());
}

// One field of the defaults out of range, and the name the message gives it.
struct SpoiledOption {
  void (*spoil)(SessionOptions&);
  const char* field;
};

std::vector<SpoiledOption> SpoiledOptions() {
  return {
      {[](SessionOptions& o) { o.keep_last = -1; }, "keep_last"},
      {[](SessionOptions& o) { o.snapshot_every_steps = -1; }, "snapshot_every_steps"},
      {[](SessionOptions& o) { o.snapshot_staging_bytes = 4095; },
       "snapshot_staging_bytes"},
      {[](SessionOptions& o) { o.collective_timeout = absl::ZeroDuration(); },
       "collective_timeout"},
      {[](SessionOptions& o) { o.collective_timeout = -absl::Seconds(1); },
       "collective_timeout"},
      {[](SessionOptions& o) { o.bulk_nice = -1; }, "bulk_nice"},
      {[](SessionOptions& o) { o.bulk_nice = 20; }, "bulk_nice"},
      {[](SessionOptions& o) { o.max_data_file_bytes = 0; }, "max_data_file_bytes"},
      {[](SessionOptions& o) { o.resume = "latest"; }, "resume"},
      {[](SessionOptions& o) { o.offload.min_offload_bytes = -1; },
       "offload.min_offload_bytes"},
      {[](SessionOptions& o) { o.offload.max_copies_in_flight = 0; },
       "offload.max_copies_in_flight"},
      {[](SessionOptions& o) { o.offload.prefetch_depth = -2; },
       "offload.prefetch_depth"},
      {[](SessionOptions& o) { o.offload.host_limit_bytes = -1; },
       "offload.host_limit_bytes"},
      {[](SessionOptions& o) { o.offload.spill_dir.clear(); }, "offload.spill_dir"},
  };
}

// The message starts with the field's name in SessionOptions (the daemon
// maps it to its flag) and names no flag or command line.
TEST(ValidateSessionOptionsTest, EachFieldOutOfRangeIsNamedAsTheField) {
  for (const SpoiledOption& c : SpoiledOptions()) {
    SessionOptions options;
    c.spoil(options);
    const absl::Status status = ValidateSessionOptions(options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(status.message().rfind(absl::StrCat(c.field, ":"), 0), 0u) << status;
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("--"))) << status;
  }
}

TEST(ValidateSessionOptionsTest, TheBoundsThemselvesPass) {
  SessionOptions options;
  options.keep_last = 0;
  options.snapshot_every_steps = 0;
  options.snapshot_staging_bytes = 4096;
  options.collective_timeout = absl::Nanoseconds(1);
  options.bulk_nice = 19;
  options.max_data_file_bytes = 1;
  options.resume = "latest";
  options.snapshot_root = "/nonexistent/snapshots";  // values only: not opened
  options.offload.min_offload_bytes = 0;
  options.offload.max_copies_in_flight = 1;
  options.offload.prefetch_depth = 0;
  EXPECT_TRUE(ValidateSessionOptions(options).ok());
}

// Create checks the options first, with the same status, before it sets up
// anything (the device, the memory accounting, the snapshot root).
TEST(SessionTest, CreateRefusesOptionsOutOfRangeAsValidateSessionOptionsDoes) {
  for (const SpoiledOption& c : SpoiledOptions()) {
    SessionOptions options;
    options.device = "tpu";  // would be refused next, as INVALID_ARGUMENT too
    options.model = "";
    c.spoil(options);
    absl::StatusOr<std::unique_ptr<Session>> s =
        Session::Create(options, testing::ProcessRuntime());
    EXPECT_EQ(s.status(), ValidateSessionOptions(options)) << c.field;
  }
}

TEST(SessionTest, UnknownStartModelIsAClearError) {
  SessionOptions options;
  options.device = "cpu";
  options.model = "enormous";
  absl::StatusOr<std::unique_ptr<Session>> s =
      Session::Create(options, testing::ProcessRuntime());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("tiny"));
}

// `python -c`: what the memory_viz pickle argv[1] holds outside the CPU (the
// last device, memory_viz.h) and how often the CPU trace allocates and frees
// argv[2] bytes.
constexpr char kHistorySummary[] = R"(import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
size = int(sys.argv[2])
traces = d["device_traces"]
cpu = len(traces) - 1
print("cuda events", sum(len(t) for t in traces[:cpu]))
print("cuda segments", sum(1 for s in d["segments"] if s["device"] != cpu))
print("cpu allocs", sum(1 for e in traces[cpu] if e["action"] == "alloc" and e["size"] == size))
print("cpu frees", sum(1 for e in traces[cpu] if e["action"] == "free_completed" and e["size"] == size))
)";

// A session computing on the CPU records the CPU alone. Its recording must
// not set CUDA up on a GPU host (Create tells the recorder not to track
// CUDA): no CUDA trace or segment in the dump, and no CUDA device in the
// stats, which list every device whose CUDA allocator has been initialised.
// Without a GPU (here) the dump and the stats are still the CPU's alone.
TEST(SessionTest, ACpuSessionsMemoryHistoryAndStatsAreTheCpusAlone) {
  SessionOptions options;
  options.device = "cpu";
  options.model = "";
  auto s = Session::Create(options, testing::ProcessRuntime());
  ASSERT_TRUE(s.ok()) << s.status();
  Session& session = **s;
  EXPECT_EQ(session.device(), "cpu");
  ASSERT_TRUE(session.StartMemoryRecording(10'000).ok());
  // A size no other allocation of this process has.
  constexpr int64_t kBytes = 1'234'567;
  { const at::Tensor t = at::empty({kBytes}, at::kByte); }
  const absl::StatusOr<std::string> dump = session.DumpMemoryHistory();
  const memory::MemoryStatsView stats = session.MemoryStats();
  session.StopMemoryRecording(/*clear=*/true);
  ASSERT_TRUE(dump.ok()) << dump.status();

  ASSERT_EQ(stats.devices.size(), 1u);
  EXPECT_EQ(stats.devices[0].name, "cpu");
  EXPECT_FALSE(stats.devices[0].has_cuda_stats);
  const TempDir tmp;
  std::string summary;
  ASSERT_EQ(
      testing::RunPython({"-c", kHistorySummary, tmp.WriteFile("history.pickle", *dump),
                          absl::StrCat(kBytes)},
                         &summary),
      0)
      << summary;
  EXPECT_EQ(summary, "cuda events 0\ncuda segments 0\ncpu allocs 1\ncpu frees 1\n");
}

class TinySessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = tmp_.Join("snapshots");
    SessionOptions options;
    options.device = "cpu";
    options.model = "tiny";
    options.snapshot_root = root_;
    options.snapshot_staging_bytes = int64_t{4} << 20;
    auto s = Session::Create(options, testing::ProcessRuntime());
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = *std::move(s);
  }

  TrainSpec Spec(int64_t steps) {
    TrainSpec spec;
    spec.train.steps = steps;
    spec.train.batch_size = 2;
    spec.train.seq_len = 32;
    return spec;
  }

  // Returns once the owner thread has run what was queued before. An
  // operation reports done from inside its work item, so what the item holds
  // (a training's data set, its hooks) is freed a moment after a WaitDone
  // returns; a test that needs an idle session waits for this too.
  void WaitForOwnerIdle() {
    absl::Notification ran;
    ASSERT_TRUE(session_->Post([&ran] { ran.Notify(); }).ok());
    ran.WaitForNotification();
  }

  const TempDir tmp_;
  std::string root_;
  std::unique_ptr<Session> session_;
};

TEST_F(TinySessionTest, ShutdownStopsTrainingAtAStepBoundary) {
  auto op = session_->StartTraining(Spec(100000));
  ASSERT_TRUE(op.ok()) << op.status();
  testing::WaitFor(
      **op, [](const OperationView& v) { return v.completed >= 2; }, absl::Minutes(2));
  session_->Shutdown();
  OperationView v = WaitDone(**op);
  // Not a cancel: the drain's own ending, with no checkpoint to name.
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(v.reason, kDrainingReason);
  EXPECT_THAT(v.error.message(),
              HasSubstr("memprofd is shutting down: the training stopped"));
  EXPECT_THAT(v.error.message(), HasSubstr("no checkpoint holds it"));
  const auto& result = std::get<TrainResult>(v.result);
  EXPECT_GE(result.steps_completed, 2);
  EXPECT_EQ(result.steps_completed, (*op)->events_total());  // every step reported
  EXPECT_EQ(result.resume_checkpoint, "");
  EXPECT_EQ(session_->StartTraining(Spec(1)).status().code(),
            absl::StatusCode::kUnavailable);
}

// The drain's order: new work refused from its first moment, the shutdown
// checkpoint written at the boundary the training stops at (so it holds the
// last step the client saw), and the training's ending naming it.
TEST_F(TinySessionTest, DrainCheckpointsTheStepTheTrainingStoppedAtAndNamesIt) {
  auto op = session_->StartTraining(Spec(100000));
  ASSERT_TRUE(op.ok()) << op.status();
  testing::WaitFor(
      **op, [](const OperationView& v) { return v.completed >= 2; }, absl::Minutes(2));
  EXPECT_FALSE(session_->draining());
  ASSERT_TRUE(session_->BeginDrain("shutdown-1").ok());
  EXPECT_TRUE(session_->draining());
  SnapshotSpec late;
  late.name = "late";
  EXPECT_EQ(session_->StartSnapshot(late).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(session_->StartTraining(Spec(1)).status().code(),
            absl::StatusCode::kUnavailable);
  OperationView v = WaitDone(**op);
  EXPECT_EQ(v.state, OperationState::kFailed);
  EXPECT_EQ(v.error.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(v.reason, kDrainingReason);
  const auto& result = std::get<TrainResult>(v.result);
  EXPECT_EQ(result.resume_checkpoint, "shutdown-1");
  EXPECT_EQ(result.resume_global_step, result.global_step);
  EXPECT_EQ(result.global_step, (*op)->events_total());
  EXPECT_THAT(v.error.message(),
              HasSubstr(absl::StrCat("checkpoint 'shutdown-1' holds global step ",
                                     result.global_step,
                                     ": start memprofd with --resume=latest")));
  absl::StatusOr<snapshot::SnapshotManifest> m = session_->DescribeSnapshot("shutdown-1");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->is_checkpoint());
  EXPECT_EQ(m->global_step, result.global_step);
  session_->Shutdown();
}

TEST_F(TinySessionTest, CategoriesAndPhasePeaksAgreeWithTheAllocator) {
  auto op = session_->StartTraining(Spec(2));
  ASSERT_TRUE(op.ok());
  ASSERT_EQ(WaitDone(**op).state, OperationState::kSucceeded);
  WaitForOwnerIdle();
  const memory::CategoryBytes c = session_->Counters().categories;
  EXPECT_EQ(c.parameters, 4'000'000 * 4);
  // AdamW's two moments, and a 4-byte step count per parameter tensor.
  EXPECT_GE(c.optimizer_state, 2 * c.parameters);
  EXPECT_LE(c.optimizer_state, 2 * c.parameters + 4 * 64);
  const int64_t total = memory::MemoryRecorder::Global().CurrentBytes(memory::kCpuDevice);
  // Exact on an idle session: the categories tile what the allocator holds
  // (the offloaded ones are outside it).
  int64_t in_allocator = 0;
  for (const auto& [name, bytes] : c.Named()) {
    if (name != "offloaded_host" && name != "offloaded_disk") in_allocator += bytes;
  }
  EXPECT_EQ(in_allocator, total);
  EXPECT_EQ(c.gathered_parameters, 0);  // one process: nothing to gather
  const memory::MemoryStatsView stats = memory::MemoryRecorder::Global().Stats();
  int64_t max_phase = 0;
  for (const auto& p : stats.last_step_phase_peaks) {
    EXPECT_GE(p.peak_bytes, c.parameters + c.optimizer_state) << PhaseName(p.phase);
    max_phase = std::max(max_phase, p.peak_bytes);
  }
  ASSERT_EQ(stats.last_step_peaks.size(), 1u);
  EXPECT_EQ(stats.last_step_peaks[0].peak_bytes, max_phase);
  EXPECT_LE(max_phase, stats.devices[0].peak_bytes);
  const SessionCounters counters = session_->Counters();
  ASSERT_TRUE(counters.last_step.has_value());
  EXPECT_EQ(counters.last_step->peak_allocated_bytes, max_phase);
}

// The regression the snapshot issue answers: a remote snapshot of a
// partially offloaded model must not hold a second copy of it. A model with
// layers on the device, in host memory and on disk, two sizes 7.6x apart,
// converted to bf16 (the path that needs the staging buffer): extra bytes
// <= staging + 1 MiB.
TEST_F(TinySessionTest, SnapshotExtraMemoryIsBoundedByTheStagingBuffer) {
  for (const char* preset : {"tiny", "small"}) {
    LoadModelSpec load;
    load.preset = preset;
    load.placement = {{"model.layers.1", Placement::kCpu},
                      {"model.layers.2", Placement::kDisk},
                      {"model.norm", Placement::kDisk}};
    auto loaded = session_->LoadModel(load);
    ASSERT_TRUE(loaded.ok());
    ASSERT_EQ(WaitDone(**loaded).state, OperationState::kSucceeded);
    std::optional<ModelSummary> model = session_->Model();
    ASSERT_TRUE(model.has_value());
    int placed_on_disk = 0;
    for (const auto& p : model->parameters)
      placed_on_disk += p.placement == Placement::kDisk;
    EXPECT_EQ(placed_on_disk, 10);  // layer 2's nine weights and the final norm
    memory::MemoryRecorder::Global().ResetPeak();
    const int64_t before =
        memory::MemoryRecorder::Global().CurrentBytes(memory::kCpuDevice);
    SnapshotSpec spec;
    spec.name = absl::StrCat("bounded-", preset);
    spec.options.dtype = snapshot::SnapshotDtype::kBFloat16;
    auto op = session_->StartSnapshot(spec);
    ASSERT_TRUE(op.ok()) << op.status();
    OperationView v = WaitDone(**op);
    ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
    const int64_t extra =
        memory::MemoryRecorder::Global().PeakBytes(memory::kCpuDevice) - before;
    const auto& manifest = std::get<SnapshotResult>(v.result).manifest;
    EXPECT_LE(extra, (int64_t{4} << 20) + (int64_t{1} << 20))
        << preset << ": model " << manifest.total_size * 2 << " bytes";
    // Larger than the staging buffer: a whole copy would break the bound.
    EXPECT_GT(manifest.total_size, int64_t{4} << 20) << preset;
  }
}

// The losses of a TRAIN operation by global step.
std::map<int64_t, double> LossesOf(const Operation& op) {
  std::map<int64_t, double> out;
  int64_t first = 0;
  for (const SessionStepReport& r : op.EventsFrom(1, 100000, &first)) {
    out[r.step.global_step] = r.step.loss;
  }
  return out;
}

TEST_F(TinySessionTest, ACheckpointResumesTheRunInAnotherSessionBitForBit) {
  TrainSpec run = Spec(12);
  run.train.seed = 4;
  run.train.gradient_checkpointing = true;
  auto op = session_->StartTraining(run);
  ASSERT_TRUE(op.ok()) << op.status();
  ASSERT_EQ(WaitDone(**op).state, OperationState::kSucceeded);
  const std::map<int64_t, double> reference = LossesOf(**op);
  ASSERT_EQ(reference.size(), 12u);

  // The same run from a fresh model, checkpointed at a step boundary after
  // step 3 while it trains on; then a new session resumes from that checkpoint.
  LoadModelSpec fresh;
  fresh.preset = "tiny";
  ASSERT_EQ(WaitDone(**session_->LoadModel(fresh)).state, OperationState::kSucceeded);
  op = session_->StartTraining(run);
  ASSERT_TRUE(op.ok());
  testing::WaitFor(
      **op, [](const OperationView& v) { return v.completed >= 3; }, absl::Minutes(2));
  SnapshotSpec ck;
  ck.name = "ck";
  ck.options.kind = snapshot::SnapshotKind::kCheckpoint;
  auto snap = session_->StartSnapshot(ck);
  ASSERT_TRUE(snap.ok()) << snap.status();
  OperationView sv = WaitDone(**snap);
  ASSERT_EQ(sv.state, OperationState::kSucceeded) << sv.error;
  const snapshot::SnapshotManifest manifest =
      std::get<SnapshotResult>(sv.result).manifest;
  EXPECT_TRUE(manifest.is_checkpoint());
  WaitDone(**op);
  session_.reset();

  SessionOptions options;
  options.device = "cpu";
  options.model = "";
  options.snapshot_root = root_;
  options.resume = "ck";
  auto resumed = Session::Create(options, testing::ProcessRuntime());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->Model()->steps_trained, manifest.global_step);
  TrainSpec rest;
  rest.resume = true;  // nothing else: the run's own configuration and data
  op = (*resumed)->StartTraining(rest);
  ASSERT_TRUE(op.ok()) << op.status();
  OperationView v = WaitDone(**op);
  ASSERT_EQ(v.state, OperationState::kSucceeded) << v.error;
  const std::map<int64_t, double> after = LossesOf(**op);
  ASSERT_EQ(after.size(), static_cast<size_t>(12 - manifest.global_step));
  for (const auto& [step, loss] : after) {
    EXPECT_EQ(loss, reference.at(step)) << "global step " << step;
  }
  // The run is complete: going on needs steps.
  EXPECT_EQ((*resumed)->StartTraining(rest).status().code(),
            absl::StatusCode::kFailedPrecondition);
  rest.train.steps = 1;
  op = (*resumed)->StartTraining(rest);
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(WaitDone(**op).state, OperationState::kSucceeded);
}

TEST_F(TinySessionTest, DiskPlacedModulesAreFrozenAndCpuPlacedOnesTrain) {
  LoadModelSpec load;
  load.preset = "tiny";
  load.placement = {{"model.layers.0", Placement::kCpu},
                    {"model.layers.3", Placement::kDisk}};
  auto loaded = session_->LoadModel(load);
  ASSERT_TRUE(loaded.ok());
  ASSERT_EQ(WaitDone(**loaded).state, OperationState::kSucceeded);
  SnapshotSpec before;
  before.name = "before";
  ASSERT_EQ(WaitDone(**session_->StartSnapshot(before)).state,
            OperationState::kSucceeded);
  auto trained = session_->StartTraining(Spec(2));
  ASSERT_TRUE(trained.ok());
  ASSERT_EQ(WaitDone(**trained).state, OperationState::kSucceeded);
  SnapshotSpec after;
  after.name = "after";
  ASSERT_EQ(WaitDone(**session_->StartSnapshot(after)).state, OperationState::kSucceeded);
  // Reload both and compare: layer 3 (disk) did not move, layer 0 (cpu) did.
  auto a = snapshot::LoadSafetensorsDirectory(root_ + "/before");
  auto b = snapshot::LoadSafetensorsDirectory(root_ + "/after");
  ASSERT_TRUE(a.ok() && b.ok());
  auto find = [](const snapshot::TensorList& l, const std::string& n) {
    for (const auto& [name, t] : l) {
      if (name == n) return t;
    }
    return at::Tensor();
  };
  EXPECT_TRUE(find(a->tensors, "model.layers.3.mlp.up_proj.weight")
                  .equal(find(b->tensors, "model.layers.3.mlp.up_proj.weight")));
  EXPECT_FALSE(find(a->tensors, "model.layers.0.mlp.up_proj.weight")
                   .equal(find(b->tensors, "model.layers.0.mlp.up_proj.weight")));
  // Categories leave the mapped weights out of the allocator's parameters.
  // A tiny layer: q, o 256x256; k, v 128x256; gate, up, down 1024x256; 2 norms.
  const int64_t layer = 2 * 65536 + 2 * 32768 + 3 * 262144 + 2 * 256;
  EXPECT_EQ(session_->Counters().categories.parameters, (4'000'000 - layer) * 4);
}

}  // namespace
}  // namespace memprofd
