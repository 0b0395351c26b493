#include "core/offload/offload_options.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd::offload {

// OffloadOptions::Tie() lists every field; this fails to compile when one is
// added without joining it (the size is that of the fields Tie() names, on
// the 64-bit Linux ABIs memprofd builds for).
static_assert(
    sizeof(OffloadOptions) == 72,
    "a field was added to OffloadOptions: add it to Tie() and update this size");

absl::string_view TargetName(Target target) {
  switch (target) {
    case Target::kHost:
      return "host";
    case Target::kDisk:
      return "disk";
  }
  return "unknown";
}

absl::string_view SkipReasonName(SkipReason reason) {
  switch (reason) {
    case SkipReason::kParameter:
      return "parameter";
    case SkipReason::kSmall:
      return "small";
    case SkipReason::kWrappedNumber:
      return "wrapped_number";
    case SkipReason::kNoStorage:
      return "no_storage";
    case SkipReason::kOnTarget:
      return "on_target";
    case SkipReason::kExempt:
      return "exempt";
    case SkipReason::kOtherDevice:
      return "other_device";
    case SkipReason::kDisabled:
      return "disabled";
  }
  return "unknown";
}

absl::StatusOr<Target> ParseTarget(absl::string_view name) {
  if (name == "host") return Target::kHost;
  if (name == "disk") return Target::kDisk;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown offload target ", Echo(name), "; use \"host\" or \"disk\""));
}

absl::StatusOr<int> ParsePrefetchDepth(absl::string_view text) {
  if (text == "auto") return kPrefetchAuto;
  int depth = 0;
  if (!absl::SimpleAtoi(text, &depth) || depth < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefetch depth \"", text,
                     "\" is not \"auto\" or a number >= 0 (0 turns the "
                     "backward read-ahead off)"));
  }
  return depth;
}

absl::Status ValidateOffloadOptions(const OffloadOptions& options,
                                    absl::string_view field_prefix) {
  auto bad = [field_prefix](absl::string_view field, absl::string_view rule, auto value) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_prefix, field, ": ", rule, ", got ", value));
  };
  if (options.min_offload_bytes < 0) {
    return bad("min_offload_bytes", "must be >= 0 (0 offloads every tensor)",
               options.min_offload_bytes);
  }
  if (options.max_copies_in_flight < 1) {
    return bad("max_copies_in_flight", "must be >= 1 (copies in flight during forward)",
               options.max_copies_in_flight);
  }
  if (options.prefetch_depth < 0 && options.prefetch_depth != kPrefetchAuto) {
    return bad("prefetch_depth",
               absl::StrCat("must be >= 0 (0 turns the backward read-ahead off) or ",
                            kPrefetchAuto, " (auto)"),
               options.prefetch_depth);
  }
  if (options.host_limit_bytes < 0) {
    return bad("host_limit_bytes", "must be >= 0 (0: no limit)",
               options.host_limit_bytes);
  }
  if (options.spill_dir.empty()) {
    return bad("spill_dir", "must name a directory", "\"\"");
  }
  return absl::OkStatus();
}

absl::StatusOr<OffloadOptions> MergeOffloadOverrides(const OffloadOptions& defaults,
                                                     const OffloadOverrides& request) {
  OffloadOptions merged = defaults;
#define MEMPROFD_OFFLOAD_MERGE_(name, ...) \
  if (request.name) merged.name = *request.name;
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_MERGE_)
#undef MEMPROFD_OFFLOAD_MERGE_
  RETURN_IF_ERROR(ValidateOffloadOptions(merged));
  return merged;
}

void OffloadStats::Add(const OffloadStats& other) {
  tensors_seen += other.tensors_seen;
  tensors_offloaded += other.tensors_offloaded;
  for (size_t i = 0; i < kNumSkipReasons; ++i) skipped[i] += other.skipped[i];
  dedup_hits += other.dedup_hits;
  dedup_bytes_saved += other.dedup_bytes_saved;
  bytes_out += other.bytes_out;
  bytes_in += other.bytes_in;
  bytes_prefetched += other.bytes_prefetched;
  reload_wait_ns += other.reload_wait_ns;
  trl_baseline_bytes_out += other.trl_baseline_bytes_out;
  effective_bytes += other.effective_bytes;
  ineffective_bytes += other.ineffective_bytes;
  peak_resident_saved_bytes =
      std::max(peak_resident_saved_bytes, other.peak_resident_saved_bytes);
  resident_saved_bytes = other.resident_saved_bytes;
  host_bytes_held = other.host_bytes_held;
  disk_bytes_held = other.disk_bytes_held;
}

int64_t OffloadStats::skipped_total() const {
  int64_t total = 0;
  for (const int64_t n : skipped) total += n;
  return total;
}

}  // namespace memprofd::offload
