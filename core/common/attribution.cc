#include "core/common/attribution.h"

#include <deque>
#include <iterator>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"

namespace memprofd {
namespace {

// Indexed by Category. Unsized, so that a Category without its name fails
// the assertion below instead of reading as "".
constexpr absl::string_view kCategoryNames[] = {
    "unknown",           "parameters",  "gradients",           "optimizer_state",
    "saved_activations", "temporaries", "offloaded_host",      "offloaded_disk",
    "snapshot_staging",  "other",       "gathered_parameters", "frozen_parameters"};
static_assert(std::size(kCategoryNames) == kNumCategories,
              "every Category needs its name in kCategoryNames");

// One table of interned names. Reads by id take the mutex too: they happen
// at dump and breakdown time, never per allocation.
class Interner {
 public:
  explicit Interner(absl::string_view overflow) : overflow_(overflow) {
    names_.emplace_back();  // id 0: none
  }

  uint16_t Intern(absl::string_view name) {
    if (name.empty()) return 0;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    if (names_.size() + 1 >= static_cast<size_t>(kMaxInternedNames)) {
      if (overflow_id_ == 0) {
        names_.emplace_back(overflow_);
        overflow_id_ = static_cast<uint16_t>(names_.size() - 1);
      }
      return overflow_id_;
    }
    names_.emplace_back(name);
    const auto id = static_cast<uint16_t>(names_.size() - 1);
    // The key views the deque's string, which never moves.
    ids_.emplace(names_.back(), id);
    return id;
  }

  std::string Name(uint16_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    return id < names_.size() ? names_[id] : std::string();
  }

 private:
  const std::string overflow_;
  std::mutex mu_;
  std::deque<std::string> names_;
  absl::flat_hash_map<absl::string_view, uint16_t> ids_;
  uint16_t overflow_id_ = 0;
};

Interner& Modules() {
  static Interner* const modules = new Interner("(other modules)");
  return *modules;
}

Interner& Ops() {
  static Interner* const ops = new Interner("(other ops)");
  return *ops;
}

}  // namespace

absl::string_view CategoryName(Category category) {
  const auto i = static_cast<size_t>(category);
  return i < static_cast<size_t>(kNumCategories) ? kCategoryNames[i] : "unknown";
}

std::optional<Category> CategoryFromName(absl::string_view name) {
  for (int i = 0; i < kNumCategories; ++i) {
    if (kCategoryNames[i] == name) return static_cast<Category>(i);
  }
  return std::nullopt;
}

Category DefaultCategory(Phase phase) {
  switch (phase) {
    case Phase::kForward:
    case Phase::kBackward:
    case Phase::kOptimizer:
      return Category::kTemporaries;
    default:
      return Category::kOther;
  }
}

absl::string_view ModuleKindName(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kEmbed:
      return "embed";
    case ModuleKind::kAttention:
      return "attention";
    case ModuleKind::kMlp:
      return "mlp";
    case ModuleKind::kNorm:
      return "norm";
    case ModuleKind::kHead:
      return "head";
    case ModuleKind::kOther:
      return "other";
  }
  return "other";
}

ModuleKind ModuleKindOf(absl::string_view path) {
  if (absl::StartsWith(path, "model.embed_tokens")) return ModuleKind::kEmbed;
  if (absl::StartsWith(path, "lm_head")) return ModuleKind::kHead;
  if (absl::StrContains(path, ".self_attn")) return ModuleKind::kAttention;
  if (absl::StrContains(path, ".mlp")) return ModuleKind::kMlp;
  if (absl::StrContains(path, "layernorm") || absl::StartsWith(path, "model.norm")) {
    return ModuleKind::kNorm;
  }
  return ModuleKind::kOther;
}

ModuleId InternModule(absl::string_view path) { return Modules().Intern(path); }
OpId InternOp(absl::string_view name) { return Ops().Intern(name); }
std::string ModuleName(ModuleId id) { return Modules().Name(id); }
std::string OpName(OpId id) { return Ops().Name(id); }

}  // namespace memprofd
