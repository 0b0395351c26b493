#include "core/plan/planner.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/dist/optimizer_sharding.h"
#include "core/dist/process_group.h"
#include "core/memory/meta_accounting.h"
#include "core/memory/op_attribution.h"
#include "core/model/llama.h"
#include "core/plan/caching_allocator_model.h"
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
  // `granule`: each block counts as its size rounded up to a multiple of it
  // (1: as requested). `cuda`: also replay the blocks through a model of
  // the CUDA caching allocator, for the reserved bytes.
  Ledger(int64_t granule, bool cuda)
      : granule_(granule),
        cuda_(cuda ? std::make_unique<CachingAllocatorModel>() : nullptr) {}

  struct StepPeaks {
    int64_t step = 0;
    int64_t peak = 0;
    Phase peak_phase = Phase::kIdle;
    std::array<int64_t, kNumCategories> categories_at_peak{};
    std::vector<int64_t> modules_at_peak;  // index = ModuleId
    std::vector<int64_t> ops_at_peak;      // index = OpId
    std::array<std::array<int64_t, kNumCategories>, kNumPhases> phase_category{};
    std::array<int64_t, kNumCategories> categories_at_end{};
  };

  void OnAlloc(int64_t bytes, const Attribution& block, uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++allocations_;
    Add(Rounded(bytes), block);
    if (cuda_ != nullptr) cuda_->Allocate(id, bytes);
  }
  void OnFree(int64_t bytes, const Attribution& block, uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Add(-Rounded(bytes), block);
    if (cuda_ != nullptr) cuda_->Free(id);
  }
  void OnRetag(int64_t bytes, const Attribution& from, const Attribution& to) override {
    std::lock_guard<std::mutex> lock(mu_);
    bytes = Rounded(bytes);
    const bool at_peak = in_step_ && live_ == step_.peak;
    Move(bytes, from, to, &categories_, &modules_);
    if (at_peak) {
      // Still the peak's moment: its composition follows the re-tag (an
      // op's output becomes a saved activation as autograd saves it).
      Move(bytes, from, to, &step_.categories_at_peak, &step_.modules_at_peak);
    }
    NotePhaseCategory(to.category);
  }

  void OnStepBegin(int64_t global_step) override {
    std::lock_guard<std::mutex> lock(mu_);
    in_step_ = true;
    step_ = StepPeaks();
    step_.step = global_step;
    phase_ = CurrentPhase();
    TakePeak();
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
  int64_t allocations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }
  // The modelled caching allocator's reserved bytes (0 without the model).
  int64_t reserved() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cuda_ != nullptr ? cuda_->reserved_bytes() : 0;
  }

 private:
  int64_t Rounded(int64_t bytes) const {
    return bytes <= 0 ? 0 : (bytes + granule_ - 1) / granule_ * granule_;
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
    live_ += bytes;
    categories_[static_cast<size_t>(block.category)] += bytes;
    Grow(&modules_, block.module);
    modules_[block.module] += bytes;
    Grow(&ops_, block.op);
    ops_[block.op] += bytes;
    if (!in_step_ || bytes <= 0) return;
    NotePhaseCategory(block.category);
    if (live_ > step_.peak) TakePeak();
  }
  void TakePeak() {
    step_.peak = live_;
    step_.peak_phase = phase_;
    step_.categories_at_peak = categories_;
    step_.modules_at_peak = modules_;
    step_.ops_at_peak = ops_;
  }
  void NotePhaseCategory(Category category) {
    if (!in_step_) return;
    int64_t& mark =
        step_.phase_category[static_cast<size_t>(phase_)][static_cast<size_t>(category)];
    mark = std::max(mark, categories_[static_cast<size_t>(category)]);
  }

  const int64_t granule_;
  const std::unique_ptr<CachingAllocatorModel> cuda_;
  mutable std::mutex mu_;
  int64_t live_ = 0;
  int64_t allocations_ = 0;
  std::array<int64_t, kNumCategories> categories_{};
  std::vector<int64_t> modules_;
  std::vector<int64_t> ops_;
  bool in_step_ = false;
  Phase phase_ = Phase::kIdle;
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
  plan.peak_step = s.step;
  plan.categories_at_peak = s.categories_at_peak;
  plan.model_state_bytes =
      Sum(s.categories_at_peak, {Category::kParameters, Category::kGatheredParameters,
                                 Category::kGradients, Category::kOptimizerState});
  plan.activation_bytes = plan.peak_allocated_bytes - plan.model_state_bytes;
  plan.resident_between_steps_bytes =
      Sum(s.categories_at_end, {Category::kParameters, Category::kOptimizerState});
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

// The SDPA kernel the target would run: on the CPU, the one LibTorch's CPU
// choice picks for this model's heads (asked with tiny CPU tensors: the
// choice depends on head counts, head size and dtype, not on batch or
// length); on CUDA, the math path for now (the CUDA choice and its kernels'
// shapes are not modelled yet).
LlamaModel::MetaSdpaKernel SdpaKernelFor(const PlanSpec& spec) {
  if (spec.target != PlanSpec::Target::kCpu) return LlamaModel::MetaSdpaKernel::kMath;
  const LlamaConfig& c = spec.model;
  const int64_t d = c.head_dim();
  if (d <= 0 || c.num_attention_heads <= 0 || c.num_key_value_heads <= 0) {
    return LlamaModel::MetaSdpaKernel::kMath;
  }
  const at::Tensor q = at::zeros({1, c.num_attention_heads, 8, d});
  const at::Tensor kv = at::zeros({1, c.num_key_value_heads, 8, d});
  const int64_t choice = at::_fused_sdp_choice(
      q, kv, kv, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0,
      /*is_causal=*/true, /*scale=*/std::nullopt,
      /*enable_gqa=*/c.num_key_value_heads != c.num_attention_heads);
  constexpr int64_t kFlashAttention = 1;  // sdp::SDPBackend::flash_attention
  return choice == kFlashAttention ? LlamaModel::MetaSdpaKernel::kCpuFlash
                                   : LlamaModel::MetaSdpaKernel::kMath;
}

}  // namespace

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

// One rank's dry run: rank group->rank() of spec.world_size (group null for
// one process). `trainable` gets the numel of each trainable parameter, each
// storage once, in model order (as OptimizerSharding partitions them).
absl::StatusOr<MemoryPlan> PlanRank(const PlanSpec& spec, ProcessGroup* group,
                                    std::vector<int64_t>* trainable) {
  std::array<int64_t, internal::kPlannedSteps> moved{};
  int64_t parameters = 0;
  // The CUDA caching allocator hands out multiples of 512 bytes (its
  // kMinBlockSize); an empty request takes no block.
  const bool cuda = spec.target == PlanSpec::Target::kCuda;
  auto ledger = std::make_shared<Ledger>(cuda ? 512 : 1, cuda);
  PhaseDomain domain;
  domain.listener = ledger.get();
  {
    PhaseDomainScope in_domain(&domain);
    memory::MetaAccountingScope accounting(ledger);
    memory::ThreadOpAttribution ops;
    const LlamaModel::MetaSdpaKernel sdpa = SdpaKernelFor(spec);
    RETURN_IF_ERROR(internal::RunPlannedSteps(
        spec, c10::Device(c10::DeviceType::Meta), group,
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
        /*before_step=*/{},
        [&moved](int64_t step, const offload::OffloadStats& stats) {
          moved[static_cast<size_t>(step - 1)] = stats.bytes_out;
        }));
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
  return plan;
}

// The numel each of `ranks` ranks owns under BalancedOwners.
std::vector<int64_t> Shares(const std::vector<int64_t>& trainable, int ranks) {
  std::vector<int64_t> shares(static_cast<size_t>(ranks), 0);
  const std::vector<int> owners = BalancedOwners(trainable, ranks);
  for (size_t k = 0; k < trainable.size(); ++k) shares[owners[k]] += trainable[k];
  return shares;
}

}  // namespace

absl::StatusOr<MemoryPlan> PlanTrainingStep(const PlanSpec& spec) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(internal::CheckPlannable(spec));
  RETURN_IF_ERROR(RegisterMetaKernels());
  RETURN_IF_ERROR(memory::InstallMetaAccounting());
  const int world = spec.world_size;
  const bool sharded = world > 1 && spec.sharding != Sharding::kNone;
  std::vector<int64_t> trainable;
  // Rank 0 first: its dry run also gives the parameters to share out.
  std::unique_ptr<ProcessGroup> group =
      world > 1 ? ProcessGroup::ForPlan(0, world) : nullptr;
  ASSIGN_OR_RETURN(MemoryPlan first, PlanRank(spec, group.get(), &trainable));
  int64_t total = 0;
  for (int64_t n : trainable) total += n;
  const std::vector<int64_t> shares =
      sharded ? Shares(trainable, world) : std::vector<int64_t>(world, total);
  std::vector<int> planned;
  if (world <= kMaxRanksPlannedEach) {
    for (int r = 0; r < world; ++r) planned.push_back(r);
  } else {
    const auto [low, high] = std::minmax_element(shares.begin(), shares.end());
    // And the last rank: backward produces its parameters' gradients first,
    // so with gradient sharding it holds its share longest (at 8 ranks of
    // an 8B shape, the last rank peaks highest without the largest share).
    planned = {static_cast<int>(low - shares.begin()),
               static_cast<int>(high - shares.begin()), world - 1};
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
      group = ProcessGroup::ForPlan(r, world);
      std::vector<int64_t> unused;
      ASSIGN_OR_RETURN(rank_plan, PlanRank(spec, group.get(), &unused));
    }
    allocations += rank_plan.allocations;
    ranks.push_back({r, rank_plan.peak_allocated_bytes, rank_plan.peak_phase,
                     rank_plan.categories_at_peak, shares[static_cast<size_t>(r)]});
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
    plan.headroom_bytes = spec.capacity_bytes - plan.peak_allocated_bytes;
    plan.fits = plan.headroom_bytes >= 0;
  }
  plan.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return plan;
}

}  // namespace memprofd::plan
