#include "core/dist/parameter_sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/attribution.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/memory/tagging.h"
#include "core/model/llama.h"

namespace memprofd {
namespace {

c10::StorageImpl* StorageOf(const at::Tensor& t) {
  return t.storage().unsafeGetStorageImpl();
}

}  // namespace

ParameterSharding::ParameterSharding(ProcessGroup* group, LlamaModel* model,
                                     std::vector<at::Tensor> params,
                                     std::vector<int> owners)
    : group_(group),
      model_(model),
      params_(std::move(params)),
      owners_(std::move(owners)),
      held_(params_.size(), true),
      pending_(params_.size()),
      aliases_(params_.size()) {}

absl::StatusOr<std::unique_ptr<ParameterSharding>> ParameterSharding::Create(
    ProcessGroup* group, LlamaModel* model, std::vector<int> owners) {
  if (model->has_placement()) {
    return absl::FailedPreconditionError(
        "full sharding needs every module on the compute device, and this model has "
        "modules placed on cpu or disk: load it without module placement, or use "
        "sharding=gradients");
  }
  std::vector<at::Tensor> params = model->Parameters();
  if (owners.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat("full sharding got ", owners.size(),
                                                   " owners for ", params.size(),
                                                   " parameters"));
  }
  std::unordered_map<const c10::StorageImpl*, size_t> storages;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (owners[k] < 0 || owners[k] >= group->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "full sharding: parameter ", k, " has owner ", owners[k], ", not a rank"));
    }
    if (!p.requires_grad()) {
      return absl::FailedPreconditionError(
          absl::StrCat("full sharding: parameter ", k,
                       " is frozen; every parameter of a fully sharded run must train"));
    }
    // A parameter is freed by resizing its storage: it must be the only
    // tensor there, whole.
    if (!storages.emplace(StorageOf(p), k).second || p.storage_offset() != 0 ||
        !p.is_contiguous() ||
        static_cast<int64_t>(p.storage().nbytes()) != p.numel() * p.element_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("full sharding: parameter ", k,
                       " does not have a storage of its own; reload the model"));
    }
  }
  std::unique_ptr<ParameterSharding> sharding(
      new ParameterSharding(group, model, params, std::move(owners)));
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    sharding->nbytes_.push_back(static_cast<int64_t>(p.storage().nbytes()));
    const std::optional<Attribution> a = memory::StorageAttribution(p);
    sharding->modules_.push_back(a ? a->module : 0);
    // Whole to begin with: what others own counts as gathered until freed.
    (sharding->owners_[k] == group->rank() ? sharding->stats_.owned_bytes
                                           : sharding->stats_.gathered_bytes) +=
        sharding->nbytes_[k];
  }
  // Each unit's parameters, once: the embedding, each decoder layer, then
  // the final norm and lm_head (the last two of the state dict; the
  // embedding itself when the head is tied).
  const auto named = model->NamedParameters();
  std::vector<std::vector<at::Tensor>> units = {{named.front().second}};
  for (int64_t i = 0; i < model->num_layers(); ++i)
    units.push_back(model->LayerParameters(i));
  units.push_back({named[named.size() - 2].second, named.back().second});
  for (const std::vector<at::Tensor>& tensors : units) {
    std::vector<size_t> indices;
    for (size_t k = 0; k < params.size(); ++k) {
      for (const at::Tensor& t : tensors) {
        if (params[k].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
          indices.push_back(k);
          break;
        }
      }
    }
    sharding->units_.push_back(std::move(indices));
  }
  ParameterSharding* raw = sharding.get();
  sharding->hooks_ =
      std::make_unique<AccumulatorHooks>(params, [raw](size_t k) { raw->FreeOne(k); });
  return sharding;
}

ParameterSharding::~ParameterSharding() = default;

void ParameterSharding::ResetPeak() {
  stats_.peak_gathered_bytes = stats_.gathered_bytes;
  stats_.broadcasts = 0;
  stats_.prefetched = 0;
  stats_.exposed_seconds = 0;
}

const std::vector<size_t>& ParameterSharding::UnitParameters(
    const ModelUnit& unit) const {
  switch (unit.kind) {
    case ModelUnit::Kind::kEmbedding:
      return units_.front();
    case ModelUnit::Kind::kLayer:
      return units_.at(static_cast<size_t>(unit.layer) + 1);
    case ModelUnit::Kind::kHead:
      break;
  }
  return units_.back();
}

std::optional<ModelUnit> ParameterSharding::NextUnit(const ModelUnit& unit,
                                                     bool backward) const {
  const int64_t layers = model_->num_layers();
  switch (unit.kind) {
    case ModelUnit::Kind::kEmbedding:
      if (backward) return std::nullopt;
      return layers > 0 ? ModelUnit::Layer(0) : ModelUnit::Head();
    case ModelUnit::Kind::kLayer:
      if (backward) {
        return unit.layer > 0 ? std::optional<ModelUnit>(ModelUnit::Layer(unit.layer - 1))
                              : std::nullopt;
      }
      return unit.layer + 1 < layers ? ModelUnit::Layer(unit.layer + 1)
                                     : ModelUnit::Head();
    case ModelUnit::Kind::kHead:
      if (!backward || layers == 0) return std::nullopt;
      return ModelUnit::Layer(layers - 1);
  }
  return std::nullopt;
}

absl::Status ParameterSharding::StartGather(size_t k) {
  const at::Tensor& p = params_[k];
  const bool owner = owners_[k] == group_->rank();
  RETURN_IF_ERROR(TorchBoundary("gathering a parameter", [&] {
    at::NoGradGuard no_grad;
    c10::StorageImpl* storage = StorageOf(p);
    if (!owner) {
      c10::Allocator* allocator = storage->allocator();
      if (allocator == nullptr) allocator = c10::GetAllocator(storage->device_type());
      storage->set_data_ptr_noswap(allocator->allocate(nbytes_[k]));
      storage->set_nbytes(nbytes_[k]);
      memory::TagStorage(p, static_cast<ModuleId>(modules_[k]),
                         Category::kGatheredParameters);
    }
    // A tensor of its own over the storage: the broadcast bumps its version
    // counter, not the parameter's.
    aliases_[k] = at::empty({0}, p.options());
    aliases_[k].set_(p.storage(), 0, p.sizes(), p.strides());
  }));
  held_[k] = true;
  if (!owner) {
    stats_.gathered_bytes += nbytes_[k];
    stats_.peak_gathered_bytes =
        std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  }
  absl::StatusOr<PendingCollective> started =
      group_->StartBroadcast(aliases_[k], owners_[k]);
  if (!started.ok()) {
    aliases_[k] = at::Tensor();
    FreeOne(k);
    return started.status();
  }
  pending_[k] = *std::move(started);
  ++stats_.broadcasts;
  return absl::OkStatus();
}

absl::Status ParameterSharding::Complete(size_t k) {
  absl::Status status = pending_[k].Wait();
  pending_[k] = PendingCollective();
  aliases_[k] = at::Tensor();
  return status;
}

void ParameterSharding::FreeOne(size_t k) {
  // Never free a buffer a broadcast may still write; a failure here breaks
  // the run, and the next collective reports it.
  if (aliases_[k].defined()) Complete(k).IgnoreError();
  const bool was_held = held_[k];
  held_[k] = false;
  if (owners_[k] == group_->rank()) return;
  c10::StorageImpl* storage = StorageOf(params_[k]);
  if (storage->nbytes() == 0) return;
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  if (was_held) stats_.gathered_bytes -= nbytes_[k];
}

absl::Status ParameterSharding::Gather(const ModelUnit& unit, bool backward) {
  if (backward && unit.kind == ModelUnit::Kind::kEmbedding) return absl::OkStatus();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<size_t>& unit_params = UnitParameters(unit);
  for (size_t k : unit_params) {
    if (!held_[k]) RETURN_IF_ERROR(StartGather(k));
  }
  for (size_t k : unit_params) {
    if (aliases_[k].defined()) RETURN_IF_ERROR(Complete(k));
  }
  stats_.exposed_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The next unit's travel while this one computes.
  if (std::optional<ModelUnit> next = NextUnit(unit, backward)) {
    for (size_t k : UnitParameters(*next)) {
      if (held_[k]) continue;
      RETURN_IF_ERROR(StartGather(k));
      ++stats_.prefetched;
    }
  }
  return absl::OkStatus();
}

void ParameterSharding::Release(const ModelUnit& unit) {
  for (size_t k : UnitParameters(unit)) FreeOne(k);
}

absl::Status ParameterSharding::GatherAll() {
  const auto start = std::chrono::steady_clock::now();
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!held_[k]) RETURN_IF_ERROR(StartGather(k));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (aliases_[k].defined()) RETURN_IF_ERROR(Complete(k));
  }
  stats_.exposed_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return absl::OkStatus();
}

void ParameterSharding::ReleaseAll() {
  for (size_t k = 0; k < params_.size(); ++k) FreeOne(k);
}

absl::Status ParameterSharding::GatherOne(size_t k) {
  if (held_[k]) return absl::OkStatus();
  RETURN_IF_ERROR(StartGather(k));
  return Complete(k);
}

absl::StatusOr<int64_t> ParameterSharding::BroadcastStreamIndex(int64_t index) {
  at::Tensor value;
  RETURN_IF_ERROR(TorchBoundary("the parameter stream's index", [&] {
    value = at::full({1}, index, params_.front().options().dtype(at::kLong));
  }));
  RETURN_IF_ERROR(group_->Broadcast(value, 0));
  int64_t out = -1;
  RETURN_IF_ERROR(TorchBoundary("the parameter stream's index",
                                [&] { out = value.item<int64_t>(); }));
  return out;
}

absl::StatusOr<int64_t> ParameterSharding::StreamParameter(size_t k) {
  if (k >= params_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("parameter stream: index ", k, " of ",
                                                   params_.size(), " parameters"));
  }
  RETURN_IF_ERROR(BroadcastStreamIndex(static_cast<int64_t>(k)).status());
  const bool gathered = !held_[k] && owners_[k] != group_->rank();
  RETURN_IF_ERROR(GatherOne(k));
  return gathered ? nbytes_[k] : 0;
}

absl::Status ParameterSharding::EndStream() { return BroadcastStreamIndex(-1).status(); }

absl::Status ParameterSharding::FollowStream() {
  for (;;) {
    ASSIGN_OR_RETURN(const int64_t k, BroadcastStreamIndex(-1));
    if (k < 0) return absl::OkStatus();
    if (k >= static_cast<int64_t>(params_.size())) {
      return absl::InternalError(absl::StrCat("rank 0 streams parameter ", k, " of ",
                                              params_.size(),
                                              ": do all ranks hold the same model?"));
    }
    RETURN_IF_ERROR(GatherOne(static_cast<size_t>(k)));
    FreeOne(static_cast<size_t>(k));
  }
}

std::optional<size_t> ParameterSharding::IndexOf(const at::Tensor& p) const {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return k;
  }
  return std::nullopt;
}

}  // namespace memprofd
