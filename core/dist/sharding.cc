#include "core/dist/sharding.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace memprofd {

absl::string_view ShardingName(Sharding sharding) {
  switch (sharding) {
    case Sharding::kNone:
      return "none";
    case Sharding::kOptimizer:
      return "optimizer";
    case Sharding::kGradients:
      return "gradients";
    case Sharding::kFull:
      return "full";
  }
  return "unknown";
}

const std::vector<Sharding>& AllShardings() {
  static const std::vector<Sharding>* const all = new std::vector<Sharding>{
      Sharding::kNone, Sharding::kOptimizer, Sharding::kGradients, Sharding::kFull};
  return *all;
}

absl::StatusOr<Sharding> ParseSharding(absl::string_view name) {
  std::vector<absl::string_view> names;
  for (Sharding s : AllShardings()) {
    if (ShardingName(s) == name) return s;
    names.push_back(ShardingName(s));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown sharding \"", name, "\": use one of ", absl::StrJoin(names, ", ")));
}

}  // namespace memprofd
