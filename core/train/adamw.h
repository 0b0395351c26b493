#ifndef MEMPROFD_CORE_TRAIN_ADAMW_H_
#define MEMPROFD_CORE_TRAIN_ADAMW_H_

// AdamW (decoupled weight decay; amsgrad and maximize off) whose update is
// one call of ATen's fused kernel per parameter group and device
// (at::_fused_adamw_: a vectorised loop over every tensor on the CPU, one
// multi-tensor kernel on CUDA), instead of the half-dozen element-wise ops
// per tensor of torch::optim::AdamW. Same equations as torch.optim.AdamW:
// results equal torch::optim::AdamW's within float rounding, and are
// bit-identical from run to run.
//
// Thread-safety: none; the trainer's thread only.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <vector>

namespace memprofd {

class FusedAdamW {
 public:
  struct Options {
    double learning_rate = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
  };

  // One group per entry of `groups`, each with its options.
  FusedAdamW(std::vector<std::vector<at::Tensor>> groups, std::vector<Options> options);

  // Options of group `group` from the next step on; the state is kept.
  void set_options(size_t group, const Options& options);

  // One update of every parameter that has a gradient (the others, as in
  // torch.optim, keep their value and their state). A parameter's moments
  // are made, zeroed, at its first update. Throws c10::Error like any ATen
  // call; run it inside TorchBoundary.
  void Step();

  // The state tensors (both moments of each updated parameter).
  std::vector<at::Tensor> State() const;

 private:
  struct Slot {
    at::Tensor param;
    at::Tensor exp_avg;     // undefined until the first update
    at::Tensor exp_avg_sq;  // undefined until the first update
    at::Tensor step;        // float32 scalar on the parameter's device
  };
  struct Group {
    Options options;
    std::vector<Slot> slots;
  };
  std::vector<Group> groups_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_ADAMW_H_
