#include "core/dist/optimizer_sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"

namespace memprofd {

std::vector<int> BalancedOwners(const std::vector<int64_t>& numels, int ranks) {
  int64_t total = 0;
  for (int64_t n : numels) total += n;
  std::vector<int> owners;
  owners.reserve(numels.size());
  int64_t start = 0;
  for (int64_t n : numels) {
    // The midpoint start + n / 2 lies in share floor(midpoint * ranks / total);
    // doubled to stay in integers.
    const int64_t owner = total > 0 ? (2 * start + n) * ranks / (2 * total) : 0;
    owners.push_back(static_cast<int>(std::min<int64_t>(owner, ranks - 1)));
    start += n;
  }
  return owners;
}

OptimizerSharding::OptimizerSharding(ProcessGroup* group,
                                     std::vector<at::Tensor> parameters,
                                     std::vector<int> owners)
    : group_(group), parameters_(std::move(parameters)), owners_(std::move(owners)) {}

absl::StatusOr<std::unique_ptr<OptimizerSharding>> OptimizerSharding::Create(
    ProcessGroup* group, const NamedTensors& parameters,
    const NamedTensors& optimizer_state) {
  std::vector<std::string> names;
  std::vector<at::Tensor> trainable;
  std::vector<int64_t> numels;
  std::set<const void*> seen;
  for (const auto& [name, p] : parameters) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second || !p.requires_grad()) continue;
    names.push_back(name);
    trainable.push_back(p);
    numels.push_back(p.numel());
  }
  std::vector<int> owners = BalancedOwners(numels, group->world_size());

  // This rank's state against its share: [state of parameters others own,
  // owned parameters with state, owned parameters], gathered from every rank.
  std::set<std::string> owned;
  for (size_t k = 0; k < names.size(); ++k) {
    if (owners[k] == group->rank()) owned.insert(names[k]);
  }
  // One "<parameter>.exp_avg" per parameter with state (NamedOptimizerState).
  constexpr absl::string_view kMoment = ".exp_avg";
  int64_t foreign = 0, with_state = 0;
  for (const auto& [name, tensor] : optimizer_state) {
    if (!absl::EndsWith(name, kMoment)) continue;
    (owned.count(name.substr(0, name.size() - kMoment.size())) ? with_state : foreign) +=
        1;
  }
  // A plan's dry run (meta parameters, ProcessGroup::ForPlan) keeps the
  // counts on the CPU, where the plan's all-gather gives every rank this
  // rank's: the check below then applies to this rank's own state.
  const at::Device device = trainable.empty() || trainable[0].is_meta()
                                ? at::Device(at::kCPU)
                                : trainable[0].device();
  at::Tensor counts;
  RETURN_IF_ERROR(TorchBoundary("the optimizer-sharding check", [&] {
    counts =
        at::tensor({foreign, with_state, static_cast<int64_t>(owned.size())}, at::kLong)
            .to(device);
  }));
  ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group->AllGather(counts));
  bool any_state = false;
  for (at::Tensor& t : all) {
    t = t.cpu();
    any_state = any_state || t[1].item<int64_t>() > 0;
  }
  for (int r = 0; r < group->world_size(); ++r) {
    const int64_t* c = all[r].const_data_ptr<int64_t>();
    if (c[0] > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " holds AdamW state for ", c[0],
          " parameters that other ranks own under optimizer sharding: it resumed an "
          "unsharded checkpoint or trained unsharded, and resuming into a sharded run "
          "is not supported yet; start the sharded run without resume"));
    }
    if (any_state && c[1] != c[2]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " holds AdamW state for ", c[1], " of the ", c[2],
          " parameters it owns while another rank has trained: every rank must go on "
          "from the same sharded run, or all start fresh"));
    }
  }
  return std::unique_ptr<OptimizerSharding>(
      new OptimizerSharding(group, std::move(trainable), std::move(owners)));
}

void OptimizerSharding::DropForeignGradients() {
  for (size_t k = 0; k < parameters_.size(); ++k) {
    if (owners_[k] != group_->rank()) parameters_[k].mutable_grad() = at::Tensor();
  }
}

int OptimizerSharding::OwnerOf(const at::Tensor& parameter) const {
  for (size_t k = 0; k < parameters_.size(); ++k) {
    if (parameters_[k].unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) {
      return owners_[k];
    }
  }
  return -1;
}

absl::Status OptimizerSharding::ShareUpdatedParameters() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < parameters_.size(); ++k) {
    RETURN_IF_ERROR(group_->Broadcast(parameters_[k].detach(), owners_[k]));
  }
  return absl::OkStatus();
}

}  // namespace memprofd
