#include "core/plan/planner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/flat_shard.h"
#include "core/common/host_heap.h"
#include "core/common/status_macros.h"
#include "core/dist/process_group.h"
#include "core/memory/meta_accounting.h"
#include "core/memory/op_attribution.h"
#include "core/model/llama.h"
#include "core/plan/caching_allocator_model.h"
#include "core/plan/gemm_buffers.h"
#include "core/plan/meta_kernels.h"
#include "core/plan/step_runner.h"

namespace memprofd::plan {
namespace {

constexpr int kTopHolders = 10;

// The dry run's books: live bytes by category, module and op, the peak and
// what was live at it, and each category's high-water mark per phase of each
// step. The meta accounting tells it every storage event; its PhaseDomain
// tells it the steps and phases.
class Ledger final : public memory::MetaAllocationSink, public PhaseListener {
 public:
  // Each block counts as requested; with `cuda`, as the block a model of the
  // CUDA caching allocator hands out for it (rounded up to 512 bytes, or a
  // whole cached block it does not split, as torch.cuda.memory_allocated
  // counts it), the model also giving the reserved bytes.
  explicit Ledger(bool cuda)
      : cuda_(cuda ? std::make_unique<CachingAllocatorModel>() : nullptr) {}

  struct StepPeaks {
    int64_t step = 0;
    int64_t peak = 0;
    Phase peak_phase = Phase::kIdle;
    bool at_setup = false;  // the peak was taken while the run was set up
    std::array<int64_t, kNumCategories> categories_at_peak{};
    std::vector<int64_t> modules_at_peak;  // index = ModuleId
    std::vector<int64_t> ops_at_peak;      // index = OpId
    std::array<std::array<int64_t, kNumCategories>, kNumPhases> phase_category{};
    std::array<int64_t, kNumCategories> categories_at_end{};
  };

  void OnAlloc(int64_t bytes, const Attribution& block, uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++allocations_;
    if (cuda_ != nullptr) {
      // The block the caching allocator hands out, whole when it does not
      // split it.
      const int64_t handed_out = cuda_->Allocate(id, bytes);
      blocks_[id] = handed_out;
      Add(handed_out, block);
      return;
    }
    Add(std::max<int64_t>(bytes, 0), block);
    host_live_ += HostHeapFootprint(bytes);
    host_peak_ = std::max(host_peak_, host_live_);
  }
  void OnFree(int64_t bytes, const Attribution& block, uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (cuda_ != nullptr) {
      cuda_->Free(id);
    } else {
      host_live_ -= HostHeapFootprint(bytes);
    }
    Add(-Counted(bytes, id, /*forget=*/true), block);
  }
  void OnRetag(int64_t bytes, const Attribution& from, const Attribution& to,
               uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = Counted(bytes, id, /*forget=*/false);
    const bool at_peak = in_step_ && live_ == step_.peak;
    Move(bytes, from, to, &categories_, &modules_);
    if (at_peak) {
      // Still the peak's moment: its composition follows the re-tag (an
      // op's output becomes a saved activation as autograd saves it).
      Move(bytes, from, to, &step_.categories_at_peak, &step_.modules_at_peak);
    }
    NotePhaseCategory(to.category);
  }

  // What the run does before a step begins (its adapters added, a base
  // cast to bf16, data parallel set up) counts to that step, as the
  // calibration's measure counts it: from here on, the most bytes live at
  // once become the step's peak when its own stays lower.
  void BeginSetup() {
    std::lock_guard<std::mutex> lock(mu_);
    in_setup_ = true;
    setup_ = StepPeaks();
    TakePeak(&setup_);
  }
  void OnStepBegin(int64_t global_step) override {
    std::lock_guard<std::mutex> lock(mu_);
    in_step_ = true;
    const bool after_setup = in_setup_;
    step_ = after_setup ? setup_ : StepPeaks();
    in_setup_ = false;
    step_.step = global_step;
    phase_ = CurrentPhase();
    if (!after_setup || live_ > step_.peak) TakePeak(&step_);
    for (int c = 0; c < kNumCategories; ++c) NotePhaseCategory(static_cast<Category>(c));
  }
  void OnStepEnd(int64_t /*global_step*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    step_.categories_at_end = categories_;
    steps_.push_back(std::move(step_));
    in_step_ = false;
  }
  void OnPhase(Phase phase) override {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
    for (int c = 0; c < kNumCategories; ++c) NotePhaseCategory(static_cast<Category>(c));
  }

  std::vector<StepPeaks> steps() const {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  int64_t live() const {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  // True once the bytes live at once passed kMaxPlannedBytes (the counts
  // stopped there).
  bool overflowed() const { return overflowed_.load(); }
  int64_t allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }
  // For a CPU target, the most bytes the host heap held resident at once
  // (HostHeapFootprint of each live block), model creation included; 0 for
  // CUDA.
  int64_t host_resident_peak() const {
    std::lock_guard<std::mutex> lock(mu_);
    return host_peak_;
  }
  // The modelled caching allocator's reserved bytes (0 without the model).
  int64_t reserved() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cuda_ != nullptr ? cuda_->reserved_bytes() : 0;
  }

 private:
  // The bytes allocation `id` (of `bytes` requested) counts for, as OnAlloc
  // counted it: its block's with the caching allocator model, else as
  // requested. Called with mu_ held.
  int64_t Counted(int64_t bytes, uint64_t id, bool forget) {
    auto it = blocks_.find(id);
    if (it == blocks_.end()) return std::max<int64_t>(bytes, 0);
    const int64_t counted = it->second;
    if (forget) blocks_.erase(it);
    return counted;
  }
  static void Grow(std::vector<int64_t>* v, size_t index) {
    if (v->size() <= index) v->resize(index + 1, 0);
  }
  // Moves `bytes` from `from`'s cells to `to`'s (module and category; the op
  // stays the one that allocated).
  static void Move(int64_t bytes, const Attribution& from, const Attribution& to,
                   std::array<int64_t, kNumCategories>* categories,
                   std::vector<int64_t>* modules) {
    (*categories)[static_cast<size_t>(from.category)] -= bytes;
    (*categories)[static_cast<size_t>(to.category)] += bytes;
    Grow(modules, std::max(from.module, to.module));
    (*modules)[from.module] -= bytes;
    (*modules)[to.module] += bytes;
  }
  void Add(int64_t bytes, const Attribution& block) {
    int64_t live = 0;
    if (__builtin_add_overflow(live_, bytes, &live) || live > kMaxPlannedBytes) {
      // Counted no further: the dry run stops at its next poll
      // (DryRun), and the plan says why.
      overflowed_.store(true);
      return;
    }
    live_ += bytes;
    categories_[static_cast<size_t>(block.category)] += bytes;
    Grow(&modules_, block.module);
    modules_[block.module] += bytes;
    Grow(&ops_, block.op);
    ops_[block.op] += bytes;
    if (bytes <= 0) return;
    if (in_setup_ && live_ > setup_.peak) TakePeak(&setup_);
    if (!in_step_) return;
    NotePhaseCategory(block.category);
    if (live_ > step_.peak) TakePeak(&step_);
  }
  void TakePeak(StepPeaks* peaks) {
    peaks->peak = live_;
    peaks->peak_phase = phase_;
    peaks->at_setup = in_setup_;
    peaks->categories_at_peak = categories_;
    peaks->modules_at_peak = modules_;
    peaks->ops_at_peak = ops_;
  }
  void NotePhaseCategory(Category category) {
    if (!in_step_) return;
    int64_t& mark =
        step_.phase_category[static_cast<size_t>(phase_)][static_cast<size_t>(category)];
    mark = std::max(mark, categories_[static_cast<size_t>(category)]);
  }

  const std::unique_ptr<CachingAllocatorModel> cuda_;
  std::atomic<bool> overflowed_{false};
  mutable std::mutex mu_;
  // With the model: each live allocation's block bytes, by id.
  std::unordered_map<uint64_t, int64_t> blocks_;
  int64_t live_ = 0;
  // CPU target: the host heap's resident bytes now and at their most.
  int64_t host_live_ = 0;
  int64_t host_peak_ = 0;
  int64_t allocations_ = 0;
  std::array<int64_t, kNumCategories> categories_{};
  std::vector<int64_t> modules_;
  std::vector<int64_t> ops_;
  bool in_step_ = false;
  bool in_setup_ = false;
  Phase phase_ = Phase::kIdle;
  StepPeaks setup_;
  StepPeaks step_;
  std::vector<StepPeaks> steps_;
};

std::vector<NamedBytes> Largest(const std::vector<int64_t>& bytes,
                                std::string (*name_of)(uint16_t), const char* unnamed) {
  std::vector<NamedBytes> out;
  for (size_t id = 0; id < bytes.size(); ++id) {
    if (bytes[id] <= 0) continue;
    std::string name = id == 0 ? unnamed : name_of(static_cast<uint16_t>(id));
    out.push_back({std::move(name), bytes[id]});
  }
  std::sort(out.begin(), out.end(), [](const NamedBytes& a, const NamedBytes& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  if (out.size() > kTopHolders) out.resize(kTopHolders);
  return out;
}

int64_t Sum(const std::array<int64_t, kNumCategories>& c,
            std::initializer_list<Category> of) {
  int64_t total = 0;
  for (Category k : of) total += c[static_cast<size_t>(k)];
  return total;
}

MemoryPlan PlanOf(const Ledger::StepPeaks& s) {
  MemoryPlan plan;
  plan.peak_allocated_bytes = s.peak;
  plan.peak_phase = s.peak_phase;
  plan.peak_at_setup = s.at_setup;
  plan.peak_step = s.step;
  plan.categories_at_peak = s.categories_at_peak;
  plan.model_state_bytes =
      Sum(s.categories_at_peak, {Category::kParameters, Category::kFrozenParameters,
                                 Category::kGatheredParameters, Category::kGradients,
                                 Category::kOptimizerState});
  plan.activation_bytes = plan.peak_allocated_bytes - plan.model_state_bytes;
  plan.resident_between_steps_bytes = Sum(
      s.categories_at_end,
      {Category::kParameters, Category::kFrozenParameters, Category::kOptimizerState});
  for (int p = 0; p < kNumPhases; ++p) {
    for (int c = 0; c < kNumCategories; ++c) {
      const int64_t bytes =
          s.phase_category[static_cast<size_t>(p)][static_cast<size_t>(c)];
      if (bytes > 0) {
        plan.phase_category_peaks.push_back(
            {static_cast<Phase>(p), static_cast<Category>(c), bytes});
      }
    }
  }
  plan.top_modules_at_peak = Largest(s.modules_at_peak, &ModuleName, "(no module)");
  plan.top_ops_at_peak = Largest(s.ops_at_peak, &OpName, "(no op)");
  return plan;
}

}  // namespace

namespace internal {
namespace {

// LibTorch's SDPBackend values, as _fused_sdp_choice returns them.
constexpr int64_t kSdpMath = 0;
constexpr int64_t kSdpFlash = 1;
constexpr int64_t kSdpEfficient = 2;

// The backend `device`'s SDPA picks for this model's heads at `dtype`, asked
// with tiny tensors on that device (the choice depends on head counts, head
// size, dtype and the device, not on batch or length): causal, no mask.
int64_t AskSdpChoice(const LlamaConfig& c, at::ScalarType dtype, c10::Device device) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  const at::Tensor q = at::zeros({1, c.num_attention_heads, 8, c.head_dim()}, options);
  const at::Tensor kv = at::zeros({1, c.num_key_value_heads, 8, c.head_dim()}, options);
  return at::_fused_sdp_choice(
      q, kv, kv, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*scale=*/std::nullopt,
      /*enable_gqa=*/c.num_key_value_heads != c.num_attention_heads);
}

// CUDA's choice without a GPU to ask: SdpaKernelFor's rule.
int64_t CudaSdpRule(const LlamaConfig& c, at::ScalarType dtype) {
  const int64_t d = c.head_dim();
  const bool low_precision = dtype == at::kBFloat16 || dtype == at::kHalf;
  if (low_precision && d <= 256) return kSdpFlash;
  const bool grouped = c.num_key_value_heads != c.num_attention_heads;
  if (!grouped && d % (low_precision ? 8 : 4) == 0) return kSdpEfficient;
  return kSdpMath;
}

}  // namespace

LlamaModel::MetaSdpaKernel SdpaKernelFor(const PlanSpec& spec) {
  const LlamaConfig& c = spec.model;
  if (c.head_dim() <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0) {
    return LlamaModel::MetaSdpaKernel::kMath;
  }
  const at::ScalarType dtype =
      spec.train.mixed_precision == MixedPrecision::kBf16 ? at::kBFloat16 : at::kFloat;
  if (spec.target == PlanSpec::Target::kCpu) {
    return AskSdpChoice(c, at::kFloat, c10::Device(c10::DeviceType::CPU)) == kSdpFlash
               ? LlamaModel::MetaSdpaKernel::kCpuFlash
               : LlamaModel::MetaSdpaKernel::kMath;
  }
  const int64_t choice =
      at::hasCUDA() ? AskSdpChoice(c, dtype, c10::Device(c10::DeviceType::CUDA, 0))
                    : CudaSdpRule(c, dtype);
  switch (choice) {
    case kSdpMath:
      return LlamaModel::MetaSdpaKernel::kMath;
    case kSdpEfficient:
      return LlamaModel::MetaSdpaKernel::kCudaEfficient;
    default:
      return LlamaModel::MetaSdpaKernel::kCudaFlash;
  }
}

}  // namespace internal

absl::string_view PeakPhaseName(Phase phase, bool at_setup) {
  return at_setup ? "setup" : PhaseName(phase);
}

absl::string_view TargetName(PlanSpec::Target target) {
  return target == PlanSpec::Target::kCuda ? "cuda" : "cpu";
}

absl::StatusOr<PlanSpec::Target> ParseTarget(absl::string_view name) {
  if (name == "cpu") return PlanSpec::Target::kCpu;
  if (name == "cuda") return PlanSpec::Target::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("plan: target \"", name, "\" is not a device; use cpu or cuda"));
}

namespace {

// One dry run of rank group->rank() of spec.world_size (group null for one
// process), SDPA as `sdpa`, the offloader's copies completing as
// `meta_copies` says.
// `trainable` gets the numel of each trainable parameter, each storage once,
// in model order (as OptimizerSharding partitions them).
absl::StatusOr<MemoryPlan> DryRun(const PlanSpec& spec, ProcessGroup* group,
                                  LlamaModel::MetaSdpaKernel sdpa,
                                  std::vector<int64_t>* trainable,
                                  offload::MetaCopies meta_copies) {
  std::array<int64_t, internal::kPlannedSteps> moved{};
  int64_t parameters = 0;
  auto ledger = std::make_shared<Ledger>(spec.target == PlanSpec::Target::kCuda);
  PhaseDomain domain;
  domain.listener = ledger.get();
  // The dry run stops at its next poll once the ledger's count overflows.
  PlanSpec run = spec;
  run.cancelled = [&spec, ledger] {
    return ledger->overflowed() || (spec.cancelled && spec.cancelled());
  };
  // This host's bf16 matrix products' own buffers (gemm_buffers.h), probed
  // before the dry run's scopes.
  const std::optional<int64_t> gemm_pad = spec.target == PlanSpec::Target::kCpu
                                              ? internal::HostBf16GemmBufferPad()
                                              : std::nullopt;
  {
    PhaseDomainScope in_domain(&domain);
    memory::MetaAccountingScope accounting(ledger);
    memory::ThreadOpAttribution ops;
    std::optional<internal::Bf16GemmBuffers> gemm_buffers;
    if (gemm_pad.has_value()) gemm_buffers.emplace(*gemm_pad);
    absl::Status ran = internal::RunPlannedSteps(
        run, c10::Device(c10::DeviceType::Meta), group,
        [sdpa, &parameters, trainable](LlamaModel& model) {
          model.set_meta_sdpa_kernel(sdpa);
          parameters = model.NumParameters();
          trainable->clear();
          std::set<const void*> seen;
          for (const auto& [name, p] : model.NamedParameters()) {
            if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) {
              continue;
            }
            trainable->push_back(p.numel());
          }
        },
        [&ledger](int64_t) { ledger->BeginSetup(); },
        [&moved](int64_t step, const offload::OffloadStats& stats) {
          moved[static_cast<size_t>(step - 1)] = stats.bytes_out;
        },
        meta_copies);
    if (ledger->overflowed()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "plan: the step would hold more than ", kMaxPlannedBytes,
          " bytes (4 EiB) at once, beyond what a plan counts and any device holds; lower "
          "batch_size or seq_len, or plan a smaller model"));
    }
    RETURN_IF_ERROR(ran);
  }
  const std::vector<Ledger::StepPeaks> steps = ledger->steps();
  if (steps.empty()) return absl::InternalError("plan: the dry run recorded no step");
  const Ledger::StepPeaks* peak = &steps.front();
  for (const Ledger::StepPeaks& s : steps) {
    if (s.peak >= peak->peak) peak = &s;
  }
  MemoryPlan plan = PlanOf(*peak);
  plan.parameter_count = parameters;
  // Per micro-batch: the dry run ran at most kPlannedMicroBatches of them.
  plan.offloaded_bytes =
      moved[static_cast<size_t>(peak->step - 1)] /
      std::max<int64_t>(1, std::min<int64_t>(spec.train.grad_accumulation_steps,
                                             internal::kPlannedMicroBatches));
  plan.allocations = ledger->allocations();
  plan.reserved_bytes = ledger->reserved();
  plan.host_rss_bytes = ledger->host_resident_peak();
  return plan;
}

// One rank's plan: its dry run with the copies out completing at once and,
// when the step offloads something, a second one with up to
// max_copies_in_flight of them held in flight, whose extra peak is
// offload_in_flight_bytes.
absl::StatusOr<MemoryPlan> PlanRank(const PlanSpec& spec, ProcessGroup* group,
                                    LlamaModel::MetaSdpaKernel sdpa,
                                    std::vector<int64_t>* trainable) {
  ASSIGN_OR_RETURN(MemoryPlan plan,
                   DryRun(spec, group, sdpa, trainable, offload::MetaCopies::kAtOnce));
  if (plan.offloaded_bytes > 0) {
    std::vector<int64_t> unused;
    ASSIGN_OR_RETURN(const MemoryPlan held,
                     DryRun(spec, group, sdpa, &unused, offload::MetaCopies::kInFlight));
    plan.offload_in_flight_bytes =
        std::max<int64_t>(0, held.peak_allocated_bytes - plan.peak_allocated_bytes);
    plan.host_rss_bytes = std::max(plan.host_rss_bytes, held.host_rss_bytes);
    plan.allocations += held.allocations;
  }
  // After the two dry runs are compared: neither holds the data.
  if (spec.target == PlanSpec::Target::kCpu && spec.data_bytes > 0) {
    // The run's in-memory tokens share the CPU's allocator with the step
    // for the whole run (the dry run draws from a synthetic window instead).
    plan.peak_allocated_bytes += spec.data_bytes;
    plan.activation_bytes += spec.data_bytes;  // the rest, beside the model state
    plan.categories_at_peak[static_cast<size_t>(Category::kOther)] += spec.data_bytes;
    plan.host_rss_bytes += HostHeapFootprint(spec.data_bytes);
  }
  return plan;
}

// The numel each of `ranks` ranks owns: its flat piece of every parameter.
std::vector<int64_t> Shares(const std::vector<int64_t>& trainable, int ranks) {
  std::vector<int64_t> shares(static_cast<size_t>(ranks), 0);
  for (int r = 0; r < ranks; ++r) {
    for (int64_t n : trainable)
      shares[static_cast<size_t>(r)] += ChunkOf(n, r, ranks).length;
  }
  return shares;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanTrainingStep(const PlanSpec& spec) {
  const auto start = std::chrono::steady_clock::now();
  if (spec.cancelled && spec.cancelled()) {
    return absl::CancelledError("plan cancelled before its dry run");
  }
  RETURN_IF_ERROR(internal::CheckPlannable(spec));
  RETURN_IF_ERROR(RegisterMetaKernels());
  RETURN_IF_ERROR(memory::InstallMetaAccounting());
  const int world = spec.world_size;
  const bool sharded = world > 1 && spec.sharding != Sharding::kNone;
  std::vector<int64_t> trainable;
  // Rank 0 first: its dry run also gives the parameters to share out.
  // The backend a run on the target uses: Gloo on a CPU, NCCL on CUDA.
  const CollectiveBackend backend = spec.target == PlanSpec::Target::kCuda
                                        ? CollectiveBackend::kNccl
                                        : CollectiveBackend::kGloo;
  std::unique_ptr<ProcessGroup> group =
      world > 1 ? ProcessGroup::ForPlan(0, world, backend) : nullptr;
  // The SDPA kernel the target picks, asked once for every dry run below.
  const LlamaModel::MetaSdpaKernel sdpa = internal::SdpaKernelFor(spec);
  ASSIGN_OR_RETURN(MemoryPlan first, PlanRank(spec, group.get(), sdpa, &trainable));
  int64_t total = 0;
  for (int64_t n : trainable) total += n;
  const std::vector<int64_t> shares =
      sharded ? Shares(trainable, world) : std::vector<int64_t>(world, total);
  std::vector<int> planned;
  if (world <= kMaxRanksPlannedEach) {
    for (int r = 0; r < world; ++r) planned.push_back(r);
  } else {
    // Rank 0 holds the largest share (every piece but the last ranks' is
    // ceil(n / N)); the smallest is one of the last ranks'. And the last
    // rank itself.
    const auto low = std::min_element(shares.begin(), shares.end());
    planned = {0, static_cast<int>(low - shares.begin()), world - 1};
    std::sort(planned.begin(), planned.end());
    planned.erase(std::unique(planned.begin(), planned.end()), planned.end());
  }
  MemoryPlan plan;
  std::vector<RankPlan> ranks;
  int64_t allocations = 0;
  for (int r : planned) {
    MemoryPlan rank_plan;
    if (r == 0) {
      rank_plan = first;
    } else {
      group = ProcessGroup::ForPlan(r, world, backend);
      std::vector<int64_t> unused;
      ASSIGN_OR_RETURN(rank_plan, PlanRank(spec, group.get(), sdpa, &unused));
    }
    allocations += rank_plan.allocations;
    ranks.push_back({r, rank_plan.peak_allocated_bytes, rank_plan.peak_phase,
                     rank_plan.categories_at_peak, shares[static_cast<size_t>(r)],
                     rank_plan.peak_at_setup});
    if (ranks.size() == 1 || rank_plan.peak_allocated_bytes > plan.peak_allocated_bytes) {
      plan = std::move(rank_plan);
    }
  }
  if (planned.front() != 0) allocations += first.allocations;
  plan.world_size = world;
  plan.sharding = world > 1 ? spec.sharding : Sharding::kNone;
  plan.ranks = std::move(ranks);
  plan.allocations = allocations;
  plan.capacity_bytes = spec.capacity_bytes;
  if (spec.capacity_bytes > 0) {
    plan.headroom_bytes =
        spec.capacity_bytes - plan.peak_allocated_bytes - plan.offload_in_flight_bytes;
    plan.fits = plan.headroom_bytes >= 0;
  }
  plan.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace memprofd::plan
