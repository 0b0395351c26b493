#ifndef MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_
#define MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_

// How this daemon's run splits the optimizer state, for the checkpoints it
// writes and the resumes it makes: the one place the session reads the run's
// sharding level. A sharded run's ranks each keep the state of their flat
// piece of every trainable parameter (core/common/flat_shard.h). Pure
// functions; any thread.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/common/flat_shard.h"
#include "core/dist/sharding.h"
#include "core/session/session_types.h"

namespace memprofd {

class LlamaModel;

// The run's sharding level (SessionOptions::sharding, the daemon's --sharding).
Sharding RunSharding(const SessionOptions& options);
// Whether each rank of this run holds the optimizer state of its pieces
// only: a data-parallel run of at least two ranks with a level that shards
// the optimizer state (every level but none).
bool OptimizerStateSharded(const SessionOptions& options);
// This rank's place in the partition when OptimizerStateSharded, else none.
std::optional<FlatShardSpec> OptimizerShard(const SessionOptions& options);
// The name and shape of each trainable parameter of `model` (each storage
// once, in model order): what a sharded checkpoint's description records.
std::vector<std::pair<std::string, std::vector<int64_t>>> ShardedParameters(
    const LlamaModel& model);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_
