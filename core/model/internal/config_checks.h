#ifndef MEMPROFD_CORE_MODEL_INTERNAL_CONFIG_CHECKS_H_
#define MEMPROFD_CORE_MODEL_INTERNAL_CONFIG_CHECKS_H_

// The checks LlamaConfig's reading of config.json (config_json.cc) and its
// Validate (config.cc) share, so that a field is refused with the same words
// wherever it is checked. Private to core/model.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/model/config.h"

namespace memprofd::config_internal {

// INVALID_ARGUMENT: config.json field "<field>" <problem>.
absl::Status FieldError(absl::string_view field, absl::string_view problem);
// FieldError unless value > 0.
absl::Status Positive(absl::string_view field, int64_t value);
// Whether RotaryInverseFrequencies computes rope type `type`.
bool IsSupportedRopeType(absl::string_view type);
// FieldError on num_hidden_layers above the most any real model has (2^20),
// which bounds the per-layer lists a config.json can make the daemon build.
absl::Status LayerCountWithinLimit(int64_t layers);
// The family whose *ForCausalLM class is `architecture`; null for none.
const ModelFamily* FamilyOfArchitecture(absl::string_view architecture);

}  // namespace memprofd::config_internal

#endif  // MEMPROFD_CORE_MODEL_INTERNAL_CONFIG_CHECKS_H_
