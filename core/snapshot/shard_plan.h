#ifndef MEMPROFD_CORE_SNAPSHOT_SHARD_PLAN_H_
#define MEMPROFD_CORE_SNAPSHOT_SHARD_PLAN_H_

// How a state dict is split into safetensors shards, exactly as
// huggingface_hub's split_torch_state_dict_into_shards does it for
// save_pretrained (REFERENCE.md §2.1). No LibTorch; pure and thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {
namespace snapshot {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";
inline constexpr char kConfigFileName[] = "config.json";
// peft's files of an adapter snapshot.
inline constexpr char kAdapterFilePrefix[] = "adapter_model";
inline constexpr char kAdapterConfigFileName[] = "adapter_config.json";

// transformers v4's save_pretrained default.
inline constexpr int64_t kDefaultMaxShardSize = 5'000'000'000;

// Parses a max_shard_size as huggingface_hub does: a number followed by TB,
// GB, MB or KB (decimal: "5GB" is 5 * 10^9 bytes; case-insensitive; a
// fraction such as "1.5GB" and a space before the unit are allowed), or a
// plain integer number of bytes. INVALID_ARGUMENT for binary units ("5GiB"),
// other units, garbage, zero, negative or overflowing sizes, with what to
// write instead.
absl::StatusOr<int64_t> ParseShardSize(absl::string_view text);

// One tensor of the state dict, in key order.
struct ShardEntry {
  std::string name;
  int64_t bytes = 0;
  // Tensors with the same storage id share storage: counted once, placed in
  // the shard of the first key.
  int64_t storage_id = 0;
};

struct Shard {
  std::string file_name;
  std::vector<std::string> names;  // in placement order
  int64_t bytes = 0;               // unique storage bytes
};

struct ShardPlan {
  // At least one shard (an empty state dict gives one empty shard).
  std::vector<Shard> shards;
  int64_t total_size = 0;                         // unique storage bytes, no headers
  std::map<std::string, std::string> weight_map;  // name -> file name

  bool sharded() const { return shards.size() > 1; }
  // model.safetensors.index.json's text for a sharded plan:
  // {"metadata": {"total_size": N}, "weight_map": {...}} with indent 2 and
  // sorted keys, ending in a newline, as transformers writes it.
  std::string IndexJson() const;
};

// "model-00001-of-00003.safetensors" (1-based `index`); `prefix` replaces
// "model" (a checkpoint's optimizer shards are "optimizer-...").
std::string ShardFileName(int index, int count, absl::string_view prefix = "model");

// Greedy in key order: a tensor larger than max_shard_size (strict >) gets a
// shard of its own at once; otherwise the open shard is closed when the
// tensor would make it exceed the limit. One shard is named
// model.safetensors, several model-0000K-of-0000N.safetensors (`prefix`
// replaces "model").
ShardPlan PlanShards(const std::vector<ShardEntry>& entries, int64_t max_shard_size,
                     absl::string_view prefix = "model");

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_SHARD_PLAN_H_
