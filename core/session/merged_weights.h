#ifndef MEMPROFD_CORE_SESSION_MERGED_WEIGHTS_H_
#define MEMPROFD_CORE_SESSION_MERGED_WEIGHTS_H_

// The weights a merged snapshot writes: a LoRA model's state dict with each
// adapter folded into its projection, W + scaling · B·A, as peft's
// merge_and_unload gives them. Nothing is merged up front: the writer reads
// the weights through this access, and each merged projection exists only
// while its bytes are written, so the snapshot holds one projection's worth
// beyond the model (the manifest's peak_gathered_bytes), never a second
// model. The live weights are never touched.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/llama.h"
#include "core/snapshot/writer.h"

namespace memprofd {

class MergedWeights : public snapshot::TensorAccess {
 public:
  // `model` must have adapters and outlive this.
  explicit MergedWeights(const LlamaModel& model);

  // transformers' state dict (NamedBaseParameters's names and order). An
  // adapted projection's entry has the weight's shape and dtype but no
  // bytes until Acquire merges it.
  const std::vector<std::pair<std::string, at::Tensor>>& tensors() const {
    return tensors_;
  }

  // Merges tensors()[index] when it is an adapted projection (its bytes),
  // else 0.
  absl::StatusOr<int64_t> Acquire(size_t index) override;
  void Release(size_t index) override;

 private:
  struct Merge {
    at::Tensor weight;
    LoraPair adapter;
  };
  std::vector<std::pair<std::string, at::Tensor>> tensors_;
  std::vector<std::optional<Merge>> merges_;  // by index in tensors_
  double scaling_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_MERGED_WEIGHTS_H_
