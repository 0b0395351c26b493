#include "server/option_flags.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/common/option_status.h"
#include "core/offload/offload_fields.h"

namespace memprofd {

std::string FlagOfOption(absl::string_view option) {
  static constexpr std::pair<absl::string_view, absl::string_view> kRenamed[] = {
      {"data_roots", "data_root"},
      {"collective_timeout", "collective_timeout_seconds"},
      {"max_plan_time", "max_plan_seconds"},
  };
  for (const auto& [field, flag] : kRenamed) {
    if (option == field) return std::string(flag);
  }
  // A request's offload fields: their daemon flags (offload_fields.h).
#define MEMPROFD_OFFLOAD_FLAG_OF_(name, type, cli_flag, daemon_flag) \
  if (option == "offload." #name) return #daemon_flag;
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_FLAG_OF_)
#undef MEMPROFD_OFFLOAD_FLAG_OF_
  return std::string(absl::StripPrefix(option, "offload."));
}

std::string MessageWithFlag(const absl::Status& status) {
  const std::optional<std::string> option = OptionOf(status);
  if (!option) return std::string(status.message());
  return absl::StrCat(status.message(), " (", *option, " is memprofd's --",
                      FlagOfOption(*option), ")");
}

}  // namespace memprofd
