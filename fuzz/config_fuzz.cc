// LlamaConfig::FromJson on arbitrary text (a Hugging Face config.json given
// to LoadModel). Oracle: INVALID_ARGUMENT only for bad input; an accepted
// config passes Validate(), its parameter count is computed without signed
// overflow (UBSan) and is positive, and ToJson() reads back equal.

#include <cstddef>
#include <cstdint>

#include "core/model/config.h"
#include "fuzz/fuzz_util.h"

using memprofd::LlamaConfig;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<LlamaConfig> config = LlamaConfig::FromJson(text);
  if (!config.ok()) {
    memprofd::fuzz::CheckBadInputStatus(config.status(),
                                        {absl::StatusCode::kInvalidArgument});
    return 0;
  }
  FUZZ_CHECK(config->Validate().ok());
  FUZZ_CHECK(config->NumParameters() > 0);
  absl::StatusOr<LlamaConfig> again = LlamaConfig::FromJson(config->ToJson());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *config);
  return 0;
}
