#ifndef MEMPROFD_SERVER_OPTION_FLAGS_H_
#define MEMPROFD_SERVER_OPTION_FLAGS_H_

// How the operator sets the engine's options: the daemon's flag for each
// SessionOptions field. Core's statuses name an option by its field and mark
// it (core/common/option_status.h); the daemon adds which flag sets it.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// The flag (without "--") that sets SessionOptions field `option`: the
// field's own name, less "offload.", except for the few flags named
// otherwise (data_roots is --data_root, collective_timeout is
// --collective_timeout_seconds, ...).
std::string FlagOfOption(absl::string_view option);

// `status`'s message, followed, when the status is about an option
// (OptionOf), by " (<option> is memprofd's --<flag>)".
std::string MessageWithFlag(const absl::Status& status);

}  // namespace memprofd

#endif  // MEMPROFD_SERVER_OPTION_FLAGS_H_
