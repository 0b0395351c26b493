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
// Sharded (ShardFlat, every sharded data-parallel level): each parameter's
// slot updates only this rank's flat piece of it (core/common/flat_shard.h),
// through a target: a tensor of its own, 1-D, over the piece's memory (the
// parameter's storage at first; Retarget moves it to a shard kept elsewhere,
// as full sharding keeps its parameters). The target's `.grad` is the
// piece's gradient, its state the piece's moments. AdamW is element-wise, so
// the pieces' updates are bit for bit the whole parameter's.
//
// Thread-safety: none; the trainer's thread only.

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <optional>
#include <vector>

#include "core/common/flat_shard.h"

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

  // One update of every target that has a gradient (the others, as in
  // torch.optim, keep their value and their state). A target's moments are
  // made, zeroed, at its first update. Throws c10::Error like any ATen
  // call; run it inside TorchBoundary.
  void Step();

  // What Step() would make of the targets, without changing anything: the
  // same fused kernel run on copies, at most `chunk_elements` of a target at
  // a time, so that Step() then gives those very values. The extra memory
  // is three chunks, never a second model: by default (0) a chunk is 1/64 of
  // the elements updated, at least 2^16 and at most 2^22 (48 MiB of float32
  // copies for a large model; about 5% of its parameters' bytes for a small
  // one), few enough chunks that a GPU's launches stay cheap. `largest` is the largest
  // |value| any updated target would hold (infinity when one would not be
  // finite), `param` the parameter it belongs to. Meta targets (a plan's dry
  // run) are copied alike, so that a plan counts the copies, and read as 0.
  struct Peek {
    double largest = 0;
    at::Tensor param;  // undefined: no target would be updated
  };
  Peek PeekStep(int64_t chunk_elements = 0) const;

  // Shards every slot (above) for `spec.rank` of `spec.world_size`: the
  // state already made is narrowed to the piece (copied, the rest freed), a
  // slot whose piece is empty keeps none. Once only; later calls with the
  // same spec do nothing, and any other spec is a programming error.
  // Parameters must be contiguous. Throws c10::Error like any ATen call.
  void ShardFlat(const FlatShardSpec& spec);
  const std::optional<FlatShardSpec>& shard() const { return shard_; }
  // Makes `target` (1-D, as many elements as the piece, holding its values)
  // the tensor `param`'s slot updates. False, nothing changed, when `param`
  // is not one of the optimizer's or the sizes differ.
  bool Retarget(const at::Tensor& param, const at::Tensor& target);
  // The tensor updated for `param`: the parameter itself unsharded, its
  // piece's target sharded (an empty tensor for an empty piece); undefined
  // when `param` is not one of the optimizer's.
  at::Tensor TargetOf(const at::Tensor& param) const;

  // The state tensors (both moments of each updated parameter).
  std::vector<at::Tensor> State() const;

  // One parameter's state: its two moments (shaped as the target: the
  // parameter, or its flat piece) and its step count, a float32 scalar on the
  // parameter's device, as
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
  // parameter's device (moments in its dtype, the step in float32). Moments
  // shaped as the whole parameter are narrowed to a sharded slot's piece
  // (how a checkpoint assembled whole resumes at any world size); a slot
  // with an empty piece keeps none. False, and nothing changed, when
  // `param` is not one of the optimizer's or the shapes differ. Throws
  // c10::Error like any ATen call.
  bool SetStateOf(const at::Tensor& param, const ParamState& state);
  // The options of group `group`, and which group holds `param` (-1: none).
  const Options& options(size_t group) const { return groups_.at(group).options; }
  int GroupOf(const at::Tensor& param) const;

 private:
  struct Slot {
    at::Tensor param;
    at::Tensor target;      // what Step updates: `param`, or its piece sharded
    int64_t begin = 0;      // sharded: the piece's first element in `param`
    at::Tensor exp_avg;     // undefined until the first update
    at::Tensor exp_avg_sq;  // undefined until the first update
    at::Tensor step;        // float32 scalar on the parameter's device
  };
  struct Group {
    Options options;
    std::vector<Slot> slots;
  };
  Slot* Find(const at::Tensor& param);
  const Slot* Find(const at::Tensor& param) const;

  std::vector<Group> groups_;
  std::optional<FlatShardSpec> shard_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_ADAMW_H_
