// ValidateSessionOptions: the one check of SessionOptions' values. It runs
// nothing of LibTorch, so that the daemon's flag parsing can call it cheaply.

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/common/option_status.h"
#include "core/common/threads.h"
#include "core/common/utf8.h"
#include "core/dist/sharding.h"
#include "core/offload/offload_options.h"
#include "core/session/session_types.h"

namespace memprofd {

namespace {

// The snapshot writer streams every tensor through its staging buffer, in
// pieces of at least this size.
constexpr int64_t kMinSnapshotStagingBytes = 4096;

}  // namespace

absl::Status ValidateSessionOptions(const SessionOptions& options) {
  // Messages read "<field>: <rule>, got <value>", as ValidateOffloadOptions'
  // do, so that a caller can tell which field (session_types.h).
  // Each status is marked as about its field (option_status.h).
  auto bad = [](absl::string_view field, absl::string_view rule, auto value) {
    return OptionError(absl::StatusCode::kInvalidArgument, field,
                       absl::StrCat(field, ": ", rule, ", got ", value));
  };
  if (options.device_memory_limit_bytes < 0) {
    return bad("device_memory_limit", "must be >= 0 bytes (0: no limit)",
               options.device_memory_limit_bytes);
  }
  if (options.keep_last < 0) {
    return bad("keep_last", "must be >= 0 (0 keeps every snapshot)", options.keep_last);
  }
  if (options.snapshot_every_steps < 0) {
    return bad("snapshot_every_steps", "must be >= 0 (0: no periodic snapshots)",
               options.snapshot_every_steps);
  }
  if (options.snapshot_staging_bytes < kMinSnapshotStagingBytes) {
    return bad("snapshot_staging_bytes",
               absl::StrCat("must be >= ", kMinSnapshotStagingBytes),
               options.snapshot_staging_bytes);
  }
  if (!(options.max_plan_time > absl::ZeroDuration())) {
    return bad("max_plan_time", "must be > 0",
               absl::FormatDuration(options.max_plan_time));
  }
  if (!(options.collective_timeout > absl::ZeroDuration())) {
    return bad("collective_timeout", "must be > 0",
               absl::FormatDuration(options.collective_timeout));
  }
  if (absl::Status nice = ValidateNiceIncrement(options.bulk_nice); !nice.ok()) {
    return OptionError(absl::StatusCode::kInvalidArgument, "bulk_nice",
                       absl::StrCat("bulk_nice: ", nice.message()));
  }
  if (options.max_data_file_bytes < 1) {
    return bad("max_data_file_bytes", "must be >= 1", options.max_data_file_bytes);
  }
  if (!options.resume.empty() && options.snapshot_root.empty()) {
    // About snapshot_root: that is what the operator must give.
    return OptionError(
        absl::StatusCode::kInvalidArgument, "snapshot_root",
        absl::StrCat("resume: ", Echo(options.resume),
                     " needs snapshot_root, the directory the checkpoints are in"));
  }
  // Its messages read "offload.<field>: ...".
  absl::Status offload = offload::ValidateOffloadOptions(options.offload, "offload.");
  return AboutOption(offload, offload.message().substr(0, offload.message().find(':')));
}

}  // namespace memprofd
