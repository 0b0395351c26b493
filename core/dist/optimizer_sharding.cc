#include "core/dist/optimizer_sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <unordered_set>
#include <utility>

#include "core/common/attribution.h"
#include "core/common/flat_shard.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/memory/tagging.h"
#include "core/train/adamw.h"
#include "core/train/trainer.h"

namespace memprofd {

OptimizerSharding::OptimizerSharding(ProcessGroup* group, FusedAdamW* optimizer,
                                     std::vector<at::Tensor> parameters)
    : group_(group), optimizer_(optimizer), parameters_(std::move(parameters)) {}

absl::StatusOr<std::unique_ptr<OptimizerSharding>> OptimizerSharding::Create(
    ProcessGroup* group, Trainer* trainer) {
  RETURN_IF_ERROR(
      trainer->ShardOptimizer(FlatShardSpec{group->rank(), group->world_size()}));
  FusedAdamW* optimizer = nullptr;
  RETURN_IF_ERROR(TorchBoundary("making the sharded optimizer",
                                [&] { optimizer = trainer->optimizer(); }));
  std::vector<at::Tensor> trainable;
  std::unordered_set<const void*> seen;
  for (const at::Tensor& p : trainer->model()->Parameters()) {
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    trainable.push_back(p);
  }
  return std::unique_ptr<OptimizerSharding>(
      new OptimizerSharding(group, optimizer, std::move(trainable)));
}

std::vector<at::Tensor> OptimizerSharding::PieceTargets() const {
  std::vector<at::Tensor> targets;
  targets.reserve(parameters_.size());
  for (const at::Tensor& p : parameters_) targets.push_back(optimizer_->TargetOf(p));
  return targets;
}

void OptimizerSharding::TakePieceGradients() {
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : parameters_) {
    at::Tensor target = optimizer_->TargetOf(p);
    const at::Tensor& grad = p.grad();
    if (grad.defined() && target.numel() > 0) {
      const FlatChunk piece = ChunkOf(p.numel(), group_->rank(), group_->world_size());
      // A copy, so that the whole gradient is freed now, parameter by
      // parameter, as ZeRO-1 frees the others' gradients before its update.
      memory::OwnedByScope scope(p, Category::kGradients);
      target.mutable_grad() =
          grad.reshape({-1}).narrow(0, piece.begin, piece.length).clone();
    }
    p.mutable_grad() = at::Tensor();
  }
}

absl::Status OptimizerSharding::ShareUpdatedParameters() {
  at::NoGradGuard no_grad;
  const int world = group_->world_size();
  for (const at::Tensor& p : parameters_) {
    const FlatChunk piece = ChunkOf(p.numel(), group_->rank(), world);
    const int64_t padded = piece.chunk * world;
    const bool in_place = padded == p.numel();  // the piece is in place already
    at::Tensor flat, whole;
    RETURN_IF_ERROR(TorchBoundary("sharing an updated parameter", [&] {
      flat = p.detach().view({-1});
      if (in_place) {
        whole = flat;
        return;
      }
      memory::OwnedByScope scope(p, Category::kGatheredParameters);
      whole = at::zeros({padded}, p.options());
      whole.narrow(0, piece.begin, piece.length)
          .copy_(flat.narrow(0, piece.begin, piece.length));
    }));
    ASSIGN_OR_RETURN(
        PendingCollective gather,
        group_->StartAllGatherInto(
            whole, whole.narrow(0, piece.chunk * group_->rank(), piece.chunk)));
    RETURN_IF_ERROR(gather.Wait());
    if (!in_place) {
      RETURN_IF_ERROR(TorchBoundary("sharing an updated parameter",
                                    [&] { flat.copy_(whole.narrow(0, 0, p.numel())); }));
    }
  }
  return absl::OkStatus();
}

}  // namespace memprofd
