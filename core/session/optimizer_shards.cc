#include "core/session/optimizer_shards.h"

#include <ATen/ATen.h>

#include <set>

#include "core/model/llama.h"

namespace memprofd {

Sharding RunSharding(const SessionOptions& options) { return options.sharding; }

bool OptimizerStateSharded(const SessionOptions& options) {
  return options.world.world_size > 1 && RunSharding(options) != Sharding::kNone;
}

std::optional<FlatShardSpec> OptimizerShard(const SessionOptions& options) {
  if (!OptimizerStateSharded(options)) return std::nullopt;
  return FlatShardSpec{options.world.rank, options.world.world_size};
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ShardedParameters(
    const LlamaModel& model) {
  // The optimizer's parameters: NamedParameters, a tied head (the
  // embedding's storage again) skipped, frozen ones skipped.
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  std::set<const void*> seen;
  for (const auto& [name, p] : model.NamedParameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) continue;
    out.emplace_back(name, p.sizes().vec());
  }
  return out;
}

}  // namespace memprofd
