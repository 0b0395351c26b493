#ifndef MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_
#define MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_

// Which rank holds which parameter's optimizer state in this daemon's run,
// for the checkpoints it writes and the resumes it makes: the one place the
// session reads the run's sharding level and derives the partition
// OptimizerSharding makes (core/dist/optimizer_sharding.h, BalancedOwners).
// Pure functions; any thread.

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/sharding.h"
#include "core/session/session_types.h"

namespace memprofd {

class LlamaModel;

// The run's sharding level (SessionOptions::sharding, the daemon's --sharding).
Sharding RunSharding(const SessionOptions& options);
// Whether each rank of this run holds the optimizer state of the parameters
// it owns only: a data-parallel run of at least two ranks with a level that
// shards the optimizer state (every level but none).
bool OptimizerStateSharded(const SessionOptions& options);
// The owning rank of each trainable parameter of `model` (each storage once,
// in model order) among `world_size` ranks, as OptimizerSharding::Create
// partitions them.
std::vector<std::pair<std::string, int>> OptimizerOwners(const LlamaModel& model,
                                                         int world_size);
// The names of the parameters `rank` owns among OptimizerOwners.
std::set<std::string> OwnedParameters(const LlamaModel& model, int rank, int world_size);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_OPTIMIZER_SHARDS_H_
