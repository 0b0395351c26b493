#ifndef MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_
#define MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_

// Autocast for the meta device, so that a dry run (core/plan) of a bf16 step
// allocates what the real step on the CPU allocates. LibTorch's autocast does
// not reach meta tensors: it has no dispatch key for them, and its casts
// check that a tensor is on the CPU. This applies the CPU's policy
// (torch.autocast("cpu", dtype=torch.bfloat16)) to meta tensors instead:
//
// - the ops whose CPU autocast kernel runs them in lower precision (linear,
//   matmul, mm, bmm, addmm, baddbmm, scaled_dot_product_attention, the
//   convolutions, ...) get their floating meta arguments cast to bfloat16,
//   and the bfloat16 copy of a float32 weight (a leaf that requires grad, not
//   a view) is cached until the outermost scope ends, as autocast caches it;
// - the promote ops (cat, stack, index_copy) get them cast to the widest
//   floating type among them;
// - every other op with a CPU autocast kernel (the losses, prod, cdist, ...)
//   gets them cast to float32;
// - every other op runs as it is.
//
// Which ops: those with a kernel on DispatchKey::AutocastCPU in this LibTorch,
// read from the dispatcher when first enabled; the lower-precision and
// promote ones are named in meta_autocast.cc, as LibTorch's CPU list names
// them. The kernels sit on DispatchKey::AutocastXLA, which no backend in this
// process uses (checked: no kernel and no fallback there before), included
// in the thread's dispatch keys while a scope is alive.
//
// One more op gets the lower-precision policy: the CPU flash attention a dry
// run calls in place of scaled_dot_product_attention
// (LlamaModel::set_meta_sdpa_kernel), so that it sees what the real SDPA
// would hand its kernel.
//
// Thread-safety: the state is thread-local (as autocast's is); registration
// happens once, under a lock.

#include <c10/core/ScalarType.h>

#include "absl/status/status.h"

namespace at {
class Tensor;
}

namespace memprofd {

// Registers the kernels (once per process). FAILED_PRECONDITION when the
// dispatch key it needs is already used in this process.
absl::Status EnableMetaAutocast();

// While alive (and `active`), this thread's meta ops autocast as above.
// Nested scopes count; the outermost one's end drops the cached casts. Call
// EnableMetaAutocast first: a scope without it throws.
class MetaAutocastScope {
 public:
  explicit MetaAutocastScope(bool active);
  ~MetaAutocastScope();
  MetaAutocastScope(const MetaAutocastScope&) = delete;
  MetaAutocastScope& operator=(const MetaAutocastScope&) = delete;

 private:
  const bool active_;
  bool previous_included_ = false;
  bool previous_excluded_ = true;
};

// Whether this thread's meta ops autocast now.
bool MetaAutocastOn();

// What the lower-precision ops are cast to, and whether a tensor is one the
// casts apply to (a floating meta tensor other than float64).
inline constexpr c10::ScalarType kMetaAutocastDtype = c10::ScalarType::BFloat16;
bool MetaAutocastEligible(const at::Tensor& t);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_
