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
#include <optional>
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

  // One parameter's state: its two moments (shaped as the parameter) and its
  // step count, a float32 scalar on the parameter's device, as
  // torch.optim.AdamW(fused=True) keeps it (the kernel reads it for the bias
  // corrections; restoring its exact bits is what makes a resumed run's
  // updates equal the uninterrupted ones).
  struct ParamState {
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
    at::Tensor step;
  };
  // The live state of `param` (matched by identity, not copied); nullopt
  // when it is not one of the optimizer's parameters or has had no update.
  std::optional<ParamState> StateOf(const at::Tensor& param) const;
  // Replaces the state of `param` with copies of `state` made on the
  // parameter's device (moments in its dtype, the step in float32). False,
  // and nothing changed, when `param` is not one of the optimizer's or the
  // shapes differ. Throws c10::Error like any ATen call.
  bool SetStateOf(const at::Tensor& param, const ParamState& state);
  // The options of group `group`, and which group holds `param` (-1: none).
  const Options& options(size_t group) const { return groups_.at(group).options; }
  int GroupOf(const at::Tensor& param) const;

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
