// The planner against the step it plans: the same two steps run for real on
// the CPU (calibration.h), where LibTorch's allocator has no cache, so plan
// and measurement count the same bytes; and the planner's own guarantees
// (attribution, refusals, a plan beside a training's phases). Small shapes:
// plan_bench prints the full grid.

#include "core/plan/planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "core/common/host_heap.h"
#include "core/common/phase.h"
#include "core/memory/install.h"
#include "core/memory/recorder.h"
#include "core/model/config.h"
#include "core/plan/calibration.h"
#include "core/plan/step_runner.h"
#include "tests/testing/llama.h"

namespace memprofd::plan {
namespace {

class PlannerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(memory::InstallMemoryAccounting().ok()); }
};

PlanSpec Spec(const LlamaConfig& config, int64_t batch, int64_t seq, bool checkpointing,
              AttentionImplementation attention) {
  PlanSpec spec;
  spec.model = config;
  spec.train.batch_size = batch;
  spec.train.seq_len = seq;
  spec.train.gradient_checkpointing = checkpointing;
  spec.train.attn_implementation = attention;
  return spec;
}

// The higher measured peak of the two steps the planner plans, run for
// real on the CPU (calibration.h); -1 (and a test failure) when they fail.
int64_t MeasuredCpuPeak(const PlanSpec& spec) {
  absl::StatusOr<std::vector<MeasuredStep>> measured = MeasureTrainingSteps(
      spec, c10::Device(c10::DeviceType::CPU), memory::MemoryRecorder::Global());
  EXPECT_TRUE(measured.ok()) << measured.status();
  if (!measured.ok()) return -1;
  EXPECT_EQ(measured->size(), 2u);
  int64_t real = 0;
  for (const MeasuredStep& s : *measured) real = std::max(real, s.peak_allocated_bytes);
  return real;
}

// The plan's peak against the measured peak of the same two steps on the
// CPU: within `tolerance` (relative) for the higher step.
void ExpectPlanMatchesCpu(const PlanSpec& spec, double tolerance) {
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t real = MeasuredCpuPeak(spec);
  ASSERT_GT(real, 0);
  const double error =
      static_cast<double>(plan->peak_allocated_bytes - real) / static_cast<double>(real);
  std::cout << "B=" << spec.train.batch_size << " T=" << spec.train.seq_len
            << " ckpt=" << spec.train.gradient_checkpointing << " attention="
            << AttentionImplementationName(spec.train.attn_implementation) << ": planned "
            << plan->peak_allocated_bytes << " B (step " << plan->peak_step << ", "
            << PhaseName(plan->peak_phase) << "), measured " << real << " B, error "
            << error * 100 << "%, planned in " << plan->seconds << " s\n";
  EXPECT_LE(std::abs(error), tolerance);
}

TEST_F(PlannerTest, EagerPlanMatchesTheCpuStep) {
  ExpectPlanMatchesCpu(
      Spec(testing::PresetConfig("tiny"), 2, 64, false, AttentionImplementation::kEager),
      0.01);
}

// A cancel reaches a dry run between its decoder layers, in forward and in
// backward: a plan of a model of many layers stops at the first poll that
// says so, CANCELLED, and plans again afterwards as before.
TEST_F(PlannerTest, ACancelStopsTheDryRunBetweenLayers) {
  LlamaConfig config = testing::SmallLlamaConfig();
  config.num_hidden_layers = 64;
  PlanSpec spec = Spec(config, 1, 8, false, AttentionImplementation::kSdpa);
  for (int stop_at : {1, 10, 100}) {  // before the run, in forward, in backward
    int polls = 0;
    spec.cancelled = [&polls, stop_at] { return ++polls >= stop_at; };
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kCancelled)
        << stop_at << ": " << plan.status();
    EXPECT_EQ(polls, stop_at);
  }
  spec.cancelled = [] { return false; };
  EXPECT_TRUE(PlanTrainingStep(spec).ok());
}

// The size admission, before anything is made: too many layers, a model
// whose training state overflows int64 (vocab 2^40 x hidden 2^20 planned
// SUCCEEDED with -9.2e18 bytes before; 2^41 answered INTERNAL), a batch
// whose tensors or host memory pass the bounds; and a step whose live bytes
// pass kMaxPlannedBytes as it runs stops there, INVALID_ARGUMENT.
TEST_F(PlannerTest, SizesBeyondWhatAPlanCountsAreRefused) {
  const LlamaConfig small = testing::SmallLlamaConfig();
  auto status_of = [](LlamaConfig config, int64_t batch, int64_t seq) {
    PlanSpec spec = Spec(config, batch, seq, false, AttentionImplementation::kEager);
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = PlanTrainingStep(spec).status();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30) << status;
    return status;
  };
  LlamaConfig deep = small;
  deep.num_hidden_layers = kMaxPlannedLayers + 1;
  absl::Status s = status_of(deep, 1, 8);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("num_hidden_layers"));
  for (int shift : {40, 41}) {
    LlamaConfig wide = small;
    wide.vocab_size = int64_t{1} << shift;
    wide.hidden_size = int64_t{1} << 20;
    wide.num_attention_heads = 1 << 10;
    wide.num_key_value_heads = 1 << 10;
    s = status_of(wide, 1, 8);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shift << ": " << s;
    EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("parameters")) << s;
  }
  LlamaConfig long_context = small;
  long_context.max_position_embeddings = int64_t{1} << 27;
  s = status_of(long_context, 1, int64_t{1} << 27);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("real host memory"));
  // Passes the admission, then its live bytes pass 2^62 a few layers in.
  LlamaConfig huge_mlp = small;
  huge_mlp.num_hidden_layers = 64;
  huge_mlp.hidden_size = 8;
  huge_mlp.num_attention_heads = 1;
  huge_mlp.num_key_value_heads = 1;
  huge_mlp.intermediate_size = int64_t{1} << 36;
  huge_mlp.max_position_embeddings = 1024;
  s = status_of(huge_mlp, 1024, 1023);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("4 EiB")) << s;
}

TEST_F(PlannerTest, CheckpointedPlanMatchesTheCpuStep) {
  ExpectPlanMatchesCpu(
      Spec(testing::PresetConfig("tiny"), 2, 64, true, AttentionImplementation::kEager),
      0.01);
}

TEST_F(PlannerTest, SdpaPlanMatchesTheCpuStepsFlashKernel) {
  ExpectPlanMatchesCpu(
      Spec(testing::PresetConfig("tiny"), 2, 64, false, AttentionImplementation::kSdpa),
      0.01);
}

// bf16: the dry run under the CPU's autocast policy (meta_autocast.h)
// against the real step under LibTorch's CPU autocast.
PlanSpec Bf16(PlanSpec spec) {
  spec.train.mixed_precision = MixedPrecision::kBf16;
  return spec;
}

// A sliding window shorter than the sequence: the model builds an explicit
// mask (in place, with logical_and) and SDPA takes the windowed path; the
// plan runs and counts the mask as the real step does, for both attention
// implementations, float32 and bf16, and a CUDA target plans it too.
TEST_F(PlannerTest, SlidingWindowPlanMatchesTheCpuStep) {
  LlamaConfig mistral = testing::PresetConfig("tiny");
  mistral.architecture = "MistralForCausalLM";
  mistral.model_type = "mistral";
  mistral.sliding_window = 16;
  ASSERT_TRUE(mistral.Validate().ok());
  for (AttentionImplementation attention :
       {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
    ExpectPlanMatchesCpu(Spec(mistral, 2, 64, false, attention), 0.01);
  }
  ExpectPlanMatchesCpu(Bf16(Spec(mistral, 2, 64, true, AttentionImplementation::kSdpa)),
                       0.01);
  PlanSpec cuda = Bf16(Spec(mistral, 2, 64, false, AttentionImplementation::kSdpa));
  cuda.target = PlanSpec::Target::kCuda;
  absl::StatusOr<MemoryPlan> planned = PlanTrainingStep(cuda);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_GT(planned->peak_allocated_bytes, 0);
}

TEST_F(PlannerTest, Bf16EagerPlanMatchesTheCpuStep) {
  ExpectPlanMatchesCpu(Bf16(Spec(testing::PresetConfig("tiny"), 2, 64, false,
                                 AttentionImplementation::kEager)),
                       0.01);
}

TEST_F(PlannerTest, Bf16SdpaCheckpointedPlanMatchesTheCpuStep) {
  ExpectPlanMatchesCpu(Bf16(Spec(testing::PresetConfig("tiny"), 2, 64, true,
                                 AttentionImplementation::kSdpa)),
                       0.01);
}

// What bf16 changes, planned and measured: the matmuls' outputs and what
// autograd saves of them in bfloat16, and the weights' bfloat16 copies
// autocast caches for the forward. The plans' difference follows the real
// steps' (without the meta autocast the plans would not differ at all).
TEST_F(PlannerTest, Bf16ChangesThePlanAsItChangesTheStep) {
  const PlanSpec fp32 =
      Spec(testing::PresetConfig("tiny"), 4, 256, false, AttentionImplementation::kEager);
  int64_t planned[2] = {0, 0}, measured[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const PlanSpec spec = k == 0 ? fp32 : Bf16(fp32);
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    planned[k] = plan->peak_allocated_bytes;
    absl::StatusOr<std::vector<MeasuredStep>> steps = MeasureTrainingSteps(
        spec, c10::Device(c10::DeviceType::CPU), memory::MemoryRecorder::Global());
    ASSERT_TRUE(steps.ok()) << steps.status();
    for (const MeasuredStep& s : *steps)
      measured[k] = std::max(measured[k], s.peak_allocated_bytes);
  }
  const int64_t planned_change = planned[1] - planned[0];
  const int64_t measured_change = measured[1] - measured[0];
  std::cout << "tiny 4 x 256 eager, bf16 against float32: planned " << planned_change
            << " B, measured " << measured_change << " B\n";
  ASSERT_NE(measured_change, 0);
  EXPECT_NEAR(static_cast<double>(planned_change) / static_cast<double>(measured_change),
              1.0, 0.05);
}

PlanSpec DiskOffloaded(PlanSpec spec) {
  spec.offload.enabled = true;
  spec.offload.target = offload::Target::kDisk;
  spec.offload.spill_dir = ::testing::TempDir();
  return spec;
}

TEST_F(PlannerTest, DiskOffloadedPlanMatchesTheCpuStep) {
  ExpectPlanMatchesCpu(DiskOffloaded(Spec(testing::PresetConfig("tiny"), 2, 64, false,
                                          AttentionImplementation::kEager)),
                       0.01);
}

// With the heap kept near its live bytes (as the daemon keeps it), the
// process's resident set grows during the steps by about what the plan's
// host_rss_bytes says, and by little more than the allocator's peak: the
// checkpointed, offloaded and bf16 cells included. Each cell runs once
// before it is measured, so that the kernels' code pages are resident
// already (RSS counts them; they are the same for every run).
TEST_F(PlannerTest, HostRssFollowsThePlanWithTheHeapKeptNearLiveBytes) {
  ASSERT_TRUE(KeepHostHeapNearLiveBytes());
  const LlamaConfig tiny = testing::PresetConfig("tiny");
  PlanSpec bf16 = Spec(tiny, 4, 256, true, AttentionImplementation::kSdpa);
  bf16.train.mixed_precision = MixedPrecision::kBf16;
  const std::vector<PlanSpec> cells = {
      Spec(tiny, 4, 256, false, AttentionImplementation::kSdpa),
      Spec(tiny, 4, 256, true, AttentionImplementation::kEager),
      DiskOffloaded(Spec(tiny, 4, 256, false, AttentionImplementation::kEager)),
      bf16,
  };
  for (const PlanSpec& spec : cells) {
    SCOPED_TRACE(::testing::Message()
                 << "ckpt=" << spec.train.gradient_checkpointing << " attention="
                 << AttentionImplementationName(spec.train.attn_implementation)
                 << " offload=" << spec.offload.enabled
                 << " bf16=" << (spec.train.mixed_precision == MixedPrecision::kBf16));
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_GT(MeasuredCpuPeak(spec), 0);  // the warm-up
    ReturnFreedHostMemory();
    if (!ResetHostPeakResident()) GTEST_SKIP() << "this kernel refuses clear_refs";
    const int64_t before = ReadHostResident().rss_bytes;
    const int64_t real = MeasuredCpuPeak(spec);
    const int64_t growth = ReadHostResident().peak_rss_bytes - before;
    ASSERT_GT(real, 0);
    ASSERT_GT(before, 0);
    const double error =
        static_cast<double>(plan->host_rss_bytes - growth) / static_cast<double>(growth);
    std::cout << "RSS growth " << growth << " B, planned " << plan->host_rss_bytes
              << " B (error " << error * 100 << "%), allocator peak " << real << " B ("
              << static_cast<double>(growth) / static_cast<double>(real) << "x)\n";
    EXPECT_LE(growth, real * 5 / 4);
    EXPECT_LE(std::abs(error), 0.10);
  }
}

TEST_F(PlannerTest, OffloadingLowersThePlannedPeakAndHostOnACpuMovesNothing) {
  const PlanSpec plain =
      Spec(testing::PresetConfig("tiny"), 2, 64, false, AttentionImplementation::kEager);
  absl::StatusOr<MemoryPlan> kept = PlanTrainingStep(plain);
  absl::StatusOr<MemoryPlan> disk = PlanTrainingStep(DiskOffloaded(plain));
  PlanSpec host = plain;
  host.offload.enabled = true;
  host.offload.target = offload::Target::kHost;
  absl::StatusOr<MemoryPlan> host_on_cpu = PlanTrainingStep(host);
  ASSERT_TRUE(kept.ok() && disk.ok() && host_on_cpu.ok());
  EXPECT_LT(disk->peak_allocated_bytes, kept->peak_allocated_bytes);
  EXPECT_EQ(host_on_cpu->peak_allocated_bytes, kept->peak_allocated_bytes);
}

TEST_F(PlannerTest, PeakIsAttributedAndSumsToItsCategories) {
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(
      Spec(testing::SmallLlamaConfig(), 2, 16, false, AttentionImplementation::kEager));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t sum = 0;
  for (int64_t c : plan->categories_at_peak) sum += c;
  EXPECT_EQ(sum, plan->peak_allocated_bytes);
  EXPECT_EQ(plan->model_state_bytes + plan->activation_bytes, plan->peak_allocated_bytes);
  const auto at = [&](Category c) {
    return plan->categories_at_peak[static_cast<int>(c)];
  };
  // The small config: 2 layers of hidden 32, vocab 256 (tied): float32.
  // Each storage once (the head is tied to the embedding).
  int64_t parameters = 0;
  int64_t tensors = 0;
  {
    std::unique_ptr<LlamaModel> model =
        testing::MakeLlama(testing::SmallLlamaConfig(), 0);
    std::set<const void*> seen;
    for (const auto& [name, p] : model->NamedParameters()) {
      if (!seen.insert(p.storage().unsafeGetStorageImpl()).second) continue;
      parameters += p.nbytes();
      ++tensors;
    }
  }
  EXPECT_EQ(at(Category::kParameters), parameters);
  // Between steps: the parameters, AdamW's two moments of each and its
  // float32 step count per tensor.
  EXPECT_EQ(plan->resident_between_steps_bytes, parameters * 3 + tensors * 4);
  std::cout << "small at 2 x 16: peak " << plan->peak_allocated_bytes << " B in "
            << PhaseName(plan->peak_phase) << "; largest module "
            << plan->top_modules_at_peak[0].name << " "
            << plan->top_modules_at_peak[0].bytes << " B\n";
  EXPECT_GT(at(Category::kSavedActivations) + at(Category::kTemporaries), 0);
  ASSERT_FALSE(plan->top_modules_at_peak.empty());
  // Ops too: the dry run attributes its own ops, with or without a training's
  // callbacks installed.
  ASSERT_FALSE(plan->top_ops_at_peak.empty());
  EXPECT_TRUE(
      std::any_of(plan->top_ops_at_peak.begin(), plan->top_ops_at_peak.end(),
                  [](const NamedBytes& op) { return op.name.rfind("aten::", 0) == 0; }))
      << plan->top_ops_at_peak[0].name;
  EXPECT_FALSE(plan->phase_category_peaks.empty());
  EXPECT_EQ(plan->peak_step, 2);  // the optimizer state is there from the start
}

// The fused loss where the head dominates: `tiny` at a vocabulary of 16,384
// (the head 16 MiB in float32), 2 x 64 tokens in chunks of 48 (two whole,
// one partial). Its chunk buffer, the weight's gradient it makes in forward
// and the hidden states' gradient it saves, planned as the real steps
// allocate them: float32, bf16, two accumulated micro-batches with
// checkpointing, and the head's saved tensors offloaded to disk.
TEST_F(PlannerTest, FusedLossPlansMatchTheCpuSteps) {
  LlamaConfig config = testing::PresetConfig("tiny");
  config.vocab_size = 16384;
  config.tie_word_embeddings = false;
  const PlanSpec base = Spec(config, 2, 64, false, AttentionImplementation::kSdpa);
  std::vector<PlanSpec> specs(4, base);
  for (PlanSpec& spec : specs) spec.train.loss_chunk_tokens = 48;
  specs[1].train.mixed_precision = MixedPrecision::kBf16;
  specs[2].train.grad_accumulation_steps = 2;
  specs[2].train.gradient_checkpointing = true;
  specs[3] = DiskOffloaded(specs[3]);
  specs[3].offload.offload_head = true;
  for (const PlanSpec& spec : specs) ExpectPlanMatchesCpu(spec, 0.01);
  // The head weight's float32 gradient exists in forward, as a gradient.
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(specs[0]);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int64_t forward_gradients = 0;
  for (const PhaseCategoryPeak& p : plan->phase_category_peaks) {
    if (p.phase == Phase::kForward && p.category == Category::kGradients) {
      forward_gradients = p.bytes;
    }
  }
  EXPECT_GE(forward_gradients, config.vocab_size * config.hidden_size * 4);
}

// A tied head at a large vocabulary: the head weight's gradient and the
// embedding's meet in autograd's input buffer, which sums them in place on a
// CPU or CUDA device but out of place on meta (LibTorch counts meta tensors
// as subclass-like: at::isTensorSubclassLike), so the plan holds one more
// float32 [vocab x hidden] block for that moment of backward. Its excess is
// that block and no more: an over-estimate, never an under-estimate.
TEST_F(PlannerTest, ATiedHeadPlansOneGradientSumAboveTheStep) {
  LlamaConfig config = testing::PresetConfig("tiny");
  config.vocab_size = 16384;
  config.tie_word_embeddings = true;
  PlanSpec spec = Spec(config, 2, 64, false, AttentionImplementation::kSdpa);
  spec.train.loss_chunk_tokens = 48;
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t real = MeasuredCpuPeak(spec);
  ASSERT_GT(real, 0);
  const int64_t block = config.vocab_size * config.hidden_size * 4;
  std::cout << "tied tiny at 16,384 ids: planned " << plan->peak_allocated_bytes
            << " B, measured " << real << " B, one gradient block " << block << " B\n";
  EXPECT_EQ(plan->peak_phase, Phase::kBackward);
  EXPECT_NEAR(static_cast<double>(plan->peak_allocated_bytes - real),
              static_cast<double>(block), 0.01 * static_cast<double>(real));
}

// Every micro-batch after the first starts from the same memory: 4096 of them
// plan as 2 do, and as fast (a Train's calibration plan must not take
// minutes, nor hold up shutdown).
TEST_F(PlannerTest, ManyMicroBatchesPlanAsTwo) {
  PlanSpec spec =
      Spec(testing::PresetConfig("tiny"), 2, 64, false, AttentionImplementation::kEager);
  spec.train.grad_accumulation_steps = 2;
  absl::StatusOr<MemoryPlan> two = PlanTrainingStep(spec);
  spec.train.grad_accumulation_steps = 4096;
  absl::StatusOr<MemoryPlan> many = PlanTrainingStep(spec);
  ASSERT_TRUE(two.ok() && many.ok());
  EXPECT_EQ(many->peak_allocated_bytes, two->peak_allocated_bytes);
}

TEST_F(PlannerTest, VerdictAgainstACapacity) {
  PlanSpec spec =
      Spec(testing::SmallLlamaConfig(), 2, 16, false, AttentionImplementation::kEager);
  spec.capacity_bytes = 1;
  absl::StatusOr<MemoryPlan> small = PlanTrainingStep(spec);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_FALSE(small->fits);
  EXPECT_EQ(small->headroom_bytes, 1 - small->peak_allocated_bytes);
  spec.capacity_bytes = int64_t{1} << 40;
  absl::StatusOr<MemoryPlan> big = PlanTrainingStep(spec);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE(big->fits);
  EXPECT_EQ(big->peak_allocated_bytes, small->peak_allocated_bytes);  // deterministic
}

TEST_F(PlannerTest, CudaTargetRoundsEachBlockAsTheCachingAllocator) {
  PlanSpec spec =
      Spec(testing::SmallLlamaConfig(), 2, 16, false, AttentionImplementation::kEager);
  absl::StatusOr<MemoryPlan> cpu = PlanTrainingStep(spec);
  spec.target = PlanSpec::Target::kCuda;
  absl::StatusOr<MemoryPlan> cuda = PlanTrainingStep(spec);
  ASSERT_TRUE(cpu.ok() && cuda.ok());
  EXPECT_EQ(cuda->peak_allocated_bytes % 512, 0);
  EXPECT_GT(cuda->peak_allocated_bytes, cpu->peak_allocated_bytes);
  // The reserved bytes come from replaying the blocks through the caching
  // allocator's model: whole segments (multiples of 2 MiB), at least the
  // peak handed out; a CPU caches nothing.
  EXPECT_GE(cuda->reserved_bytes, cuda->peak_allocated_bytes);
  EXPECT_EQ(cuda->reserved_bytes % (2 << 20), 0);
  EXPECT_EQ(cpu->reserved_bytes, 0);
}

// Which kernel a dry run stands in for SDPA with (this machine has no GPU,
// so CUDA's comes from the rule): bf16 -> flash, grouped or not; float32
// without grouped heads -> memory-efficient; float32 with grouped heads ->
// the math path; the CPU target -> the CPU's flash kernel for these shapes.
TEST_F(PlannerTest, SdpaStandInFollowsTheTargetsChoice) {
  if (at::hasCUDA()) GTEST_SKIP() << "a GPU answers for CUDA here, not the rule";
  using Kernel = LlamaModel::MetaSdpaKernel;
  LlamaConfig grouped = testing::SmallLlamaConfig();  // 4 heads, 2 key/value heads
  LlamaConfig plain = grouped;
  plain.num_key_value_heads = plain.num_attention_heads;
  PlanSpec spec = Spec(grouped, 2, 16, false, AttentionImplementation::kSdpa);
  EXPECT_EQ(internal::SdpaKernelFor(spec), Kernel::kCpuFlash);
  spec.target = PlanSpec::Target::kCuda;
  EXPECT_EQ(internal::SdpaKernelFor(spec), Kernel::kMath);
  EXPECT_EQ(internal::SdpaKernelFor(Bf16(spec)), Kernel::kCudaFlash);
  spec.model = plain;
  EXPECT_EQ(internal::SdpaKernelFor(spec), Kernel::kCudaEfficient);
  EXPECT_EQ(internal::SdpaKernelFor(Bf16(spec)), Kernel::kCudaFlash);
}

// A bf16 plan for a CUDA target: planned under CUDA's autocast, with SDPA
// as flash attention. Its attention keeps no [B, H, T, T] matrix, so it
// plans at least one such bf16 matrix per layer below the same step with
// eager attention; and CUDA's policy (softmax and the norms' pow and rsqrt
// in float32) differs from the CPU's, so the two targets' plans differ.
TEST_F(PlannerTest, Bf16PlansForACudaTarget) {
  const LlamaConfig config = testing::PresetConfig("tiny");
  const int64_t b = 2, t = 256;
  PlanSpec sdpa = Bf16(Spec(config, b, t, false, AttentionImplementation::kSdpa));
  sdpa.target = PlanSpec::Target::kCuda;
  PlanSpec eager = sdpa;
  eager.train.attn_implementation = AttentionImplementation::kEager;
  PlanSpec cpu = sdpa;
  cpu.target = PlanSpec::Target::kCpu;
  absl::StatusOr<MemoryPlan> with_flash = PlanTrainingStep(sdpa);
  absl::StatusOr<MemoryPlan> with_eager = PlanTrainingStep(eager);
  absl::StatusOr<MemoryPlan> on_cpu = PlanTrainingStep(cpu);
  ASSERT_TRUE(with_flash.ok()) << with_flash.status();
  ASSERT_TRUE(with_eager.ok()) << with_eager.status();
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  const int64_t scores = b * config.num_attention_heads * t * t * 2;
  std::cout << "tiny " << b << "x" << t << " bf16 on cuda: sdpa (flash) activations "
            << with_flash->activation_bytes << " B, eager "
            << with_eager->activation_bytes << " B; one layer's scores " << scores
            << " B; the same sdpa step on cpu " << on_cpu->peak_allocated_bytes << " B\n";
  EXPECT_LE(with_flash->activation_bytes,
            with_eager->activation_bytes - config.num_hidden_layers * scores);
  EXPECT_NE(with_flash->peak_allocated_bytes, on_cpu->peak_allocated_bytes);
}

// Each CUDA stand-in carries a whole step (forward, checkpointed recompute,
// backward, AdamW) on meta, and plans no more activations than the math
// path's eager twin.
TEST_F(PlannerTest, EveryCudaStandInPlansAWholeStep) {
  LlamaConfig plain = testing::SmallLlamaConfig();
  plain.num_key_value_heads = plain.num_attention_heads;  // float32: efficient
  for (bool bf16 : {false, true}) {
    for (bool ckpt : {false, true}) {
      PlanSpec sdpa = Spec(plain, 2, 64, ckpt, AttentionImplementation::kSdpa);
      sdpa.target = PlanSpec::Target::kCuda;
      if (bf16) sdpa = Bf16(sdpa);
      PlanSpec eager = sdpa;
      eager.train.attn_implementation = AttentionImplementation::kEager;
      absl::StatusOr<MemoryPlan> a = PlanTrainingStep(sdpa);
      absl::StatusOr<MemoryPlan> b = PlanTrainingStep(eager);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_LE(a->activation_bytes, b->activation_bytes)
          << "bf16 " << bf16 << " ckpt " << ckpt;
    }
  }
}

// Offloading to disk, the step peaking in forward (tiny 8 x 512, sdpa, bf16,
// no checkpointing): the plan counts each copy off the device as done at
// once, so the real step's peak is at least the plan's; offload_in_flight_
// bytes is what up to max_copies_in_flight copies in flight add, and the
// verdict counts it. On a quiet machine the real peak stayed within it
// (108.76 MB against 107.45 + 5.24); with both cores busy beside it, it
// reached 116.88 MB, above it, for a reason not found yet: no upper bound
// is asserted.
// The run's in-memory tokens (PlanSpec::data_bytes) are at a cpu target's
// peak under `other`, and only there: the copies in flight, which compare
// two dry runs neither of which holds them, are the same with and without.
TEST_F(PlannerTest, InMemoryDataIsAtTheCpuPeakAndNotInTheCopiesInFlight) {
  // The shape whose copies in flight add most (the verdict test below).
  PlanSpec spec = Bf16(
      Spec(testing::PresetConfig("tiny"), 8, 512, false, AttentionImplementation::kSdpa));
  spec.offload.enabled = true;
  spec.offload.target = offload::Target::kDisk;
  spec.offload.spill_dir = ::testing::TempDir();
  absl::StatusOr<MemoryPlan> without = PlanTrainingStep(spec);
  spec.data_bytes = 92640;  // the embedded corpus
  absl::StatusOr<MemoryPlan> with = PlanTrainingStep(spec);
  ASSERT_TRUE(without.ok() && with.ok());
  ASSERT_GT(without->offload_in_flight_bytes, 0);
  EXPECT_EQ(with->peak_allocated_bytes, without->peak_allocated_bytes + 92640);
  EXPECT_EQ(with->offload_in_flight_bytes, without->offload_in_flight_bytes);
  const auto other = static_cast<size_t>(Category::kOther);
  EXPECT_EQ(with->categories_at_peak[other], without->categories_at_peak[other] + 92640);
  EXPECT_EQ(with->model_state_bytes + with->activation_bytes, with->peak_allocated_bytes);
  // On a cuda target they are host memory, outside the plan.
  spec.target = PlanSpec::Target::kCuda;
  absl::StatusOr<MemoryPlan> cuda_with = PlanTrainingStep(spec);
  spec.data_bytes = 0;
  absl::StatusOr<MemoryPlan> cuda_without = PlanTrainingStep(spec);
  ASSERT_TRUE(cuda_with.ok() && cuda_without.ok());
  EXPECT_EQ(cuda_with->peak_allocated_bytes, cuda_without->peak_allocated_bytes);
}

TEST_F(PlannerTest, OffloadCopiesInFlightAreCountedInTheVerdict) {
  PlanSpec spec = Bf16(
      Spec(testing::PresetConfig("tiny"), 8, 512, false, AttentionImplementation::kSdpa));
  spec.offload.enabled = true;
  spec.offload.target = offload::Target::kDisk;
  spec.offload.spill_dir = ::testing::TempDir();
  absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t real = MeasuredCpuPeak(spec);
  ASSERT_GT(real, 0);
  const int64_t bound = plan->peak_allocated_bytes + plan->offload_in_flight_bytes;
  std::cout << "tiny 8x512 sdpa bf16 offloaded to disk: planned "
            << plan->peak_allocated_bytes << " B, copies in flight up to +"
            << plan->offload_in_flight_bytes << " B, measured " << real << " B\n";
  EXPECT_GT(plan->offload_in_flight_bytes, 0);
  // The plan misses what LibTorch's bf16 kernels allocate inside themselves
  // (30 to 35 KiB in the grid).
  constexpr int64_t kInsideKernels = 64 << 10;
  EXPECT_GE(real, plan->peak_allocated_bytes - kInsideKernels);
  spec.capacity_bytes = bound;
  absl::StatusOr<MemoryPlan> exact = PlanTrainingStep(spec);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_TRUE(exact->fits);
  EXPECT_EQ(exact->headroom_bytes, 0);
  spec.capacity_bytes = bound - 1;
  absl::StatusOr<MemoryPlan> short_by_one = PlanTrainingStep(spec);
  ASSERT_TRUE(short_by_one.ok()) << short_by_one.status();
  EXPECT_FALSE(short_by_one->fits);
  // Without offloading there is nothing in flight.
  spec.offload.enabled = false;
  absl::StatusOr<MemoryPlan> plain = PlanTrainingStep(spec);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->offload_in_flight_bytes, 0);
}

// The backward read-ahead (prefetch_depth 2, to disk on the CPU): the plan
// brings the next two records back at each reload, as a reader thread that
// keeps up does (on this CPU the real reader does: 1 KiB apart, against
// 1.2% without planning it); a reader that lags behind holds less, so the
// measured peak lies between the plans without and with read-ahead.
TEST_F(PlannerTest, ReadAheadIsPlannedAsAReaderThatKeepsUp) {
  for (bool ckpt : {false, true}) {
    PlanSpec spec = Spec(testing::PresetConfig("tiny"), 4, 256, ckpt,
                         AttentionImplementation::kEager);
    spec.offload.enabled = true;
    spec.offload.target = offload::Target::kDisk;
    spec.offload.spill_dir = ::testing::TempDir();
    spec.offload.prefetch_depth = 0;
    absl::StatusOr<MemoryPlan> none = PlanTrainingStep(spec);
    spec.offload.prefetch_depth = 2;
    absl::StatusOr<MemoryPlan> ahead = PlanTrainingStep(spec);
    ASSERT_TRUE(none.ok() && ahead.ok());
    absl::StatusOr<std::vector<MeasuredStep>> measured = MeasureTrainingSteps(
        spec, c10::Device(c10::DeviceType::CPU), memory::MemoryRecorder::Global());
    ASSERT_TRUE(measured.ok()) << measured.status();
    int64_t real = 0;
    for (const MeasuredStep& s : *measured) real = std::max(real, s.peak_allocated_bytes);
    std::cout << "tiny 4x256 eager ckpt=" << ckpt
              << " to disk: planned without read-ahead " << none->peak_allocated_bytes
              << " B, with depth 2 " << ahead->peak_allocated_bytes << " B ("
              << PhaseName(ahead->peak_phase) << "), measured with depth 2 " << real
              << " B\n";
    EXPECT_GE(ahead->peak_allocated_bytes, none->peak_allocated_bytes);
    // The real step also holds the token window's copy, which the plan counts
    // on the device: a few hundred bytes (the grid's +0.003%).
    constexpr int64_t kTokenWindow = 4 << 10;
    EXPECT_LE(real, ahead->peak_allocated_bytes + ahead->offload_in_flight_bytes +
                        kTokenWindow);
    EXPECT_GE(real, none->peak_allocated_bytes);
  }
}

TEST_F(PlannerTest, RefusesWhatItCannotPlanAndBadFields) {
  PlanSpec spec =
      Spec(testing::SmallLlamaConfig(), 2, 16, false, AttentionImplementation::kEager);
  spec.offload.enabled = true;
  spec.offload.min_offload_bytes = -1;
  EXPECT_EQ(PlanTrainingStep(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.offload = offload::OffloadOptions();
  spec.train.seq_len = 100000;  // beyond max_position_embeddings
  EXPECT_EQ(PlanTrainingStep(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.train.seq_len = 16;
  spec.train.batch_size = 0;
  EXPECT_EQ(PlanTrainingStep(spec).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTarget("tpu").status().code(), absl::StatusCode::kInvalidArgument);
}

// A shape whose weights alone would take gigabytes plans without making any
// of them: the process's CPU peak while planning stays small.
TEST_F(PlannerTest, ABigShapeIsPlannedWithoutMakingItsWeights) {
  LlamaConfig big;
  big.vocab_size = 128256;
  big.hidden_size = 4096;
  big.intermediate_size = 14336;
  big.num_hidden_layers = 2;
  big.num_attention_heads = 32;
  big.num_key_value_heads = 8;
  big.max_position_embeddings = 8192;
  memory::MemoryRecorder& recorder = memory::MemoryRecorder::Global();
  const int64_t before = recorder.CurrentBytes(memory::kCpuDevice);
  recorder.ResetPeak();
  absl::StatusOr<MemoryPlan> plan =
      PlanTrainingStep(Spec(big, 1, 256, true, AttentionImplementation::kSdpa));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const int64_t cpu_growth = recorder.PeakBytes(memory::kCpuDevice) - before;
  std::cout << "2-layer 8B-wide shape: planned peak " << plan->peak_allocated_bytes
            << " B in " << plan->seconds << " s; CPU peak growth " << cpu_growth
            << " B\n";
  // The embedding alone is 2.1 GB of float32; the plan's CPU bytes are its
  // token window, the rotary tables and the attention-choice probe.
  EXPECT_GT(plan->categories_at_peak[static_cast<int>(Category::kParameters)],
            int64_t{2} << 30);
  EXPECT_LT(cpu_growth, int64_t{64} << 20);
}

// A plan made while the process is in a training step's phase leaves that
// phase and step alone, and its allocations never reach the process's
// recorder.
TEST_F(PlannerTest, PlanBesideATrainingLeavesItsPhaseAndRecorderAlone) {
  const int64_t cpu_before =
      memory::MemoryRecorder::Global().CurrentBytes(memory::kCpuDevice);
  BeginStep(41);
  {
    PhaseScope forward(Phase::kForward);
    absl::StatusOr<MemoryPlan> plan = PlanTrainingStep(
        Spec(testing::SmallLlamaConfig(), 2, 16, false, AttentionImplementation::kEager));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(CurrentPhase(), Phase::kForward);
    EXPECT_EQ(CurrentStep(), 41);
  }
  EndStep(41);
  // Its only CPU bytes (the token window) are gone with it.
  EXPECT_EQ(memory::MemoryRecorder::Global().CurrentBytes(memory::kCpuDevice),
            cpu_before);
}

}  // namespace
}  // namespace memprofd::plan

namespace memprofd::plan {
namespace {

// The tiny preset at 4 x 64 tokens, sdpa, r 8 adapters on every projection.
PlanSpec TinyLoraSpec(const LlamaConfig& tiny, bool checkpointing) {
  PlanSpec spec = Spec(tiny, 4, 64, checkpointing, AttentionImplementation::kSdpa);
  spec.train.lora.r = 8;
  spec.train.lora.target_modules = {"all-linear"};
  return spec;
}

// A LoRA step: the base frozen (no gradients, no AdamW state), the adapters
// and their state, the frozen weights autograd saves for the inputs'
// gradients; planned as measured, checkpointed or not, and well under the
// full fine-tune of the same shape.
TEST_F(PlannerTest, LoraPlansMatchTheCpuStepsAndStayUnderAFullFineTune) {
  absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset("tiny");
  ASSERT_TRUE(config.ok());
  for (bool checkpointing : {false, true}) {
    PlanSpec spec = TinyLoraSpec(*config, checkpointing);
    ExpectPlanMatchesCpu(spec, 0.005);
    absl::StatusOr<MemoryPlan> lora = PlanTrainingStep(spec);
    spec.train.lora = LoraOptions();
    absl::StatusOr<MemoryPlan> full = PlanTrainingStep(spec);
    ASSERT_TRUE(lora.ok() && full.ok());
    std::cout << "tiny 4 x 64, checkpointing " << checkpointing << ": LoRA r 8 planned "
              << lora->peak_allocated_bytes << " B, full fine-tune "
              << full->peak_allocated_bytes << " B\n";
    EXPECT_LT(lora->peak_allocated_bytes, full->peak_allocated_bytes);
    // Dropout's masks (one byte an element of each adapter's input, kept
    // for backward) are planned as the step makes them.
    spec.train.lora.r = 8;
    spec.train.lora.target_modules = {"all-linear"};
    spec.train.lora.dropout = 0.1;
    ExpectPlanMatchesCpu(spec, 0.005);
    absl::StatusOr<MemoryPlan> dropout = PlanTrainingStep(spec);
    ASSERT_TRUE(dropout.ok());
    std::cout << "  with lora_dropout 0.1: planned " << dropout->peak_allocated_bytes
              << " B\n";
    EXPECT_GT(dropout->peak_allocated_bytes, lora->peak_allocated_bytes);
  }
}

// A bf16 base under bf16 autocast: the cast at the run's start (the float32
// base and one bf16 tensor live at once: the peak of a checkpointed step of
// this shape) and the base's halved bytes after it, planned as measured, and
// below the float32 base's plan by at least three eighths of the base.
TEST_F(PlannerTest, ABf16BasePlansAsItsStepsMeasureAndHalvesTheBase) {
  absl::StatusOr<LlamaConfig> config = LlamaConfig::Preset("tiny");
  ASSERT_TRUE(config.ok());
  for (bool checkpointing : {false, true}) {
    PlanSpec spec = TinyLoraSpec(*config, checkpointing);
    spec.train.mixed_precision = MixedPrecision::kBf16;
    // The float32 base under bf16 autocast, planned as measured too (its
    // checkpointed forward's bf16 products included).
    ExpectPlanMatchesCpu(spec, 0.005);
    absl::StatusOr<MemoryPlan> float32 = PlanTrainingStep(spec);
    spec.train.base_dtype = BaseDtype::kBf16;
    ExpectPlanMatchesCpu(spec, 0.005);
    absl::StatusOr<MemoryPlan> bf16 = PlanTrainingStep(spec);
    ASSERT_TRUE(float32.ok() && bf16.ok());
    const int64_t base_bytes = config->NumParameters() * 4;
    std::cout << "tiny 4 x 64 bf16 autocast, checkpointing " << checkpointing
              << ": LoRA r 8 on a float32 base planned " << float32->peak_allocated_bytes
              << " B, on a bf16 base " << bf16->peak_allocated_bytes << " B\n";
    EXPECT_LT(bf16->peak_allocated_bytes,
              float32->peak_allocated_bytes - base_bytes / 2 + base_bytes / 8);
    // A model made in bf16 (LoadModel's base_dtype) has no cast to make: its
    // plan is its steps', as measured, and below the cast's.
    spec.model_base_dtype = BaseDtype::kBf16;
    ExpectPlanMatchesCpu(spec, 0.005);
    absl::StatusOr<MemoryPlan> loaded = PlanTrainingStep(spec);
    ASSERT_TRUE(loaded.ok());
    std::cout << "  made in bf16: planned " << loaded->peak_allocated_bytes << " B\n";
    EXPECT_LE(loaded->peak_allocated_bytes, bf16->peak_allocated_bytes);
    // Checkpointed, the cast can be the peak (where bf16 matrix products
    // allocate no float32 buffer of their own: gemm_buffers.h), and then
    // without it the plan is lower.
    if (checkpointing && bf16->peak_at_setup) {
      EXPECT_LT(loaded->peak_allocated_bytes, bf16->peak_allocated_bytes);
    }
  }
}

}  // namespace
}  // namespace memprofd::plan
