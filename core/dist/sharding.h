#ifndef MEMPROFD_CORE_DIST_SHARDING_H_
#define MEMPROFD_CORE_DIST_SHARDING_H_

// How much of the training state each data-parallel rank keeps: the one
// definition of the levels, their names (the daemon's --sharding, the proto,
// memprofctl, plans) and their parsing. No LibTorch here.
//
//   none       every rank holds the parameters, their gradients and AdamW's
//              state (plain data parallel)
//   optimizer  ZeRO-1: AdamW's state sharded (optimizer_sharding.h)
//   gradients  ZeRO-2: AdamW's state and the gradients sharded
//   full       ZeRO-3: the parameters too
//
// Every rank of a run uses the same level.

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

enum class Sharding {
  kNone,
  kOptimizer,
  kGradients,
  kFull,
};

// "none", "optimizer", "gradients", "full".
absl::string_view ShardingName(Sharding sharding);
// Every level, in increasing savings.
const std::vector<Sharding>& AllShardings();
// The level named `name` (exactly one of ShardingName's); INVALID_ARGUMENT
// naming the accepted values otherwise.
absl::StatusOr<Sharding> ParseSharding(absl::string_view name);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_SHARDING_H_
