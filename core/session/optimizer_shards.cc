#include "core/session/optimizer_shards.h"

#include <ATen/ATen.h>

#include <cstdint>

#include "core/dist/optimizer_sharding.h"
#include "core/model/llama.h"

namespace memprofd {

Sharding RunSharding(const SessionOptions& options) { return options.sharding; }

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
