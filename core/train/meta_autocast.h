#ifndef MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_
#define MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_

// Autocast for the meta device, so that a dry run (core/plan) of a bf16 step
// allocates what the real step on its target device allocates. LibTorch's
// autocast does not reach meta tensors: it has no dispatch key for them, and
// its casts check the tensor's device. This applies the target's policy
// (torch.autocast("cpu" or "cuda", dtype=torch.bfloat16)) to meta tensors
// instead, on the ops that have an autocast kernel for that device:
//
// - lower-precision ops (CPU: linear, matmul, mm, bmm, addmm, baddbmm,
//   scaled_dot_product_attention, the convolutions, ...; CUDA: the same
//   family and einsum, addmv, ...) get their floating meta arguments cast to
//   bfloat16, and the bfloat16 copy of a float32 weight (a leaf that
//   requires grad, not a view) is cached until the outermost scope ends, as
//   autocast caches it;
// - promote ops (CPU: cat, stack, index_copy; CUDA: addcmul, addcdiv,
//   index_put, ...) get them cast to the widest floating type among them;
// - CUDA's set-opt-dtype ops (softmax, log_softmax, sum, prod, cumsum,
//   linalg_vector_norm, ...) get dtype=float32 when the caller left it unset
//   and their first argument is a floating tensor;
// - every other op with an autocast kernel for the target (CPU: the losses,
//   prod, cdist, ...; CUDA: exp, log, pow, rsqrt, the norms and losses, ...)
//   gets them cast to float32;
// - every other op runs as it is.
//
// Which ops: those with a kernel on DispatchKey::AutocastCPU or AutocastCUDA
// in this LibTorch, read from the dispatcher when first enabled (both are
// registered in a CPU-only build too). CUDA's policies come from LibTorch's
// own lists (the AT_FORALL_* macros of ATen/autocast_mode.h); the CPU's,
// which LibTorch keeps in a .cpp, are named in meta_autocast.cc. The kernels
// sit on DispatchKey::AutocastXLA, which no backend in this process uses
// (checked: no kernel and no fallback there before), included in the
// thread's dispatch keys while a scope is alive.
//
// The stand-ins a dry run calls in place of scaled_dot_product_attention
// (LlamaModel::set_meta_sdpa_kernel) get the lower-precision policy, so that
// they see what the real SDPA would hand its kernel: the CPU's flash
// attention under the CPU target, CUDA's memory-efficient attention under
// the CUDA target (CUDA's flash attention has a CUDA autocast kernel).
//
// Thread-safety: the state (scopes, cache, target) is thread-local, as
// autocast's is; registration happens once, under a lock.

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

// Drops this thread's cached casts now, as the outermost scope's end does.
void ClearMetaAutocastCache();

// Whose autocast policy this thread's meta ops follow.
enum class MetaAutocastTarget { kCpu, kCuda };

// While alive, this thread's meta autocast follows `target`'s policy (the
// CPU's by default). A dry run sets it once, around the whole run: backward
// on the meta device runs on the thread that called it, as on the CPU.
class MetaAutocastTargetScope {
 public:
  explicit MetaAutocastTargetScope(MetaAutocastTarget target);
  ~MetaAutocastTargetScope();
  MetaAutocastTargetScope(const MetaAutocastTargetScope&) = delete;
  MetaAutocastTargetScope& operator=(const MetaAutocastTargetScope&) = delete;

 private:
  const MetaAutocastTarget previous_;
};
MetaAutocastTarget CurrentMetaAutocastTarget();

// Whether this thread's meta ops autocast now.
bool MetaAutocastOn();

// What the lower-precision ops are cast to, and whether a tensor is one the
// casts apply to (a floating meta tensor other than float64).
inline constexpr c10::ScalarType kMetaAutocastDtype = c10::ScalarType::BFloat16;
bool MetaAutocastEligible(const at::Tensor& t);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_META_AUTOCAST_H_
