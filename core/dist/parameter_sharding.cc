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

std::vector<std::vector<size_t>> UnitParameterIndices(
    const LlamaModel& model, const std::vector<at::Tensor>& params) {
  // The embedding, each decoder layer, then the final norm and lm_head (the
  // last two of the state dict; the embedding itself when the head is tied).
  const auto named = model.NamedParameters();
  std::vector<std::vector<at::Tensor>> units = {{named.front().second}};
  for (int64_t i = 0; i < model.num_layers(); ++i)
    units.push_back(model.LayerParameters(i));
  units.push_back({named[named.size() - 2].second, named.back().second});
  std::vector<std::vector<size_t>> out;
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
    out.push_back(std::move(indices));
  }
  return out;
}

ParameterSharding::ParameterSharding(ProcessGroup* group, LlamaModel* model,
                                     std::vector<at::Tensor> params)
    : group_(group),
      model_(model),
      params_(std::move(params)),
      held_(params_.size(), true),
      pending_(params_.size()),
      aliases_(params_.size()) {}

absl::StatusOr<std::unique_ptr<ParameterSharding>> ParameterSharding::Create(
    ProcessGroup* group, LlamaModel* model) {
  if (model->has_placement()) {
    return absl::FailedPreconditionError(
        "full sharding needs every module on the compute device, and this model has "
        "modules placed on cpu or disk: load it without module placement, or use "
        "sharding=gradients");
  }
  std::vector<at::Tensor> params = model->Parameters();
  std::unordered_map<const c10::StorageImpl*, size_t> storages;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (!p.requires_grad()) {
      return absl::FailedPreconditionError(
          absl::StrCat("full sharding: parameter ", k,
                       " is frozen; every parameter of a fully sharded run must train"));
    }
    // A parameter is freed by resizing its storage: it must be the only
    // tensor there, from its start (a gathered one's storage keeps the
    // padding after it).
    if (!storages.emplace(StorageOf(p), k).second || p.storage_offset() != 0 ||
        !p.is_contiguous() ||
        static_cast<int64_t>(p.storage().nbytes()) < p.numel() * p.element_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("full sharding: parameter ", k,
                       " does not have a storage of its own; reload the model"));
    }
  }
  std::unique_ptr<ParameterSharding> sharding(
      new ParameterSharding(group, model, params));
  const int world = group->world_size();
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    const FlatChunk piece = ChunkOf(p.numel(), group->rank(), world);
    sharding->pieces_.push_back(piece);
    sharding->nbytes_.push_back(piece.chunk * world * p.element_size());
    const std::optional<Attribution> a = memory::StorageAttribution(p);
    sharding->modules_.push_back(a ? a->module : 0);
    // Whole to begin with: counted as gathered until freed.
    sharding->stats_.gathered_bytes += static_cast<int64_t>(p.storage().nbytes());
    at::Tensor shard;
    RETURN_IF_ERROR(TorchBoundary("copying a parameter's shard", [&] {
      at::NoGradGuard no_grad;
      ModuleScope module(a ? a->module : 0);
      CategoryScope category(Category::kParameters);
      shard = at::zeros({piece.chunk}, p.options());
      shard.narrow(0, 0, piece.length)
          .copy_(p.detach().view({-1}).narrow(0, piece.begin, piece.length));
    }));
    sharding->stats_.owned_bytes += piece.chunk * p.element_size();
    sharding->shards_.push_back(std::move(shard));
  }
  sharding->units_ = UnitParameterIndices(*model, params);
  ParameterSharding* raw = sharding.get();
  sharding->hooks_ =
      std::make_unique<AccumulatorHooks>(params, [raw](size_t k) { raw->FreeOne(k); });
  return sharding;
}

ParameterSharding::~ParameterSharding() = default;

void ParameterSharding::ResetPeak() {
  stats_.peak_gathered_bytes = stats_.gathered_bytes;
  stats_.gathers = 0;
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

at::Tensor ParameterSharding::PieceTarget(size_t k) const {
  const at::Tensor& shard = shards_[k];
  at::Tensor target = at::empty({0}, shard.options());
  at::NoGradGuard no_grad;
  target.set_(shard.storage(), 0, {pieces_[k].length}, {1});
  return target;
}

absl::Status ParameterSharding::StartGather(size_t k) {
  const at::Tensor& p = params_[k];
  RETURN_IF_ERROR(TorchBoundary("gathering a parameter", [&] {
    at::NoGradGuard no_grad;
    c10::StorageImpl* storage = StorageOf(p);
    c10::Allocator* allocator = storage->allocator();
    if (allocator == nullptr) allocator = c10::GetAllocator(storage->device_type());
    storage->set_data_ptr_noswap(allocator->allocate(nbytes_[k]));
    storage->set_nbytes(nbytes_[k]);
    memory::TagStorage(p, static_cast<ModuleId>(modules_[k]),
                       Category::kGatheredParameters);
    // A tensor of its own over the whole storage, padding included: the
    // all-gather bumps its version counter, not the parameter's.
    aliases_[k] = at::empty({0}, p.options());
    aliases_[k].set_(p.storage(), 0, {nbytes_[k] / p.element_size()}, {1});
  }));
  held_[k] = true;
  stats_.gathered_bytes += nbytes_[k];
  stats_.peak_gathered_bytes =
      std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  absl::StatusOr<PendingCollective> started =
      group_->StartAllGatherInto(aliases_[k], shards_[k]);
  if (!started.ok()) {
    aliases_[k] = at::Tensor();
    FreeOne(k);
    return started.status();
  }
  pending_[k] = *std::move(started);
  ++stats_.gathers;
  return absl::OkStatus();
}

absl::Status ParameterSharding::Complete(size_t k) {
  absl::Status status = pending_[k].Wait();
  pending_[k] = PendingCollective();
  aliases_[k] = at::Tensor();
  return status;
}

void ParameterSharding::FreeOne(size_t k) {
  // Never free a buffer an all-gather may still write; a failure here breaks
  // the run, and the next collective reports it.
  if (aliases_[k].defined()) Complete(k).IgnoreError();
  const bool was_held = held_[k];
  held_[k] = false;
  c10::StorageImpl* storage = StorageOf(params_[k]);
  const int64_t bytes = static_cast<int64_t>(storage->nbytes());
  if (bytes == 0) return;
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
  if (was_held) stats_.gathered_bytes -= bytes;
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
  const bool gathered = !held_[k];
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
