#ifndef MEMPROFD_CORE_TRAIN_AUTOCAST_H_
#define MEMPROFD_CORE_TRAIN_AUTOCAST_H_

// Mixed precision for the forward passes: LibTorch's autocast (the C++ side
// of torch.autocast), entered and left as a scope.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <memory>

#include "core/train/eval_options.h"

namespace memprofd {

class MetaAutocastScope;

// While alive, ops on `device_type` autocast as torch.autocast(device_type,
// dtype=bfloat16) does (the same op lists: matmuls and linear in bf16,
// reductions, norms and losses in float32); with MixedPrecision::kNo it does
// nothing. Restores the thread's previous autocast state when destroyed and
// clears autocast's cache of casted weights when the outermost scope ends, as
// torch.autocast's __exit__ does, so that no bf16 copy of a weight outlives
// the forward pass (or survives into a later one with stale values).
//
// Autocast state is thread-local: a scope covers the ops of the thread that
// made it. Backward runs outside it, as in PyTorch (gradient checkpointing
// re-enters it for its recomputation). Not copyable; one thread.
//
// On the meta device (a dry run, core/plan) it enters MetaAutocastScope
// instead: the dry run's target device's autocast policy applied to meta
// tensors (meta_autocast.h; EnableMetaAutocast must have succeeded).
class AutocastScope {
 public:
  AutocastScope(MixedPrecision precision, c10::DeviceType device_type);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  const bool active_;
  const c10::DeviceType device_type_;
  std::unique_ptr<MetaAutocastScope> meta_;  // the meta device's
  bool previous_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::ScalarType::Undefined;
};

// Whether the thread's autocast is on for `device_type` (for meta, whether
// MetaAutocastOn); false for another device type autocast has no dispatch
// key for, where asking LibTorch would throw.
bool AutocastOn(c10::DeviceType device_type);

// Drops the thread's cached casts of weights now (meta: the dry run's),
// inside a scope: for a caller that frees weights mid-forward (full
// sharding, after each unit), whose bf16 copies would otherwise stay cached
// until the forward ends. Tensors autograd saved keep their copies.
void ClearAutocastWeightCache(c10::DeviceType device_type);

// The thread's autocast state on `device_type`, as a MixedPrecision: kBf16
// when autocast is on with bfloat16 (what a checkpointed layer saves to
// replay its forward), else kNo.
MixedPrecision CurrentMixedPrecision(c10::DeviceType device_type);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_AUTOCAST_H_
