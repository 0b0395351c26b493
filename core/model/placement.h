#ifndef MEMPROFD_CORE_MODEL_PLACEMENT_H_
#define MEMPROFD_CORE_MODEL_PLACEMENT_H_

// Where a module's weights live between forward passes, in the style of
// accelerate's device map. No LibTorch: the server and the session's header
// use it.

#include <string>

#include "absl/strings/string_view.h"

namespace memprofd {

// Modules are "model.embed_tokens", "model.layers.N", "model.norm" and
// "lm_head".
enum class Placement {
  kDevice,  // on the compute device
  kCpu,     // trainable, in host memory; brought to the device for its forward
  kDisk,    // frozen, memory-mapped from a safetensors file, never fully resident
};

// "device", "cpu", "disk".
absl::string_view PlacementName(Placement placement);

// The module a parameter belongs to: "model.layers.3.mlp.up_proj.weight" ->
// "model.layers.3", "lm_head.weight" -> "lm_head".
std::string ModuleOfParameter(absl::string_view parameter_name);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_PLACEMENT_H_
