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
//
// What a rank owns at every level but none: a flat, equal, padded shard of
// each trainable parameter, as FSDP2 and DeepSpeed's ZeRO lay them out. A
// parameter of n elements, read flat in its (contiguous) memory order, is cut
// into world_size chunks of c = ceil(n / world_size) elements (rounded up to
// a multiple of 16); rank r owns
// the elements [r * c, min((r + 1) * c, n)), so the last ranks' pieces may be
// shorter or empty, and each rank's shard is padded with zeros to c for the
// collectives (all-gather and reduce-scatter move world_size equal chunks).
// AdamW's state, the averaged gradients (from gradients on) and the
// parameters themselves (full) are then each rank's piece of every
// parameter: no rank holds more than 1 / world_size of the model plus 16
// elements per parameter (the chunks are aligned; rank 0 holds the most,
// the last ranks' pieces may run short or empty). The rule:
// core/common/flat_shard.h.

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
