#ifndef MEMPROFD_CORE_TRAIN_CHECKPOINT_H_
#define MEMPROFD_CORE_TRAIN_CHECKPOINT_H_

// Gradient checkpointing of one decoder layer.

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "core/model/llama.h"

namespace memprofd {

// Runs decoder layer `index` of `model` on `hidden` like model.Layer(index,
// hidden), as one custom autograd function: the forward runs without
// recording a graph and saves only `hidden` (through save_for_backward, so
// saved-tensor hooks such as the activation offloader see it); the backward
// recomputes the layer with grad enabled (under the bf16 autocast the
// forward ran in, if any) and backpropagates through the recomputation, to
// `hidden` and to the layer's parameters. The gradients equal those of the
// plain layer (the same operations run in the same order).
//
// `model` must outlive the backward pass. Throws c10::Error like the model's
// forward functions. Owner thread only.
at::Tensor CheckpointedLayer(const LlamaModel& model, int64_t index,
                             const at::Tensor& hidden);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_CHECKPOINT_H_
