#include "server/option_flags.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/common/option_status.h"

namespace memprofd {

std::string FlagOfOption(absl::string_view option) {
  static constexpr std::pair<absl::string_view, absl::string_view> kRenamed[] = {
      {"data_roots", "data_root"},
      {"collective_timeout", "collective_timeout_seconds"},
      {"offload.enabled", "offload"},
      {"offload.target", "offload_target"},
      {"offload.prefetch_depth", "offload_prefetch_depth"},
  };
  for (const auto& [field, flag] : kRenamed) {
    if (option == field) return std::string(flag);
  }
  return std::string(absl::StripPrefix(option, "offload."));
}

std::string MessageWithFlag(const absl::Status& status) {
  const std::optional<std::string> option = OptionOf(status);
  if (!option) return std::string(status.message());
  return absl::StrCat(status.message(), " (", *option, " is memprofd's --",
                      FlagOfOption(*option), ")");
}

}  // namespace memprofd
