#ifndef MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_
#define MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_

// Optimizer-state sharding (ZeRO-1) for data parallel: each rank owns a
// contiguous run of the trainable parameters and is the only one that keeps
// AdamW state for them and updates them; the others take the updated values
// from it. Gradients are still all-reduced whole (GradientSync), so the
// gradient norm and clipping see every gradient on every rank; only the
// update and its state are split.
//
// The partition (BalancedOwners): the trainable parameters, each storage
// once (a tied head is the embedding), in model (state-dict) order, are laid
// end to end by numel; rank r owns the parameters whose midpoint falls in
// [r * T / N, (r + 1) * T / N) of the total T. So every rank owns a
// contiguous run, and at most T / N + the largest parameter's numel; a rank
// may own nothing when one parameter is larger than a share.
//
// Invariant, checked by tests/dist: after ShareUpdatedParameters, every
// rank's parameters are bit-identical to an unsharded run's (the same fused
// AdamW arithmetic on the same averaged gradients, by the owner, then copied
// exactly), and the ranks' optimizer state together is exactly the unsharded
// run's, each parameter's on its owner only.
//
// Thread-safety: none; the trainer's owner thread calls everything (its calls
// are collectives, in the same order on every rank). The group and the
// parameters must outlive this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/model_sync.h"
#include "core/dist/process_group.h"

namespace memprofd {

// The owner of each parameter of `numels` (in order) among `ranks` ranks,
// by the rule above: non-decreasing, each in [0, ranks).
std::vector<int> BalancedOwners(const std::vector<int64_t>& numels, int ranks);

class OptimizerSharding {
 public:
  // Partitions the trainable ones among `parameters` (NamedParameters: a tied
  // head is skipped) over the group's ranks and checks, with one all-gather,
  // that the optimizer state each rank holds (Trainer::NamedOptimizerState)
  // suits the partition: none on every rank (a fresh start), or on every
  // rank the state of exactly the parameters it owns (a sharded run going
  // on). FAILED_PRECONDITION naming the rank otherwise: state of parameters
  // the rank does not own (it resumed an unsharded checkpoint or trained
  // unsharded; resuming into a sharded run is not supported yet: start it
  // fresh), or state on some ranks and not on others. The collective's
  // status when a rank fails.
  static absl::StatusOr<std::unique_ptr<OptimizerSharding>> Create(
      ProcessGroup* group, const NamedTensors& parameters,
      const NamedTensors& optimizer_state);
  OptimizerSharding(const OptimizerSharding&) = delete;
  OptimizerSharding& operator=(const OptimizerSharding&) = delete;

  // Drops (sets to none) the gradients of the parameters other ranks own, so
  // that the optimizer update, which skips parameters without a gradient,
  // updates and keeps state for this rank's alone, and their memory is free
  // during it.
  void DropForeignGradients();
  // Broadcasts each parameter from its owner, in model order, in place. Every
  // rank calls it once after each update. The collective's status on failure
  // (UNAVAILABLE or DEADLINE_EXCEEDED within the group's timeout); the ranks'
  // parameters are then unspecified and the run must fail.
  absl::Status ShareUpdatedParameters();

  // The owner of `parameter` (one of the model's trainable parameters, the
  // same tensor), or -1 for a tensor the partition does not hold.
  int OwnerOf(const at::Tensor& parameter) const;

 private:
  OptimizerSharding(ProcessGroup* group, std::vector<at::Tensor> parameters,
                    std::vector<int> owners);

  ProcessGroup* const group_;
  const std::vector<at::Tensor> parameters_;  // trainable, distinct, model order
  const std::vector<int> owners_;             // the owning rank of each
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_
