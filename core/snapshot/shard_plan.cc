#include "core/snapshot/shard_plan.h"

#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/json.h"

namespace memprofd {
namespace snapshot {
namespace {

absl::Status BadSize(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid max_shard_size \"", absl::CEscape(text), "\": ", why,
      "; write a decimal size such as \"5GB\", \"500MB\", \"100KB\" or \"2TB\" "
      "(decimal units: 1GB = 10^9 bytes), or a plain number of bytes"));
}

}  // namespace

absl::StatusOr<int64_t> ParseShardSize(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  if (s.empty()) return BadSize(text, "it is empty");
  int64_t plain;
  if (absl::SimpleAtoi(s, &plain)) {
    if (plain <= 0) return BadSize(text, "it must be positive");
    return plain;
  }
  if (s.size() < 3) return BadSize(text, "no unit");
  const std::string unit = absl::AsciiStrToUpper(s.substr(s.size() - 2));
  double multiplier = 0;
  if (unit == "TB") {
    multiplier = 1e12;
  } else if (unit == "GB") {
    multiplier = 1e9;
  } else if (unit == "MB") {
    multiplier = 1e6;
  } else if (unit == "KB") {
    multiplier = 1e3;
  } else if (unit == "IB") {
    return BadSize(text,
                   "binary units (KiB, MiB, GiB, TiB) are not accepted by "
                   "huggingface_hub");
  } else {
    return BadSize(text, absl::StrCat("unit \"", absl::CEscape(s.substr(s.size() - 2)),
                                      "\" is not one of TB, GB, MB, KB"));
  }
  const absl::string_view number = absl::StripAsciiWhitespace(s.substr(0, s.size() - 2));
  double value;
  if (number.empty() || number.find_first_not_of("0123456789.eE+-") != number.npos ||
      !absl::SimpleAtod(number, &value) || !std::isfinite(value)) {
    return BadSize(text, absl::StrCat("\"", absl::CEscape(number), "\" is not a number"));
  }
  // huggingface_hub: int(float(value) * multiplier).
  const double bytes = std::trunc(value * multiplier);
  if (bytes <= 0) return BadSize(text, "it must be positive");
  if (bytes >= 9.2e18) return BadSize(text, "it is too large");
  return static_cast<int64_t>(bytes);
}

std::string ShardFileName(int index, int count, absl::string_view prefix) {
  return absl::StrFormat("%s-%05d-of-%05d.safetensors", prefix, index, count);
}

ShardPlan PlanShards(const std::vector<ShardEntry>& entries, int64_t max_shard_size,
                     absl::string_view prefix) {
  // Mirrors huggingface_hub split_state_dict_into_shards_factory.
  ShardPlan plan;
  std::vector<Shard> shards;
  Shard current;
  std::map<int64_t, std::vector<std::string>> shared;  // storage id -> later keys
  std::map<int64_t, std::string> first_key;
  for (const ShardEntry& e : entries) {
    auto [it, inserted] = first_key.emplace(e.storage_id, e.name);
    if (!inserted) {
      shared[e.storage_id].push_back(e.name);
      continue;
    }
    if (e.bytes > max_shard_size) {
      plan.total_size += e.bytes;
      shards.push_back(Shard{"", {e.name}, e.bytes});
      continue;
    }
    if (current.bytes + e.bytes > max_shard_size) {
      shards.push_back(std::move(current));
      current = Shard();
    }
    current.names.push_back(e.name);
    current.bytes += e.bytes;
    plan.total_size += e.bytes;
  }
  if (!current.names.empty() || shards.empty()) shards.push_back(std::move(current));
  for (const auto& [storage_id, keys] : shared) {
    const std::string& first = first_key[storage_id];
    for (Shard& shard : shards) {
      bool found = false;
      for (const std::string& n : shard.names) found = found || n == first;
      if (found) {
        shard.names.insert(shard.names.end(), keys.begin(), keys.end());
        break;
      }
    }
  }
  const int count = static_cast<int>(shards.size());
  for (int i = 0; i < count; ++i) {
    shards[i].file_name = count == 1 ? absl::StrCat(prefix, ".safetensors")
                                     : ShardFileName(i + 1, count, prefix);
    for (const std::string& n : shards[i].names) plan.weight_map[n] = shards[i].file_name;
  }
  plan.shards = std::move(shards);
  return plan;
}

std::string ShardPlan::IndexJson() const {
  // Json objects are written with sorted keys, as transformers writes them.
  const Json index = {{"metadata", {{"total_size", total_size}}},
                      {"weight_map", weight_map}};
  return DumpJson(index, 2) + "\n";
}

}  // namespace snapshot
}  // namespace memprofd
