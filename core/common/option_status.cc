#include "core/common/option_status.h"

#include <utility>

#include "absl/strings/cord.h"

namespace memprofd {

absl::Status AboutOption(absl::Status status, absl::string_view option) {
  if (!status.ok()) status.SetPayload(kOptionPayloadUrl, absl::Cord(option));
  return status;
}

absl::Status OptionError(absl::StatusCode code, absl::string_view option,
                         absl::string_view message) {
  return AboutOption(absl::Status(code, message), option);
}

std::optional<std::string> OptionOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kOptionPayloadUrl);  // absl::optional
  if (!payload.has_value()) return std::nullopt;
  return std::string(*payload);
}

}  // namespace memprofd
