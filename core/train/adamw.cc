#include "core/train/adamw.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "core/common/attribution.h"
#include "core/memory/tagging.h"

namespace memprofd {

FusedAdamW::FusedAdamW(std::vector<std::vector<at::Tensor>> groups,
                       std::vector<Options> options) {
  TORCH_CHECK(groups.size() == options.size(), "one Options per group");
  for (size_t g = 0; g < groups.size(); ++g) {
    Group group;
    group.options = options[g];
    for (at::Tensor& p : groups[g]) group.slots.push_back(Slot{std::move(p), {}, {}, {}});
    groups_.push_back(std::move(group));
  }
}

void FusedAdamW::set_options(size_t group, const Options& options) {
  groups_.at(group).options = options;
}

void FusedAdamW::Step() {
  torch::NoGradGuard no_grad;
  for (Group& group : groups_) {
    // The fused kernel takes tensors of one device: parameters placed on the
    // CPU while the model computes on a GPU form a call of their own.
    struct Lists {
      std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    };
    std::map<std::string, Lists> by_device;
    for (Slot& s : group.slots) {
      const at::Tensor& grad = s.param.grad();
      if (!grad.defined()) continue;
      if (!s.exp_avg.defined()) {
        // Optimizer state, attributed to the parameter it belongs to.
        const std::optional<Attribution> param = memory::StorageAttribution(s.param);
        ModuleScope module(param ? param->module : 0);
        CategoryScope category(Category::kOptimizerState);
        s.exp_avg = at::zeros_like(s.param, at::MemoryFormat::Preserve);
        s.exp_avg_sq = at::zeros_like(s.param, at::MemoryFormat::Preserve);
        s.step = at::zeros({}, s.param.options().dtype(at::kFloat));
      }
      Lists& l = by_device[s.param.device().str()];
      l.params.push_back(s.param);
      l.grads.push_back(grad);
      l.exp_avgs.push_back(s.exp_avg);
      l.exp_avg_sqs.push_back(s.exp_avg_sq);
      l.steps.push_back(s.step);
    }
    const Options& o = group.options;
    for (auto& [device, l] : by_device) {
      // As torch.optim.AdamW(fused=True): the step counts go up first, the
      // kernel reads them for the bias corrections.
      at::_foreach_add_(l.steps, 1);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs,
                        /*max_exp_avg_sqs=*/{}, l.steps, o.learning_rate, o.beta1,
                        o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                        /*maximize=*/false);
    }
  }
}

std::vector<at::Tensor> FusedAdamW::State() const {
  std::vector<at::Tensor> out;
  for (const Group& group : groups_) {
    for (const Slot& s : group.slots) {
      if (!s.exp_avg.defined()) continue;
      out.push_back(s.exp_avg);
      out.push_back(s.exp_avg_sq);
    }
  }
  return out;
}

std::optional<FusedAdamW::ParamState> FusedAdamW::StateOf(const at::Tensor& param) const {
  for (const Group& group : groups_) {
    for (const Slot& s : group.slots) {
      if (s.param.unsafeGetTensorImpl() != param.unsafeGetTensorImpl()) continue;
      if (!s.exp_avg.defined()) return std::nullopt;
      return ParamState{s.exp_avg, s.exp_avg_sq, s.step};
    }
  }
  return std::nullopt;
}

bool FusedAdamW::SetStateOf(const at::Tensor& param, const ParamState& state) {
  for (Group& group : groups_) {
    for (Slot& s : group.slots) {
      if (s.param.unsafeGetTensorImpl() != param.unsafeGetTensorImpl()) continue;
      if (!state.exp_avg.sizes().equals(s.param.sizes()) ||
          !state.exp_avg_sq.sizes().equals(s.param.sizes()) || state.step.numel() != 1) {
        return false;
      }
      torch::NoGradGuard no_grad;
      at::Tensor exp_avg = at::empty_like(s.param, at::MemoryFormat::Preserve);
      at::Tensor exp_avg_sq = at::empty_like(s.param, at::MemoryFormat::Preserve);
      at::Tensor step = at::empty({}, s.param.options().dtype(at::kFloat));
      exp_avg.copy_(state.exp_avg);
      exp_avg_sq.copy_(state.exp_avg_sq);
      step.copy_(state.step.reshape({}));
      s.exp_avg = std::move(exp_avg);
      s.exp_avg_sq = std::move(exp_avg_sq);
      s.step = std::move(step);
      return true;
    }
  }
  return false;
}

int FusedAdamW::GroupOf(const at::Tensor& param) const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Slot& s : groups_[g].slots) {
      if (s.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) {
        return static_cast<int>(g);
      }
    }
  }
  return -1;
}

}  // namespace memprofd
