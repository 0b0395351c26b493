#include "core/session/optimizer_shards.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <type_traits>

#include "core/dist/optimizer_sharding.h"
#include "core/model/llama.h"

namespace memprofd {
namespace {

// SessionOptions::sharding, read where the daemon has it: the flag lands in
// SessionOptions separately from the checkpoints that depend on it, and a
// build without the field is a run without sharding.
template <typename Options>
auto ShardingField(const Options& options, int) -> decltype(Sharding(options.sharding)) {
  return options.sharding;
}
template <typename Options>
Sharding ShardingField(const Options&, long) {
  return Sharding::kNone;
}

}  // namespace

Sharding RunSharding(const SessionOptions& options) { return ShardingField(options, 0); }

bool OptimizerStateSharded(const SessionOptions& options) {
  return options.world.world_size > 1 && RunSharding(options) != Sharding::kNone;
}

std::vector<std::pair<std::string, int>> OptimizerOwners(const LlamaModel& model,
                                                         int world_size) {
  // OptimizerSharding::Create's selection: NamedParameters, a tied head (the
  // embedding's storage again) skipped, frozen ones skipped.
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  std::set<const void*> seen;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) continue;
    names.push_back(name);
    numels.push_back(p.numel());
  }
  const std::vector<int> owners = BalancedOwners(numels, world_size);
  std::vector<std::pair<std::string, int>> out;
  for (size_t k = 0; k < names.size(); ++k) out.emplace_back(names[k], owners[k]);
  return out;
}

std::set<std::string> OwnedParameters(const LlamaModel& model, int rank, int world_size) {
  std::set<std::string> owned;
  for (const auto& [name, owner] : OptimizerOwners(model, world_size)) {
    if (owner == rank) owned.insert(name);
  }
  return owned;
}

}  // namespace memprofd
