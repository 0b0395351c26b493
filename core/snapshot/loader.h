#ifndef MEMPROFD_CORE_SNAPSHOT_LOADER_H_
#define MEMPROFD_CORE_SNAPSHOT_LOADER_H_

// Loads the weights of a Hugging Face style directory (a snapshot, or a
// save_pretrained output) as memory-mapped tensors.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/snapshot/safetensors.h"

namespace memprofd {
namespace snapshot {

struct LoadedWeights {
  std::string directory;
  // Shards in file-name order, tensors in each in file (offset) order. Each
  // tensor views a private copy-on-write mapping of its file (no read until
  // touched; writes never reach the file) and keeps the mapping alive: use
  // them as they are for "disk" placement, or copy them to a device.
  TensorList tensors;
  // config.json's text; empty when the directory has none.
  std::string config_json;
  // The safetensors files read, relative to `directory`.
  std::vector<std::string> files;
  // An adapter directory the daemon wrote (LoadPeftAdapterDirectory): its
  // manifest's fingerprint of the base the adapters trained on; empty
  // without one (peft's own directories).
  std::string lora_base_fingerprint;
};

// Resolves `dir` as transformers does: model.safetensors first; otherwise
// exactly one *.safetensors.index.json, whose weight_map must name existing
// shards inside `dir`, each tensor found in the shard it names, no tensor in
// two shards and none missing from the index. Errors:
// - NOT_FOUND: `dir` missing, or neither model.safetensors nor an index;
// - FAILED_PRECONDITION: several index files (keep one);
// - DATA_LOSS naming the file: a corrupt or truncated safetensors file, a
//   damaged index, a shard missing, a tensor missing or duplicated;
// - INVALID_ARGUMENT: dtypes memprofd does not handle (IsUnsupportedSafetensorsDtype).
// - PERMISSION_DENIED, with `roots`: a file (config.json, an index, a
//   weights file or shard) that leads outside them through a symbolic link;
//   links that stay inside are followed (the Hugging Face cache's
//   snapshots/<revision>/ files link into its blobs/). Nothing of a file
//   outside is read, so no message carries its bytes or size.
// Thread-safe.
absl::StatusOr<LoadedWeights> LoadSafetensorsDirectory(const std::string& dir,
                                                       const PathRoots* roots = nullptr);

// A LoRA adapter directory as peft saves it: adapter_config.json (into
// config_json) and adapter_model.safetensors, read as LoadSafetensorsDirectory
// reads a model's (the same links rule with `roots`), and the daemon's
// manifest when it wrote the directory (lora_base_fingerprint). NOT_FOUND
// naming the file that is missing; DATA_LOSS for a damaged manifest; the
// other errors as above.
absl::StatusOr<LoadedWeights> LoadPeftAdapterDirectory(const std::string& dir,
                                                       const PathRoots* roots = nullptr);

// Whether `dir` holds adapter_config.json: a peft adapter directory, or a
// checkpoint of a LoRA model's adapters (their base is not in it).
bool IsAdapterDirectory(const std::string& dir);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_LOADER_H_
