// The short option strings a request carries: max_shard_size
// (ParseShardSize), the snapshot dtype (ParseSnapshotDtype) and
// attn_implementation (ParseAttentionImplementation). Oracle:
// INVALID_ARGUMENT with a message for bad input; an accepted shard size is
// positive; an accepted name parses again from its canonical spelling.

#include <cstddef>
#include <cstdint>

#include "core/model/config.h"
#include "core/snapshot/shard_plan.h"
#include "core/snapshot/snapshot_options.h"
#include "fuzz/fuzz_util.h"

using memprofd::fuzz::CheckBadInputStatus;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<int64_t> bytes = memprofd::snapshot::ParseShardSize(text);
  if (bytes.ok()) {
    FUZZ_CHECK(*bytes > 0);
    absl::StatusOr<int64_t> plain =
        memprofd::snapshot::ParseShardSize(std::to_string(*bytes));
    FUZZ_CHECK(plain.ok() && *plain == *bytes);
  } else {
    CheckBadInputStatus(bytes.status(), {absl::StatusCode::kInvalidArgument});
  }
  auto dtype = memprofd::snapshot::ParseSnapshotDtype(text);
  if (dtype.ok()) {
    auto again = memprofd::snapshot::ParseSnapshotDtype(
        memprofd::snapshot::SnapshotDtypeName(*dtype));
    FUZZ_CHECK(again.ok() && *again == *dtype);
  } else {
    CheckBadInputStatus(dtype.status(), {absl::StatusCode::kInvalidArgument});
  }
  auto attention = memprofd::ParseAttentionImplementation(text);
  if (attention.ok()) {
    auto again = memprofd::ParseAttentionImplementation(
        memprofd::AttentionImplementationName(*attention));
    FUZZ_CHECK(again.ok() && *again == *attention);
  } else {
    CheckBadInputStatus(attention.status(), {absl::StatusCode::kInvalidArgument});
  }
  return 0;
}
