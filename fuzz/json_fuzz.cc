// ParseJson, memprofd's one strict JSON reader (config.json, safetensors
// headers and indexes, manifests), and DumpJson. Oracle: INVALID_ARGUMENT
// "invalid JSON at byte N" with N within the text for bad input, no escaped
// nlohmann exception; an accepted value dumps (compact and indented) to text
// that parses back to the same value.

#include <cstddef>
#include <cstdint>

#include "absl/strings/match.h"
#include "core/common/json.h"
#include "fuzz/fuzz_util.h"

using memprofd::DumpJson;
using memprofd::Json;
using memprofd::ParseJson;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Json> value = ParseJson(text, /*max_depth=*/16);
  if (!value.ok()) {
    memprofd::fuzz::CheckBadInputStatus(value.status(),
                                        {absl::StatusCode::kInvalidArgument});
    FUZZ_CHECK(absl::StartsWith(value.status().message(), "invalid JSON at byte "));
    return 0;
  }
  for (int indent : {-1, 2}) {
    const std::string dumped = DumpJson(*value, indent);
    absl::StatusOr<Json> back = ParseJson(dumped, 16);
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(DumpJson(*back, indent) == dumped);
  }
  return 0;
}
