#include "core/dist/model_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdint>
#include <functional>

#include "absl/strings/str_cat.h"
#include "core/common/fnv1a.h"
#include "core/common/status_macros.h"

namespace memprofd {
namespace {

// FNV-1a over the names, shapes and dtypes: equal on two ranks when their
// models have the same structure (a collision between different models is
// 2^-63 unlikely).
int64_t Fingerprint(const NamedTensors& parameters) {
  uint64_t hash = kFnv1aOffsetBasis;
  auto mix = [&](const std::string& text) { Fnv1a(text.data(), text.size(), &hash); };
  for (const auto& [name, tensor] : parameters) {
    mix(name);
    for (int64_t size : tensor.sizes()) mix(absl::StrCat(":", size));
    mix(absl::StrCat("/", c10::toString(tensor.scalar_type()), ";"));
  }
  return static_cast<int64_t>(hash >> 1);
}

// Checks every rank holds tensors of the same names, shapes and dtypes, then
// broadcasts rank 0's. `mismatch(r, theirs, ours)` words the error when rank
// r's differ (counts of tensors).
template <typename Mismatch>
absl::Status TakeRankZeroTensors(ProcessGroup& group, const NamedTensors& tensors,
                                 Mismatch mismatch) {
  at::Tensor mine =
      at::tensor({Fingerprint(tensors), static_cast<int64_t>(tensors.size())}, at::kLong);
  ASSIGN_OR_RETURN(std::vector<at::Tensor> all, group.AllGather(mine));
  for (int r = 1; r < group.world_size(); ++r) {
    if (!at::equal(all[r], all[0])) {
      return mismatch(r, all[r][1].item<int64_t>(), all[0][1].item<int64_t>());
    }
  }
  at::NoGradGuard no_grad;
  for (const auto& [name, tensor] : tensors) {
    // Broadcast in place needs a dense tensor; parameters and optimizer
    // state are.
    RETURN_IF_ERROR(group.Broadcast(tensor.detach(), 0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TakeRankZeroParameters(ProcessGroup& group, const NamedTensors& parameters) {
  return TakeRankZeroTensors(group, parameters, [](int r, int64_t theirs, int64_t ours) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", r, " holds another model than rank 0 (", theirs, " parameters against ",
        ours,
        ", or other names or shapes): start every rank with the same model config"));
  });
}

absl::Status TakeRankZeroOptimizerState(ProcessGroup& group, const NamedTensors& state) {
  return TakeRankZeroTensors(group, state, [](int r, int64_t theirs, int64_t ours) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", r, " holds other optimizer state than rank 0 (", theirs,
                     " tensors against ", ours,
                     "): every rank must resume from the same checkpoint, or none"));
  });
}

absl::StatusOr<double> ParameterDrift(ProcessGroup& group,
                                      const NamedTensors& parameters) {
  at::NoGradGuard no_grad;
  double sum = 0;
  for (const auto& [name, tensor] : parameters) {
    sum += tensor.detach().to(at::kDouble).sum().item<double>();
  }
  ASSIGN_OR_RETURN(std::vector<at::Tensor> all,
                   group.AllGather(at::tensor({sum}, at::kDouble)));
  double low = all[0].item<double>(), high = low;
  for (const at::Tensor& t : all) {
    low = std::min(low, t.item<double>());
    high = std::max(high, t.item<double>());
  }
  return high - low;
}

}  // namespace memprofd
