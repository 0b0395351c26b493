#include "core/model/placement.h"

#include "absl/strings/match.h"

namespace memprofd {

absl::string_view PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kDevice:
      return "device";
    case Placement::kCpu:
      return "cpu";
    case Placement::kDisk:
      return "disk";
  }
  return "unknown";
}

std::string ModuleOfParameter(absl::string_view name) {
  if (absl::StartsWith(name, "model.layers.")) {
    const size_t end = name.find('.', sizeof("model.layers.") - 1);
    return std::string(name.substr(0, end));
  }
  const size_t last = name.rfind('.');
  return std::string(last == absl::string_view::npos ? name : name.substr(0, last));
}

}  // namespace memprofd
