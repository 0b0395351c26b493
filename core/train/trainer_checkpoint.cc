// The Trainer's checkpointable state (trainer.h): its optimizer, made on
// demand, sharded and configured for each step, and what a checkpoint saves
// and restores of it and of the run. The steps themselves are trainer.cc's.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/train/adamw.h"
#include "core/train/trainer.h"

namespace memprofd {

FusedAdamW* Trainer::optimizer() {
  if (optimizer_ == nullptr) {
    // Group 0: matrices and embeddings (decayed); group 1: RMSNorm weights.
    std::vector<at::Tensor> decay, no_decay;
    // Frozen parameters (placed on disk) stay out of the optimizer.
    for (const at::Tensor& p : model_->Parameters()) {
      if (p.requires_grad()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    }
    optimizer_ = std::make_unique<FusedAdamW>(
        std::vector<std::vector<at::Tensor>>{std::move(decay), std::move(no_decay)},
        std::vector<FusedAdamW::Options>(2));
    if (optimizer_shard_) optimizer_->ShardFlat(*optimizer_shard_);
  }
  return optimizer_.get();
}

absl::Status Trainer::ShardOptimizer(const FlatShardSpec& spec) {
  if (optimizer_shard_ && (optimizer_shard_->rank != spec.rank ||
                           optimizer_shard_->world_size != spec.world_size)) {
    return absl::InternalError(absl::StrCat(
        "the optimizer is sharded for rank ", optimizer_shard_->rank, " of ",
        optimizer_shard_->world_size, ", not rank ", spec.rank, " of ", spec.world_size));
  }
  optimizer_shard_ = spec;
  return TorchBoundary("sharding the optimizer state", [&] {
    if (optimizer_ != nullptr) optimizer_->ShardFlat(spec);
  });
}

void Trainer::ConfigureOptimizer(const TrainOptions& o, double learning_rate) {
  auto options_for = [&](bool decay) {
    FusedAdamW::Options options;
    options.learning_rate = learning_rate;
    options.beta1 = o.beta1;
    options.beta2 = o.beta2;
    options.eps = o.adam_eps;
    options.weight_decay = decay ? o.weight_decay : 0.0;
    return options;
  };
  optimizer()->set_options(0, options_for(true));
  optimizer_->set_options(1, options_for(false));
  optimizer_configured_ = true;
}

TrainerState Trainer::State() const {
  TrainerState state;
  state.global_step = global_step_;
  if (run_) {
    state.run = *run_;
    if (generator_.defined()) {
      // The CPU generator's whole state (CPUGeneratorImplState: the mt19937
      // words and the cached normal samples), as torch.Generator.get_state.
      const at::Tensor bytes = generator_.get_state();
      state.run->sampler.generator_state.assign(
          static_cast<const char*>(bytes.data_ptr()),
          static_cast<size_t>(bytes.nbytes()));
    }
  }
  state.recent_losses.assign(recent_losses_.begin(), recent_losses_.end());
  if (model_->lora()) state.lora_base_fingerprint = model_->BaseFingerprint();
  return state;
}

namespace {

constexpr const char* kStateParts[] = {"exp_avg", "exp_avg_sq", "step"};

// The distinct parameters with their first name (a tied head is the
// embedding), in state-dict order.
std::vector<std::pair<std::string, at::Tensor>> DistinctParameters(
    const LlamaModel& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, p] : model.NamedParameters()) {
    bool seen = false;
    for (const auto& [n, q] : out) {
      seen = seen || q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl();
    }
    if (!seen) out.emplace_back(name, p);
  }
  return out;
}

std::string ShapeText(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", shape[i]);
  }
  return out + "]";
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> Trainer::NamedOptimizerState() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (optimizer_ == nullptr) return out;
  for (const auto& [name, p] : DistinctParameters(*model_)) {
    std::optional<FusedAdamW::ParamState> s = optimizer_->StateOf(p);
    if (!s) continue;
    out.emplace_back(absl::StrCat(name, ".exp_avg"), s->exp_avg);
    out.emplace_back(absl::StrCat(name, ".exp_avg_sq"), s->exp_avg_sq);
    out.emplace_back(absl::StrCat(name, ".step"), s->step);
  }
  return out;
}

std::map<std::string, std::string> Trainer::OptimizerMetadata() const {
  std::map<std::string, std::string> m;
  m["optimizer"] = "AdamW";
  m["implementation"] = "at::_fused_adamw_ (torch.optim.AdamW(fused=True))";
  m["global_step"] = absl::StrCat(global_step_);
  // An optimizer made only to be sharded has had no hyperparameters yet.
  if (optimizer_ == nullptr || !optimizer_configured_) return m;
  // Group 0: matrices and embeddings (decayed); group 1: RMSNorm weights.
  const char* kGroups[] = {"decay", "no_decay"};
  for (size_t g = 0; g < 2; ++g) {
    const FusedAdamW::Options& o = optimizer_->options(g);
    const std::string prefix = absl::StrCat("group.", kGroups[g], ".");
    m[prefix + "lr"] = absl::StrFormat("%.17g", o.learning_rate);
    m[prefix + "beta1"] = absl::StrFormat("%.17g", o.beta1);
    m[prefix + "beta2"] = absl::StrFormat("%.17g", o.beta2);
    m[prefix + "eps"] = absl::StrFormat("%.17g", o.eps);
    m[prefix + "weight_decay"] = absl::StrFormat("%.17g", o.weight_decay);
  }
  return m;
}

absl::Status Trainer::Restore(
    const TrainerState& state,
    const std::vector<std::pair<std::string, at::Tensor>>& optimizer,
    const FlatShardSpec* shard) {
  // Every check first: a failed restore leaves the trainer as it was.
  // Adapters resumed onto another base than they trained on would go on
  // silently wrong.
  if (!state.lora_base_fingerprint.empty() && model_->lora()) {
    RETURN_IF_ERROR(model_->CheckBaseFingerprint(state.lora_base_fingerprint,
                                                 "the checkpoint's LoRA adapters"));
  }
  std::map<std::string, const at::Tensor*> given;
  for (const auto& [name, t] : optimizer) given[name] = &t;
  const std::vector<std::pair<std::string, at::Tensor>> params =
      DistinctParameters(*model_);
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, p] : params) by_name[name] = p;
  for (const auto& [name, t] : given) {
    std::string param;
    bool is_step = false;
    for (const char* part : kStateParts) {
      const std::string suffix = absl::StrCat(".", part);
      if (absl::EndsWith(name, suffix)) {
        param = name.substr(0, name.size() - suffix.size());
        is_step = suffix == ".step";
        break;
      }
    }
    auto it = by_name.find(param);
    if (param.empty() || it == by_name.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's optimizer state holds '", name,
          "', which names no parameter of this model: the checkpoint is of another "
          "model; resume from a checkpoint of this model"));
    }
    if (!it->second.requires_grad()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint has optimizer state for ", param,
                       ", which is frozen in this load (placed on disk); load the "
                       "checkpoint with the placement it was trained with"));
    }
    // Sharded, a moment may come as this rank's flat piece already (a
    // sharded checkpoint read for it: LoadCheckpointFiles' pieces_for).
    const bool piece =
        shard != nullptr && !is_step && t->dim() == 1 &&
        t->numel() == ChunkOf(it->second.numel(), shard->rank, shard->world_size).length;
    if (is_step ? t->numel() != 1 : !(piece || t->sizes().equals(it->second.sizes()))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's optimizer state ", name, " has shape ", ShapeText(t->sizes()),
          " but parameter ", param, " has shape ", ShapeText(it->second.sizes()),
          ": the checkpoint is of another model shape; resume from a checkpoint of "
          "this model"));
    }
  }
  for (const auto& [name, p] : params) {
    if (!p.requires_grad()) continue;
    int present = 0;
    for (const char* part : kStateParts)
      present += given.count(absl::StrCat(name, ".", part));
    if (present == 0 && state.global_step > 0 && !given.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint has no optimizer state for ", name, " (no ", name,
                       ".exp_avg): it is of another model; resume from a checkpoint "
                       "of this model"));
    }
    if (present != 0 && present != 3) {
      for (const char* part : kStateParts) {
        if (given.count(absl::StrCat(name, ".", part)) == 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("the checkpoint's optimizer state lacks ", name, ".", part,
                           "; take the checkpoint again"));
        }
      }
    }
  }
  if (!given.empty() && !state.run) {
    return absl::DataLossError(
        "the checkpoint has optimizer state but no training run in trainer_state.json; "
        "take the checkpoint again");
  }
  at::Generator generator;
  if (state.run) {
    const std::string& bytes = state.run->sampler.generator_state;
    absl::Status status = TorchBoundary("restoring the data generator", [&] {
      generator = MakeDataGenerator(state.run->sampler.seed);
      at::Tensor t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
      if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
      generator.set_state(t);
    });
    if (!status.ok()) {
      return absl::DataLossError(
          absl::StrCat("trainer_state.json's data generator state (", bytes.size(),
                       " bytes) is not a CPU generator's: ", status.message(),
                       "; take the checkpoint again"));
    }
  }

  std::unique_ptr<FusedAdamW> saved_optimizer = std::move(optimizer_);
  const std::optional<FlatShardSpec> saved_shard = optimizer_shard_;
  const bool saved_configured = optimizer_configured_;
  optimizer_configured_ = false;
  if (shard != nullptr) optimizer_shard_ = *shard;
  absl::Status status = TorchBoundary("restoring the optimizer state", [&] {
    // The learning rate is set again by each step from the schedule.
    if (state.run)
      ConfigureOptimizer(state.run->options, state.run->options.learning_rate);
    if (!given.empty()) this->optimizer();
    for (const auto& [name, p] : params) {
      if (given.count(absl::StrCat(name, ".exp_avg")) == 0) continue;
      FusedAdamW::ParamState s{*given.at(absl::StrCat(name, ".exp_avg")),
                               *given.at(absl::StrCat(name, ".exp_avg_sq")),
                               *given.at(absl::StrCat(name, ".step"))};
      TORCH_CHECK(optimizer_->SetStateOf(p, s), "no optimizer slot for ", name);
    }
  });
  if (!status.ok()) {
    optimizer_ = std::move(saved_optimizer);
    optimizer_shard_ = saved_shard;
    optimizer_configured_ = saved_configured;
    return status;
  }
  global_step_ = state.global_step;
  run_ = state.run;
  if (run_) run_->sampler.generator_state.clear();
  generator_ = std::move(generator);
  recent_losses_.assign(state.recent_losses.begin(), state.recent_losses.end());
  return absl::OkStatus();
}

std::vector<at::Tensor> Trainer::OptimizerState() const {
  return optimizer_ ? optimizer_->State() : std::vector<at::Tensor>();
}

}  // namespace memprofd
