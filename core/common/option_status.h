#ifndef MEMPROFD_CORE_COMMON_OPTION_STATUS_H_
#define MEMPROFD_CORE_COMMON_OPTION_STATUS_H_

// Statuses about one of the engine's options (a SessionOptions field, such as
// snapshot_root or peak_file).
//
// Core names options by their field, never by how a program sets them: the
// daemon sets them with flags, a test or an embedding program in code. A
// status about an option carries the field's name as a payload, so that the
// program that owns the options can add how to set it (the daemon's server
// adds "snapshot_root is memprofd's --snapshot_root": server/option_flags.h).
// Messages stay complete without it.

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// The payload's type URL; its value is the option's field name.
inline constexpr char kOptionPayloadUrl[] = "type.memprofd/option";

// `status` (code and message unchanged) marked as about `option`. OK stays OK.
absl::Status AboutOption(absl::Status status, absl::string_view option);

// A new status of `code` and `message`, about `option`.
absl::Status OptionError(absl::StatusCode code, absl::string_view option,
                         absl::string_view message);

// The option `status` is about, if it is marked.
std::optional<std::string> OptionOf(const absl::Status& status);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_OPTION_STATUS_H_
