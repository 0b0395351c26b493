#ifndef MEMPROFD_CORE_PLAN_PLANNER_H_
#define MEMPROFD_CORE_PLAN_PLANNER_H_

// Where every byte of a training step will go, before it runs: the step is
// run for real — the same model code, module scopes, autograd, gradient
// checkpointing, chunked loss, the activation offloader and fused AdamW —
// on the meta device, where tensors have shapes and no data. Every storage
// the step allocates is counted with the attribution a real step's would get
// (meta_accounting.h), so the plan is the real step's allocator trace
// without the arithmetic: no weights are read or allocated, and a 70B shape
// plans on a laptop.
//
// Two optimizer steps run: the first creates AdamW's state, the second is a
// step as every later one is. The plan is the step whose peak is higher.
// Each runs at most two micro-batches: every one after the first starts from
// the same memory, so the peak of any count >= 2 is that of 2.
//
// What a meta run cannot see, and so the plan does not count: what a kernel
// allocates inside itself and frees before it returns (CPU flash attention's
// per-thread buffers, CUDA flash backward's float32 accumulator, BLAS
// workspaces) and memory outside the allocator (the CUDA context, cuBLAS
// workspaces). Two such buffers are counted all the same: a CPU's bf16
// matrix products' float32 output buffer, where the host's kernels make one
// (probed: gemm_buffers.h), and Gloo's buffer of each all-gather in a CPU
// data-parallel plan (ProcessGroup::ForPlan). A caching allocator's reserve
// is simulated beside the plan (MemoryPlan::reserved_bytes).
//
// Thread-safety: PlanTrainingStep may run on any thread, beside a training
// on another: its phases and steps are its own (PhaseDomain), its meta
// storages reach only its own ledger, never the process's recorder. Its few
// CPU bytes (the synthetic token window) are real and counted as such.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/common/attribution.h"
#include "core/common/phase.h"
#include "core/dist/sharding.h"
#include "core/model/config.h"
#include "core/offload/offload_options.h"
#include "core/train/train_options.h"

namespace memprofd::plan {

// What to plan: a model shape and the training fields of a Train.
struct PlanSpec {
  LlamaConfig model;
  // The dtype of the model's base when the run starts: float32 as LoadModel
  // makes it by default (a LoRA run with base_dtype bf16 then casts it, and
  // the plan counts the cast), or bf16 (LoadModel's base_dtype, or an
  // earlier run's cast: the model is made so, and nothing is cast).
  BaseDtype model_base_dtype = BaseDtype::kFloat32;
  // batch_size, seq_len, grad_accumulation_steps, gradient_checkpointing,
  // checkpoint_layers, attn_implementation, loss_chunk_tokens, max_grad_norm
  // and the optimizer
  // fields are planned; data, steps and evaluation are ignored (the plan
  // draws from a synthetic window). mixed_precision bf16 runs the dry run
  // under the target device's autocast policy (core/train/meta_autocast.h).
  TrainOptions train;
  // The activation offloader's options (off by default). The dry run's
  // offloader decides what it would move exactly as a real one, and its
  // copies complete at once (offloader.h), or, for
  // MemoryPlan::offload_in_flight_bytes, up to max_copies_in_flight held in
  // flight. The backward read-ahead brings the next prefetch_depth records
  // back at each reload, as a reader that keeps up does (automatic depth:
  // the target's, 0 on a CPU and 2 on CUDA). The host target moves nothing
  // on a CPU.
  offload::OffloadOptions offload;
  // The device the step would run on: its SDPA kernel choice
  // (internal::SdpaKernelFor) and autocast policy are followed. On CUDA each
  // allocation counts as the caching allocator hands it out (rounded up to
  // 512 bytes, or a whole cached block it does not split:
  // caching_allocator_model.h), as torch.cuda.max_memory_allocated counts
  // it, and the reserved bytes are simulated (MemoryPlan::reserved_bytes).
  enum class Target { kCpu, kCuda };
  Target target = Target::kCpu;
  // The device's capacity in bytes, for the verdict (0: no verdict).
  int64_t capacity_bytes = 0;
  // A data-parallel run of world_size ranks (1 to kMaxPlannedWorldSize; 1:
  // one process), each training its own batch_size windows, with `sharding`.
  // Each planned rank's step runs the real DataParallel listener (its
  // gradient buckets, optimizer and gradient sharding) as that rank, over a
  // ProcessGroup::ForPlan whose collectives complete at once. With
  // world_size 1 the sharding
  // has nothing to split: the plan is one process's, as a daemon of one rank
  // ignores its --sharding, and MemoryPlan::sharding says none.
  int world_size = 1;
  Sharding sharding = Sharding::kNone;
  // Bytes the run's data sources keep in the allocator for the whole run:
  // tokens held in memory (the embedded corpus, inline tokens: 4 bytes a
  // token; core/train/data.h's InMemoryTokenBytes), where files are mapped
  // and cost none. With the cpu target they are the compute device's, and
  // the plan counts them at its peak under `other`; with cuda they are host
  // memory, outside the plan.
  int64_t data_bytes = 0;
  // Polled (a cheap predicate; empty: never) before each dry run, before
  // each of its steps and micro-batches, and between its decoder layers in
  // forward and backward: true stops the plan within a layer's work, with
  // CANCELLED. A plan of thousands of layers, or budget planning's many dry
  // runs, can take minutes; a client's cancel and a drain end them at once.
  std::function<bool()> cancelled;
};

// A plan's size admission, checked before anything is made for it:
// - at most kMaxPlannedLayers decoder layers (a dry run keeps about 100 KB of
//   host bookkeeping per layer; the deepest released models have 126);
// - the model's training state (16 bytes a parameter) and each activation
//   of a micro-batch (the logits, the MLP's, eager attention's scores)
//   within kMaxPlannedBytes, and the bytes a dry run counts live at once
//   too (checked as it runs), so that no count overflows int64;
// - at most kMaxPlanHostBytes of real host memory: 20 bytes per token of a
//   micro-batch (the synthetic window, inputs and targets) and 12 per
//   max_position_embeddings x head_dim (the rotary caches, computed on the
//   CPU).
inline constexpr int64_t kMaxPlannedLayers = 1024;
inline constexpr int64_t kMaxPlannedBytes = int64_t{1} << 62;   // 4 EiB
inline constexpr int64_t kMaxPlanHostBytes = int64_t{2} << 30;  // 2 GiB

// The size admission above that needs no dry run (all but the live-bytes
// guard): INVALID_ARGUMENT, or RESOURCE_EXHAUSTED for the host memory,
// naming what to lower. Pure arithmetic; a training admits its step by it.
absl::Status CheckPlanSize(const PlanSpec& spec);

// The largest world a plan accepts (a sanity bound: a plan of more than
// kMaxRanksPlannedEach ranks dry-runs two of them whatever the size).
inline constexpr int kMaxPlannedWorldSize = 65536;
// Up to this many ranks every rank is planned; beyond, the ranks owning the
// smallest and the largest share of the parameters (their flat pieces,
// core/common/flat_shard.h: rank 0's is the largest), and the last rank.
inline constexpr int kMaxRanksPlannedEach = 8;

// OK when spec.world_size and spec.sharding can be planned: INVALID_ARGUMENT
// naming world_size outside [1, kMaxPlannedWorldSize]. PlanTrainingStep
// checks it too; a caller that
// queues plans calls it first to refuse at once.
absl::Status CheckDataParallelPlan(const PlanSpec& spec);

// "cpu", "cuda".
absl::string_view TargetName(PlanSpec::Target target);
// The inverse; INVALID_ARGUMENT naming the valid values otherwise.
absl::StatusOr<PlanSpec::Target> ParseTarget(absl::string_view name);

struct PhaseCategoryPeak {
  Phase phase = Phase::kIdle;
  Category category = Category::kUnknown;
  int64_t bytes = 0;
};

struct NamedBytes {
  std::string name;
  int64_t bytes = 0;
};

// Where a plan's peak was reached, as plans name it: "setup" when it was
// while the run was set up (MemoryPlan::peak_at_setup), else the phase's
// name (PhaseName).
absl::string_view PeakPhaseName(Phase phase, bool at_setup);

// One rank's part of a data-parallel plan (the one rank of a single
// process's).
struct RankPlan {
  int rank = 0;
  int64_t peak_allocated_bytes = 0;
  Phase peak_phase = Phase::kIdle;
  // The live bytes by category at its peak (index = Category).
  std::array<int64_t, kNumCategories> categories_at_peak{};
  // The trainable parameters (numel) whose update and AdamW state this rank
  // owns: all of them unless sharded.
  int64_t owned_parameter_count = 0;
  // As MemoryPlan::peak_at_setup.
  bool peak_at_setup = false;
};

struct MemoryPlan {
  // The run planned: world_size ranks with `sharding` (none for one process).
  int world_size = 1;
  Sharding sharding = Sharding::kNone;
  // Each planned rank, in rank order: every rank up to kMaxRanksPlannedEach,
  // else those with the smallest and the largest share and the last rank.
  // (Between them, with gradient sharding, an unplanned rank may peak a few
  // percent higher: each rank's peak depends on its share and on when
  // backward produces it.) Every field below
  // is the rank's with the highest peak (the first such): the run fits when
  // that one does.
  std::vector<RankPlan> ranks;
  // The most bytes live at once during the planned step, and when.
  int64_t peak_allocated_bytes = 0;
  Phase peak_phase = Phase::kIdle;
  int64_t peak_step = 0;  // 1 or 2: which of the two steps peaked higher
  // The peak was reached while the run was set up, before its first step
  // began (peak_phase idle, peak_step 1): adapters added, a base cast to
  // bf16, data parallel set up (with full sharding every rank still holds
  // the whole model beside its shards then).
  bool peak_at_setup = false;
  // The live bytes by category at that moment (index = Category); they sum
  // to peak_allocated_bytes.
  std::array<int64_t, kNumCategories> categories_at_peak{};
  // Parameters (a rank's own and those it gathered) + gradients + optimizer
  // state at the peak, and the rest (saved activations and temporaries, and
  // on the CPU the run's in-memory tokens: PlanSpec::data_bytes).
  int64_t model_state_bytes = 0;
  int64_t activation_bytes = 0;
  // Model state after the step (parameters + optimizer state): what stays
  // between steps.
  int64_t resident_between_steps_bytes = 0;
  // Each category's own high-water mark in each phase of the peak step (the
  // marks need not coincide in time). Non-zero entries only.
  std::vector<PhaseCategoryPeak> phase_category_peaks;
  // The largest holders at the peak, largest first (at most 10 each).
  std::vector<NamedBytes> top_modules_at_peak;
  std::vector<NamedBytes> top_ops_at_peak;
  // The verdict, when capacity_bytes was given.
  int64_t capacity_bytes = 0;
  bool fits = true;
  // capacity - peak - offload_in_flight_bytes (negative: short by that much)
  int64_t headroom_bytes = 0;
  // The model's parameters (LlamaModel::NumParameters of the dry run's model).
  int64_t parameter_count = 0;
  // Bytes the offloader would move off the device per micro-batch of the
  // peak step (0 without offloading).
  int64_t offloaded_bytes = 0;
  // What the offloader's copies in flight may add to the peak, estimated:
  // the plan above counts each copy out as done at once (as when the link or
  // disk keeps up with compute); a second dry run holds each copy's source
  // until max_copies_in_flight later copies have started or backward needs
  // it, and this is how much higher its peak is (a real step on a busy CPU
  // has gone past it: docs/known-limits.md). The verdict (fits,
  // headroom_bytes) counts it. 0 without offloading.
  int64_t offload_in_flight_bytes = 0;
  // For a cuda target, the bytes the caching allocator would reserve from
  // the device (torch.cuda.max_memory_reserved), simulated by replaying the
  // dry run's blocks, model creation included, through the allocator's
  // rules (caching_allocator_model.h); 0 for the cpu target, which caches
  // nothing.
  int64_t reserved_bytes = 0;
  // For a cpu target, how much the process's resident set (RSS) grows
  // while the run's tensors are made and used, the model's creation
  // included: each block's HostHeapFootprint (core/common/host_heap.h: whole
  // pages for a large block) at their most, with the copies in flight of
  // offload_in_flight_bytes and the run's in-memory tokens. It holds for a
  // process that keeps its heap near its live bytes, as the daemon does
  // unless --return_host_memory=false (glibc's defaults keep freed blocks
  // and grow the resident set up to several times this). 0 for a cuda
  // target, whose tensors are not on the host.
  int64_t host_rss_bytes = 0;
  // Storages the dry run allocated, and its wall time.
  int64_t allocations = 0;
  double seconds = 0;
};

// Plans one training step of spec.model with spec.train, on each planned
// rank of spec.world_size. INVALID_ARGUMENT for a world_size out of range,
// for training fields a Train would refuse (ValidTrainOptions::Check) or a
// model config LlamaModel::Create refuses, or offload options
// ValidateOffloadOptions refuses, or beyond the size admission above
// (RESOURCE_EXHAUSTED for the host memory); CANCELLED when spec.cancelled
// says so;
// INTERNAL naming the op
// when a kernel has no Meta implementation (the planner's meta_kernels.cc lacks one for
// this LibTorch).
absl::StatusOr<MemoryPlan> PlanTrainingStep(const PlanSpec& spec);

}  // namespace memprofd::plan

#endif  // MEMPROFD_CORE_PLAN_PLANNER_H_
