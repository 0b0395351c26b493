#ifndef MEMPROFD_CORE_SESSION_RANK_MESSAGES_H_
#define MEMPROFD_CORE_SESSION_RANK_MESSAGES_H_

// What the ranks of a data-parallel run write to each other in the run's
// store: the keys and the JSON of each value (the protocol is drawn in
// rank_coordinator.h). RankCoordinator's parts (rank_coordinator.cc: the
// command channel; rank_boundary.cc: step boundaries; rank_memory.cc: the
// ranks' memory) share these; nothing outside the coordinator reads them.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/common/json.h"
#include "core/offload/offload_options.h"
#include "core/session/session_types.h"
#include "core/train/train_options.h"

namespace memprofd::rank_messages {

// How often rank 0 reads what the followers published of their memory.
inline constexpr absl::Duration kRankMemoryPoll = absl::Milliseconds(500);
// How often an idle follower looks for rank 0's next command (one store
// round trip), and how often it publishes its memory.
inline constexpr absl::Duration kCommandPoll = absl::Milliseconds(100);
inline constexpr absl::Duration kMemoryPublishEvery = absl::Seconds(1);
// How long followers wait at a step boundary for rank 0's boundary work: a
// blocking snapshot of a large model takes minutes. Rank 0 dying ends the
// wait at once, since its store goes with it.
inline constexpr absl::Duration kBoundaryWorkTimeout = absl::Minutes(30);
// How long rank 0's Shutdown waits for every follower to read "shutdown".
inline constexpr absl::Duration kReleaseTimeout = absl::Seconds(5);

// The store's keys.
std::string CommandKey(int64_t n);
std::string MemoryKey(int rank);
std::string ByeKey(int rank);
std::string BoundaryEventKey(int64_t boundary, int64_t k);
std::string ShardAnswerKey(int64_t id, int rank);

// A status as a store value, and back: {"code", "error"}.
Json StatusToJson(const absl::Status& status);
absl::Status StatusFromJson(const Json& v);

// Rank 0's commands come from the same binary: a field of the wrong type is
// a bug or a foreign writer, reported as INVALID_ARGUMENT saying so.
absl::Status BadCommand(absl::string_view why);

// A field of a JSON object, or nothing (absent or of another type).
std::optional<int64_t> IntField(const Json& v, absl::string_view key);
std::optional<bool> BoolField(const Json& v, absl::string_view key);
// "" when absent or not a string.
std::string StringField(const Json& v, absl::string_view key);

// A request's offload options (offload_fields.h), each field that is set
// under its name; a target by its name. FromJson: BadCommand for a field of
// the wrong type or an unknown target.
Json OffloadOverridesToJson(const offload::OffloadOverrides& offload);
absl::StatusOr<offload::OffloadOverrides> OffloadOverridesFromJson(const Json& v);

// "cmd/<n>" = {"kind": "train", "options", "offload", "resume"}: a run for
// the followers, with the options rank 0 merged and the request's offload
// fields (each rank merges them over its own flags, since spill directories
// and host limits are a rank's own).
struct TrainCommand {
  TrainOptions train;
  offload::OffloadOverrides offload;
  bool resume = false;
};
std::string EncodeTrainCommand(const TrainCommand& command);
absl::StatusOr<TrainCommand> DecodeTrainCommand(const Json& command);

// "mem/<rank>": a follower's memory, stamped with the time it was published;
// read back with its age. A value that is not a JSON object gives a
// RankMemory with ok = false saying so.
Json RankMemoryToJson(const RankMemory& m);
RankMemory RankMemoryFromJson(int rank, absl::string_view text);

}  // namespace memprofd::rank_messages

#endif  // MEMPROFD_CORE_SESSION_RANK_MESSAGES_H_
