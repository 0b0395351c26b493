#ifndef MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_
#define MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_

// Optimizer-state sharding for data parallel, the part every sharded level
// shares: each rank keeps AdamW's state for, and updates, its flat piece of
// every trainable parameter (core/common/flat_shard.h: equal chunks of
// ceil(n / N) elements rounded up to 16, the last ones shorter or empty),
// through the trainer's sharded optimizer (FusedAdamW::ShardFlat).
//
//   optimizer (ZeRO-1)  gradients are still all-reduced whole (GradientSync);
//                       TakePieceGradients gives each piece its part of the
//                       averaged gradient; after the update,
//                       ShareUpdatedParameters all-gathers each parameter
//                       from the ranks' pieces (c10d all_gather_into_tensor,
//                       the pieces padded to equal chunks).
//   gradients (ZeRO-2)  GradientSync reduce-scatters the pieces' gradients
//                       straight to them; the parameters are shared as above.
//   full (ZeRO-3)       the pieces live in ParameterSharding's shards and are
//                       the only copy: nothing to share.
//
// The gradient norm is then a sum over every rank's pieces
// (DataParallel::CombineGradNorm), and clipping scales the pieces.
//
// Invariant, checked by tests/dist: after ShareUpdatedParameters, every
// rank's parameters are bit-identical to an unsharded run's given the same
// gradients (AdamW is element-wise, so updating pieces is updating the
// whole), and the ranks' optimizer state laid end to end is exactly the
// unsharded run's.
//
// Thread-safety: none; the trainer's owner thread calls everything (its calls
// are collectives, in the same order on every rank). The group and the
// trainer must outlive this.

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

namespace memprofd {

class FusedAdamW;
class Trainer;

class OptimizerSharding {
 public:
  // Shards `trainer`'s optimizer for the group's rank (Trainer::ShardOptimizer;
  // the state it holds, of an unsharded run or a restored checkpoint, is
  // narrowed to the pieces). The optimizer is made if there is none. The
  // trainer's status on failure.
  static absl::StatusOr<std::unique_ptr<OptimizerSharding>> Create(ProcessGroup* group,
                                                                   Trainer* trainer);
  OptimizerSharding(const OptimizerSharding&) = delete;
  OptimizerSharding& operator=(const OptimizerSharding&) = delete;

  // The trainable parameters (each storage once, model order) and, aligned,
  // the optimizer's target for each: this rank's piece (empty when it owns
  // no element of it).
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  std::vector<at::Tensor> PieceTargets() const;

  // ZeRO-1, after the gradients are averaged whole: each piece's gradient
  // becomes a copy of its part of the parameter's, and the parameter's
  // `.grad` is dropped (freed), so the norm, clipping and the update see the
  // pieces alone, and the update runs beside 1/N of the gradients.
  void TakePieceGradients();
  // All-gathers each parameter from the ranks' pieces, in model order, in
  // place; a parameter whose size the ranks do not divide travels through a
  // padded buffer of its size rounded up (the most extra memory held). Every
  // rank calls it once after each update. The collective's status on failure
  // (UNAVAILABLE or DEADLINE_EXCEEDED within the group's timeout); the ranks'
  // parameters are then unspecified and the run must fail.
  absl::Status ShareUpdatedParameters();

 private:
  OptimizerSharding(ProcessGroup* group, FusedAdamW* optimizer,
                    std::vector<at::Tensor> parameters);

  ProcessGroup* const group_;
  FusedAdamW* const optimizer_;               // the trainer's
  const std::vector<at::Tensor> parameters_;  // trainable, distinct, model order
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_OPTIMIZER_SHARDING_H_
