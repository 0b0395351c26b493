#include "core/dist/parameter_sharding.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/common/attribution.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/memory/tagging.h"
#include "core/model/llama.h"
#include "core/train/autocast.h"

namespace memprofd {
namespace {

c10::StorageImpl* StorageOf(const at::Tensor& t) {
  return t.storage().unsafeGetStorageImpl();
}

// The module a group's buffer is attributed to: the longest dotted path the
// modules `names` share ("model.layers.3" for a decoder layer's), or
// `fallback` when they share none (the head's final norm and lm_head).
ModuleId CommonModule(const std::vector<std::string>& names, ModuleId fallback) {
  std::vector<absl::string_view> common = absl::StrSplit(names.front(), '.');
  for (const std::string& name : names) {
    const std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
    size_t same = 0;
    while (same < common.size() && same < parts.size() && common[same] == parts[same]) {
      ++same;
    }
    common.resize(same);
  }
  if (common.empty() || common.front().empty()) return fallback;
  return InternModule(absl::StrJoin(common, "."));
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
      held_(params_.size(), true) {}

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
  ParameterSharding& s = *sharding;
  const int world = group->world_size();
  s.units_ = UnitParameterIndices(*model, params);
  // The groups: each unit's parameters not in an earlier unit, then each
  // parameter of none alone.
  constexpr size_t kNone = static_cast<size_t>(-1);
  s.group_of_.assign(params.size(), kNone);
  auto add_group = [&s](std::vector<size_t> members) {
    if (members.empty()) return;
    for (size_t k : members) s.group_of_[k] = s.groups_.size();
    s.groups_.push_back(std::move(members));
  };
  for (const std::vector<size_t>& unit : s.units_) {
    std::vector<size_t> members;
    for (size_t k : unit) {
      if (s.group_of_[k] == kNone) members.push_back(k);
    }
    add_group(std::move(members));
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (s.group_of_[k] == kNone) add_group({k});
  }
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    const FlatChunk piece = ChunkOf(p.numel(), group->rank(), world);
    s.pieces_.push_back(piece);
    s.nbytes_.push_back(piece.chunk * world * p.element_size());
    const std::optional<Attribution> a = memory::StorageAttribution(p);
    s.modules_.push_back(a ? a->module : 0);
    // Whole to begin with: counted as gathered until freed.
    s.stats_.gathered_bytes += static_cast<int64_t>(p.storage().nbytes());
  }
  s.offsets_.assign(params.size(), 0);
  s.shards_.resize(params.size());
  for (const std::vector<size_t>& members : s.groups_) {
    int64_t elements = 0;
    std::vector<std::string> names;
    for (size_t k : members) {
      if (params[k].scalar_type() != params[members.front()].scalar_type()) {
        return absl::FailedPreconditionError(
            absl::StrCat("full sharding: parameters ", members.front(), " and ", k,
                         " of one unit have different dtypes; every parameter must train "
                         "in one dtype"));
      }
      s.offsets_[k] = elements;
      elements += s.pieces_[k].chunk;
      names.push_back(ModuleName(static_cast<ModuleId>(s.modules_[k])));
    }
    const ModuleId module =
        CommonModule(names, static_cast<ModuleId>(s.modules_[members.front()]));
    s.group_modules_.push_back(module);
    at::Tensor flat;
    RETURN_IF_ERROR(TorchBoundary("copying a unit's shards", [&] {
      at::NoGradGuard no_grad;
      ModuleScope in_module(module);
      CategoryScope category(Category::kParameters);
      const at::Tensor& first = params[members.front()];
      flat = at::zeros({elements}, first.options());
      for (size_t k : members) {
        const FlatChunk& piece = s.pieces_[k];
        s.shards_[k] = flat.narrow(0, s.offsets_[k], piece.chunk);
        s.shards_[k]
            .narrow(0, 0, piece.length)
            .copy_(params[k].detach().view({-1}).narrow(0, piece.begin, piece.length));
      }
    }));
    s.stats_.owned_bytes += elements * params[members.front()].element_size();
    s.flat_.push_back(std::move(flat));
  }
  s.pending_.resize(s.groups_.size());
  s.gathered_.resize(s.groups_.size());
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

ParameterShardingStats ParameterSharding::BeginSeparateFigures() {
  const ParameterShardingStats before = stats_;
  ResetPeak();
  return before;
}

void ParameterSharding::EndSeparateFigures(const ParameterShardingStats& before) {
  const int64_t held = stats_.gathered_bytes;
  stats_ = before;
  stats_.gathered_bytes = held;
}

int64_t ParameterSharding::UnitIndex(const ModelUnit& unit) const {
  switch (unit.kind) {
    case ModelUnit::Kind::kEmbedding:
      return 0;
    case ModelUnit::Kind::kLayer:
      return unit.layer + 1;
    case ModelUnit::Kind::kHead:
      break;
  }
  return static_cast<int64_t>(units_.size()) - 1;
}

std::optional<ModelUnit> ParameterSharding::UnitAt(int64_t index) const {
  const int64_t last = static_cast<int64_t>(units_.size()) - 1;
  if (index < 0 || index > last) return std::nullopt;
  if (index == 0) return ModelUnit::Embedding();
  if (index == last) return ModelUnit::Head();
  return ModelUnit::Layer(index - 1);
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
  target.set_(shard.storage(), shard.storage_offset(), {pieces_[k].length}, {1});
  return target;
}

absl::StatusOr<at::Tensor> ParameterSharding::Refill(size_t k) {
  const at::Tensor& p = params_[k];
  at::Tensor alias;
  RETURN_IF_ERROR(TorchBoundary("gathering a parameter", [&] {
    at::NoGradGuard no_grad;
    c10::StorageImpl* storage = StorageOf(p);
    c10::Allocator* allocator = storage->allocator();
    if (allocator == nullptr) allocator = c10::GetAllocator(storage->device_type());
    storage->set_data_ptr_noswap(allocator->allocate(nbytes_[k]));
    storage->set_nbytes(nbytes_[k]);
    memory::TagStorage(p, static_cast<ModuleId>(modules_[k]),
                       Category::kGatheredParameters);
    alias = at::empty({0}, p.options());
    alias.set_(p.storage(), 0, {nbytes_[k] / p.element_size()}, {1});
  }));
  held_[k] = true;
  stats_.gathered_bytes += nbytes_[k];
  stats_.peak_gathered_bytes =
      std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  return alias;
}

absl::Status ParameterSharding::StartGather(size_t g) {
  const at::Tensor& flat = flat_[g];
  const int64_t world = group_->world_size();
  at::Tensor out;
  RETURN_IF_ERROR(TorchBoundary("gathering a unit's parameters", [&] {
    at::NoGradGuard no_grad;
    ModuleScope module(static_cast<ModuleId>(group_modules_[g]));
    CategoryScope category(Category::kGatheredParameters);
    out = at::empty({world * flat.numel()}, flat.options());
  }));
  const int64_t bytes = out.numel() * out.element_size();
  stats_.gathered_bytes += bytes;
  stats_.peak_gathered_bytes =
      std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
  absl::StatusOr<PendingCollective> started = group_->StartAllGatherInto(out, flat);
  if (!started.ok()) {
    stats_.gathered_bytes -= bytes;
    return started.status();
  }
  pending_[g] = *std::move(started);
  gathered_[g] = std::move(out);
  ++stats_.gathers;
  return absl::OkStatus();
}

absl::Status ParameterSharding::Complete(size_t g) {
  absl::Status status = pending_[g].Wait();
  pending_[g] = PendingCollective();
  at::Tensor rows = std::move(gathered_[g]);
  gathered_[g] = at::Tensor();
  const int64_t bytes = rows.numel() * rows.element_size();
  const int64_t world = group_->world_size();
  if (status.ok()) {
    // Row r is rank r's buffer: parameter k's chunks are its column.
    const at::Tensor by_rank = rows.view({world, flat_[g].numel()});
    for (size_t k : groups_[g]) {
      if (held_[k]) continue;
      absl::StatusOr<at::Tensor> alias = Refill(k);
      if (!alias.ok()) {
        status = alias.status();
        break;
      }
      status = TorchBoundary("copying a gathered parameter", [&] {
        at::NoGradGuard no_grad;
        alias->view({world, pieces_[k].chunk})
            .copy_(by_rank.narrow(1, offsets_[k], pieces_[k].chunk));
      });
      if (!status.ok()) break;
    }
  }
  rows.reset();
  stats_.gathered_bytes -= bytes;
  return status;
}

absl::Status ParameterSharding::StartUnit(const ModelUnit& unit, bool prefetch) {
  for (size_t k : UnitParameters(unit)) {
    const size_t g = group_of_[k];
    if (held_[k] || gathered_[g].defined()) continue;
    RETURN_IF_ERROR(StartGather(g));
    if (prefetch) ++stats_.prefetched;
  }
  return absl::OkStatus();
}

void ParameterSharding::FreeOne(size_t k) {
  // Never free what an all-gather may still write to; a failure here breaks
  // the run, and the next collective reports it.
  const size_t g = group_of_[k];
  if (gathered_[g].defined()) Complete(g).IgnoreError();
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
  RETURN_IF_ERROR(StartUnit(unit, /*prefetch=*/false));
  for (size_t k : UnitParameters(unit)) {
    if (gathered_[group_of_[k]].defined()) RETURN_IF_ERROR(Complete(group_of_[k]));
  }
  stats_.exposed_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The next unit's travel while this one computes.
  if (std::optional<ModelUnit> next = NextUnit(unit, backward)) {
    RETURN_IF_ERROR(StartUnit(*next, /*prefetch=*/true));
  }
  return absl::OkStatus();
}

void ParameterSharding::Release(const ModelUnit& unit) {
  for (size_t k : UnitParameters(unit)) FreeOne(k);
  const c10::DeviceType device = model_->device().type();
  if (AutocastOn(device)) ClearAutocastWeightCache(device);
}

absl::Status ParameterSharding::GatherAll() {
  const auto start = std::chrono::steady_clock::now();
  // One group at a time: the whole model, and at most one group's buffer
  // beside it.
  for (size_t g = 0; g < groups_.size(); ++g) {
    const bool needed = std::any_of(groups_[g].begin(), groups_[g].end(),
                                    [this](size_t k) { return !held_[k]; });
    if (needed && !gathered_[g].defined()) RETURN_IF_ERROR(StartGather(g));
    if (gathered_[g].defined()) RETURN_IF_ERROR(Complete(g));
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
  const size_t g = group_of_[k];
  if (gathered_[g].defined()) return Complete(g);
  ASSIGN_OR_RETURN(at::Tensor alias, Refill(k));
  absl::StatusOr<PendingCollective> started =
      group_->StartAllGatherInto(alias, shards_[k]);
  absl::Status status = started.ok() ? started->Wait() : started.status();
  ++stats_.gathers;
  if (!status.ok()) FreeOne(k);
  return status;
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

absl::Status ParameterSharding::StreamUnit(const ModelUnit& unit) {
  RETURN_IF_ERROR(BroadcastStreamIndex(UnitIndex(unit)).status());
  return Gather(unit, /*backward=*/false);
}

absl::Status ParameterSharding::FollowUnitStream() {
  ShardedEvaluation evaluation(this, /*lead=*/false);
  std::optional<ModelUnit> previous;
  for (;;) {
    ASSIGN_OR_RETURN(const int64_t index, BroadcastStreamIndex(-1));
    if (index < 0) return absl::OkStatus();
    const std::optional<ModelUnit> unit = UnitAt(index);
    if (!unit) {
      return absl::InternalError(absl::StrCat("rank 0 streams unit ", index, " of ",
                                              units_.size(),
                                              ": do all ranks hold the same model?"));
    }
    if (previous) evaluation.Leave(*previous);
    RETURN_IF_ERROR(evaluation.Enter(*unit));
    previous = unit;
  }
}

ShardedEvaluation::ShardedEvaluation(ParameterSharding* sharded, bool lead)
    : sharded_(sharded), lead_(lead), before_(sharded->BeginSeparateFigures()) {}

ShardedEvaluation::~ShardedEvaluation() {
  Finish().IgnoreError();
  sharded_->ReleaseAll();
  sharded_->EndSeparateFigures(before_);
}

absl::Status ShardedEvaluation::Enter(const ModelUnit& unit) {
  if (ended_) return absl::FailedPreconditionError("the evaluation's unit stream ended");
  absl::Status status =
      lead_ ? sharded_->StreamUnit(unit) : sharded_->Gather(unit, /*backward=*/false);
  // A failed collective breaks the run: nothing more goes on the wire.
  if (!status.ok()) ended_ = true;
  return status;
}

void ShardedEvaluation::Leave(const ModelUnit& unit) { sharded_->Release(unit); }

int64_t ShardedEvaluation::peak_gathered_bytes() const {
  return sharded_->stats().peak_gathered_bytes;
}

absl::Status ShardedEvaluation::Finish() {
  if (!lead_ || ended_) return absl::OkStatus();
  ended_ = true;
  return sharded_->EndStream();
}

std::optional<size_t> ParameterSharding::IndexOf(const at::Tensor& p) const {
  for (size_t k = 0; k < params_.size(); ++k) {
    if (params_[k].unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return k;
  }
  return std::nullopt;
}

}  // namespace memprofd
