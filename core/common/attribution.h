#ifndef MEMPROFD_CORE_COMMON_ATTRIBUTION_H_
#define MEMPROFD_CORE_COMMON_ATTRIBUTION_H_

// What every allocation is for and who made it: the module path, the op, the
// category, the phase and the step, known at allocation time. The model's
// forward (and the checkpoint recompute) pushes module scopes, the op
// callbacks of core/memory/op_attribution.h set the op, and the code that
// creates parameters, gradients, optimizer state or snapshot staging pushes a
// category scope. The allocators read CurrentAttribution() once per event: a
// few thread-local loads, no string work. No LibTorch.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/common/phase.h"

namespace memprofd {

// What the bytes hold. Stable numbering: history entries store it.
enum class Category : uint8_t {
  kUnknown = 0,           // not attributed (recorded before attribution existed)
  kParameters = 1,        // model weights (and the model's buffers)
  kGradients = 2,         // .grad of the parameters
  kOptimizerState = 3,    // AdamW moments and step counts
  kSavedActivations = 4,  // storages autograd saved for backward
  kTemporaries = 5,       // anything else allocated inside a training step
  kOffloadedHost = 6,     // offloader copies in host memory
  kOffloadedDisk = 7,     // offloader copies in the spill file (outside allocators)
  kSnapshotStaging = 8,   // snapshot writer buffers and copies
  kOther = 9,             // anything else allocated outside a training step
  // Parameters a fully sharded data-parallel rank gathered from the ranks
  // that own them, held only while a unit of the model runs; a rank's own
  // shards stay kParameters. Model state, like kParameters.
  kGatheredParameters = 10,
  // Parameters that do not train: a LoRA model's frozen base, modules placed
  // on disk. No gradients, no optimizer state. Model state, like
  // kParameters (which then holds the trainable ones: the adapters).
  kFrozenParameters = 11,
};
// A new category is appended (the numbering is stored), named in
// CategoryName and given a field in memory::CategoryBytes.
inline constexpr int kNumCategories = 12;
static_assert(static_cast<int>(Category::kFrozenParameters) + 1 == kNumCategories,
              "kNumCategories must follow the last Category");

// "unknown", "parameters", "gradients", "optimizer_state",
// "saved_activations", "temporaries", "offloaded_host", "offloaded_disk",
// "snapshot_staging", "other", "gathered_parameters", "frozen_parameters".
absl::string_view CategoryName(Category category);
// The inverse of CategoryName; nullopt for any other string.
std::optional<Category> CategoryFromName(absl::string_view name);

// The category of an allocation that no scope claims: temporaries inside a
// training step's forward, backward or optimizer phase, other elsewhere.
Category DefaultCategory(Phase phase);

// The bounded set of module kinds Prometheus labels use (never module paths).
enum class ModuleKind : uint8_t { kEmbed, kAttention, kMlp, kNorm, kHead, kOther };
inline constexpr int kNumModuleKinds = 6;
// "embed", "attention", "mlp", "norm", "head", "other".
absl::string_view ModuleKindName(ModuleKind kind);
// By the Hugging Face names: "model.embed_tokens*" embed, "*.self_attn*"
// attention, "*.mlp*" mlp, "*layernorm*" and "model.norm*" norm, "lm_head*"
// head, everything else (the empty path included) other.
ModuleKind ModuleKindOf(absl::string_view module_path);

// Small ids for module paths and op names, so that an event stays small.
// 0 means none. Interning takes a mutex and hashes the string: do it once per
// module (at model construction) or once per op name, never per allocation.
// Ids are never reused; past kMaxInternedNames the last id stands for
// "(other)".
using ModuleId = uint16_t;
using OpId = uint16_t;
inline constexpr int kMaxInternedNames = 1024;
ModuleId InternModule(absl::string_view path);
OpId InternOp(absl::string_view name);
// The interned string ("" for 0 or an id never handed out). Any thread.
std::string ModuleName(ModuleId id);
std::string OpName(OpId id);

// One allocation's origin. 16 bytes.
struct Attribution {
  int64_t step = 0;
  ModuleId module = 0;
  OpId op = 0;
  Category category = Category::kUnknown;
  Phase phase = Phase::kIdle;
};
static_assert(sizeof(Attribution) == 16, "Attribution must stay 16 bytes");

// The scopes in force on this thread. Not for direct use: the scope classes
// below and the op callbacks set it.
struct ThreadAttribution {
  ModuleId module = 0;
  OpId op = 0;
  // kUnknown: no category scope (DefaultCategory of the phase applies).
  Category category = Category::kUnknown;
};
inline ThreadAttribution& ThisThreadAttribution() {
  thread_local ThreadAttribution current;
  return current;
}

// This thread's module, op and category with the process's phase and step.
// Any thread; a handful of loads.
inline Attribution CurrentAttribution() {
  const ThreadAttribution& t = ThisThreadAttribution();
  const Phase phase = CurrentPhase();
  Attribution a;
  a.step = CurrentStep();
  a.module = t.module;
  a.op = t.op;
  a.category = t.category != Category::kUnknown ? t.category : DefaultCategory(phase);
  a.phase = phase;
  return a;
}

// Sets this thread's module path for its lifetime (the full path's id, as
// InternModule returned it) and restores the previous one after. Not
// thread-safe: create and destroy it on one thread.
class ModuleScope {
 public:
  explicit ModuleScope(ModuleId module) : previous_(ThisThreadAttribution().module) {
    ThisThreadAttribution().module = module;
  }
  ~ModuleScope() { ThisThreadAttribution().module = previous_; }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  const ModuleId previous_;
};

// Sets this thread's category for its lifetime (nests; the innermost wins).
class CategoryScope {
 public:
  explicit CategoryScope(Category category)
      : previous_(ThisThreadAttribution().category) {
    ThisThreadAttribution().category = category;
  }
  ~CategoryScope() { ThisThreadAttribution().category = previous_; }
  CategoryScope(const CategoryScope&) = delete;
  CategoryScope& operator=(const CategoryScope&) = delete;

 private:
  const Category previous_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_ATTRIBUTION_H_
