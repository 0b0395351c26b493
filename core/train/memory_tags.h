#ifndef MEMPROFD_CORE_TRAIN_MEMORY_TAGS_H_
#define MEMPROFD_CORE_TRAIN_MEMORY_TAGS_H_

// Memory attribution of a model's own tensors: its parameters are named
// (each storage attributed to its Hugging Face name, category parameters, or
// frozen_parameters for those that do not train), its buffers are
// "model.rotary_emb" / other, and every trainable parameter gets a gradient
// hook that attributes the gradient AccumulateGrad adopts to the
// parameter's name (category gradients).

#include "core/model/llama.h"

namespace memprofd {

// Call once per model, on the owner thread, after its weights are in place
// (creation, loading, placement), and again once LoRA adapters are added
// (the base is frozen then, so only the adapters get hooks). A second call
// on an unchanged model adds a second set of hooks (harmless, but do not).
// Storages the counting CPU allocator did not make (mapped or CUDA weights)
// are left alone.
void TagModelMemory(const LlamaModel& model);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_MEMORY_TAGS_H_
