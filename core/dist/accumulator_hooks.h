#ifndef MEMPROFD_CORE_DIST_ACCUMULATOR_HOOKS_H_
#define MEMPROFD_CORE_DIST_ACCUMULATOR_HOOKS_H_

// A post-hook on each parameter's gradient accumulator (AccumulateGrad): it
// runs once the parameter's .grad is final for this backward, after every
// node that reads the parameter. GradientSync starts its buckets from it,
// ParameterSharding frees a gathered parameter from it.
//
// Thread-safety: the hooks run on the thread running backward; create and
// destroy on the owner thread, outside backward.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace memprofd {

class AccumulatorHooks {
 public:
  // Installs on each of `parameters` (which require grad) a hook calling
  // on_ready(its index in `parameters`).
  AccumulatorHooks(const std::vector<at::Tensor>& parameters,
                   std::function<void(size_t)> on_ready);
  ~AccumulatorHooks();  // removes the hooks
  AccumulatorHooks(const AccumulatorHooks&) = delete;
  AccumulatorHooks& operator=(const AccumulatorHooks&) = delete;

 private:
  class Hook;
  const std::function<void(size_t)> on_ready_;
  // The accumulators the hooks sit on, kept alive (a leaf holds its own only
  // weakly), with the key to remove each hook.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> keys_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_ACCUMULATOR_HOOKS_H_
