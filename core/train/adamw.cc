#include "core/train/adamw.h"

#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
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
    for (at::Tensor& p : groups[g]) {
      Slot slot;
      slot.target = p;
      slot.param = std::move(p);
      group.slots.push_back(std::move(slot));
    }
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
      const at::Tensor& grad = s.target.grad();
      if (!grad.defined() || s.target.numel() == 0) continue;
      if (!s.exp_avg.defined()) {
        // Optimizer state, attributed to the parameter it belongs to.
        memory::OwnedByScope scope(s.param, Category::kOptimizerState);
        s.exp_avg = at::zeros_like(s.target, at::MemoryFormat::Preserve);
        s.exp_avg_sq = at::zeros_like(s.target, at::MemoryFormat::Preserve);
        s.step = at::zeros({}, s.param.options().dtype(at::kFloat));
      }
      Lists& l = by_device[s.target.device().str()];
      l.params.push_back(s.target);
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

FusedAdamW::Peek FusedAdamW::PeekStep(int64_t chunk_elements) const {
  torch::NoGradGuard no_grad;
  if (chunk_elements <= 0) {
    int64_t updated = 0;
    for (const Group& group : groups_) {
      for (const Slot& s : group.slots) {
        if (s.target.grad().defined()) updated += s.target.numel();
      }
    }
    chunk_elements =
        std::clamp<int64_t>(updated / 64, int64_t{1} << 16, int64_t{1} << 22);
  }
  // Each chunk's largest |value|, as a tensor on its device: one copy to the
  // host at the end, not a synchronisation per chunk.
  std::vector<at::Tensor> largest;
  std::vector<const Slot*> of;
  for (const Group& group : groups_) {
    const Options& o = group.options;
    for (const Slot& s : group.slots) {
      const at::Tensor& grad = s.target.grad();
      const int64_t n = s.target.numel();
      if (!grad.defined() || n == 0) continue;
      const at::Tensor p = s.target.reshape({-1});
      const at::Tensor g = grad.reshape({-1});
      const at::Tensor step = s.step.defined()
                                  ? s.step + 1
                                  : at::ones({}, s.param.options().dtype(at::kFloat));
      for (int64_t begin = 0; begin < n; begin += chunk_elements) {
        const int64_t length = std::min(chunk_elements, n - begin);
        auto copy = [&](const at::Tensor& t) {
          return t.defined() ? t.reshape({-1}).narrow(0, begin, length).clone()
                             : at::zeros({length}, p.options());
        };
        at::Tensor value = copy(p);
        at::Tensor exp_avg = copy(s.exp_avg);
        at::Tensor exp_avg_sq = copy(s.exp_avg_sq);
        at::_fused_adamw_({value}, {g.narrow(0, begin, length)}, {exp_avg}, {exp_avg_sq},
                          /*max_exp_avg_sqs=*/{}, {step}, o.learning_rate, o.beta1,
                          o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false,
                          /*maximize=*/false);
        // The largest |value| from the extremes (aminmax is one vectorised
        // pass; the infinity norm is several times slower on the CPU). A NaN
        // anywhere makes it NaN, read as not finite below.
        const auto [low, high] = at::aminmax(value);
        largest.push_back(at::maximum(low.neg(), high).to(at::kDouble).reshape({1}));
        of.push_back(&s);
      }
    }
  }
  Peek out;
  if (largest.empty()) return out;
  out.param = of.front()->param;
  if (largest.front().is_meta()) return out;
  // One copy per device (parameters placed on the CPU beside a GPU model).
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t i = 0; i < largest.size(); ++i) {
    by_device[largest[i].device().str()].push_back(i);
  }
  std::vector<double> values(largest.size());
  for (const auto& [device, indices] : by_device) {
    std::vector<at::Tensor> parts;
    for (size_t i : indices) parts.push_back(largest[i]);
    const at::Tensor on_host = at::cat(parts).cpu();
    const double* v = on_host.const_data_ptr<double>();
    for (size_t k = 0; k < indices.size(); ++k) values[indices[k]] = v[k];
  }
  for (size_t i = 0; i < largest.size(); ++i) {
    const double x = std::isfinite(values[i]) ? values[i] : INFINITY;
    if (x > out.largest) {
      out.largest = x;
      out.param = of[i]->param;
    }
  }
  return out;
}

void FusedAdamW::ShardFlat(const FlatShardSpec& spec) {
  if (shard_) {
    TORCH_CHECK(shard_->rank == spec.rank && shard_->world_size == spec.world_size,
                "the optimizer is sharded for rank ", shard_->rank, " of ",
                shard_->world_size, " already");
    return;
  }
  torch::NoGradGuard no_grad;
  for (Group& group : groups_) {
    for (Slot& s : group.slots) {
      TORCH_CHECK(s.param.is_contiguous(),
                  "a sharded optimizer needs contiguous "
                  "parameters");
      const FlatChunk piece = ChunkOf(s.param.numel(), spec.rank, spec.world_size);
      // A tensor of its own over the piece's memory: a leaf, so that it
      // takes a .grad, and the update bumps its version counter, not the
      // parameter's.
      at::Tensor target = at::empty({0}, s.param.options());
      target.set_(s.param.storage(), s.param.storage_offset() + piece.begin,
                  {piece.length}, {1});
      s.target = std::move(target);
      s.begin = piece.begin;
      if (!s.exp_avg.defined()) continue;
      if (piece.length == 0) {
        s.exp_avg = s.exp_avg_sq = s.step = at::Tensor();
        continue;
      }
      memory::OwnedByScope scope(s.param, Category::kOptimizerState);
      s.exp_avg = s.exp_avg.reshape({-1}).narrow(0, piece.begin, piece.length).clone();
      s.exp_avg_sq =
          s.exp_avg_sq.reshape({-1}).narrow(0, piece.begin, piece.length).clone();
    }
  }
  shard_ = spec;
}

FusedAdamW::Slot* FusedAdamW::Find(const at::Tensor& param) {
  for (Group& group : groups_) {
    for (Slot& s : group.slots) {
      if (s.param.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return &s;
    }
  }
  return nullptr;
}

const FusedAdamW::Slot* FusedAdamW::Find(const at::Tensor& param) const {
  return const_cast<FusedAdamW*>(this)->Find(param);
}

bool FusedAdamW::Retarget(const at::Tensor& param, const at::Tensor& target) {
  Slot* s = Find(param);
  if (s == nullptr || !target.sizes().equals(s->target.sizes())) return false;
  s->target = target;
  return true;
}

at::Tensor FusedAdamW::TargetOf(const at::Tensor& param) const {
  const Slot* s = Find(param);
  return s != nullptr ? s->target : at::Tensor();
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
  const Slot* s = Find(param);
  if (s == nullptr || !s->exp_avg.defined()) return std::nullopt;
  return ParamState{s->exp_avg, s->exp_avg_sq, s->step};
}

bool FusedAdamW::SetStateOf(const at::Tensor& param, const ParamState& state) {
  Slot* s = Find(param);
  if (s == nullptr || state.step.numel() != 1) return false;
  // The moments as given (shaped as the target), or narrowed to the piece
  // (shaped as the whole parameter, sharded).
  auto piece_of = [&](const at::Tensor& moment) -> std::optional<at::Tensor> {
    if (moment.sizes().equals(s->target.sizes())) return moment;
    if (shard_ && moment.sizes().equals(s->param.sizes())) {
      return moment.reshape({-1}).narrow(0, s->begin, s->target.numel());
    }
    return std::nullopt;
  };
  const std::optional<at::Tensor> exp_avg = piece_of(state.exp_avg);
  const std::optional<at::Tensor> exp_avg_sq = piece_of(state.exp_avg_sq);
  if (!exp_avg || !exp_avg_sq) return false;
  if (s->target.numel() == 0) {
    s->exp_avg = s->exp_avg_sq = s->step = at::Tensor();
    return true;
  }
  torch::NoGradGuard no_grad;
  at::Tensor m = at::empty_like(s->target, at::MemoryFormat::Preserve);
  at::Tensor v = at::empty_like(s->target, at::MemoryFormat::Preserve);
  at::Tensor step = at::empty({}, s->param.options().dtype(at::kFloat));
  m.copy_(*exp_avg);
  v.copy_(*exp_avg_sq);
  step.copy_(state.step.reshape({}));
  s->exp_avg = std::move(m);
  s->exp_avg_sq = std::move(v);
  s->step = std::move(step);
  return true;
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
