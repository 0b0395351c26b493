// ModelHost: loading a model, placing its modules, and publishing what it
// holds (model_host.h).

#include "core/session/model_host.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/common/attribution.h"
#include "core/common/files.h"
#include "core/common/phase.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/common/utf8.h"
#include "core/memory/history.h"
#include "core/memory/oom_report.h"
#include "core/memory/recorder.h"
#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/session/optimizer_shards.h"
#include "core/session/runtime.h"
#include "core/snapshot/carried_files.h"
#include "core/snapshot/checkpoint_files.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/safetensors.h"
#include "core/snapshot/snapshot_options.h"
#include "core/train/memory_tags.h"
#include "core/train/trainer.h"
#include "core/train/trainer_state.h"

namespace memprofd {
namespace {

// A config.json is a few kB; anything near this is not one.
constexpr int64_t kMaxConfigBytes = int64_t{16} << 20;

struct HfDirectory {
  std::string config_json;
  std::optional<snapshot::LoadedWeights> weights;  // none: config.json only
  snapshot::CarriedFiles carried;
};

// The text of model directory `dir`'s config.json: NOT_FOUND when `dir` is
// not a directory, INVALID_ARGUMENT when it has no readable config.json,
// PERMISSION_DENIED when it links outside `roots` (when given).
absl::StatusOr<std::string> ReadConfigJson(const std::string& dir,
                                           const PathRoots* roots) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no model directory '", dir, "' on the daemon's host"));
  }
  const fs::path config_path = fs::path(dir) / "config.json";
  // Opened without blocking and only as a regular file: a FIFO named
  // config.json would otherwise hold the reading thread until a writer came.
  absl::StatusOr<std::string> config =
      ReadSmallRegularFile(config_path.string(), kMaxConfigBytes, "config.json", roots);
  if (absl::IsPermissionDenied(config.status())) return config.status();
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Echo(dir), " has no readable config.json (", config.status().message(),
        "); a Hugging Face model directory needs one"));
  }
  return config;
}

// Every file confined to `roots` when given (the model directory's one
// rule: links inside them are followed, links outside PERMISSION_DENIED).
absl::StatusOr<HfDirectory> ReadHfDirectory(const std::string& dir,
                                            const PathRoots* roots) {
  HfDirectory out;
  ASSIGN_OR_RETURN(out.config_json, ReadConfigJson(dir, roots));
  absl::StatusOr<snapshot::LoadedWeights> weights =
      snapshot::LoadSafetensorsDirectory(dir, roots);
  if (weights.ok()) {
    out.weights = *std::move(weights);
  } else if (weights.status().code() != absl::StatusCode::kNotFound) {
    return weights.status();  // corrupt or ambiguous weights are an error, never ignored
  }
  ASSIGN_OR_RETURN(out.carried, snapshot::ReadCarriedFiles(dir, roots));
  return out;
}

std::string Gib(int64_t bytes) {
  return absl::StrFormat("%.2f GiB (%d bytes)", static_cast<double>(bytes) / (1 << 30),
                         bytes);
}

// The float32 parameters and rotary caches a config's model allocates,
// checked against what the device can hold before the first allocation: a
// million layers would otherwise be allocated layer by layer until the
// allocator (or the kernel's OOM killer) stopped it. The old model is still
// loaded while the new one is built (a failed load leaves it), so its
// bytes are not counted as room.
absl::Status CheckModelFits(const LlamaConfig& config, const c10::Device& device,
                            BaseDtype base_dtype) {
  const int64_t params = config.NumParameters();  // Validate() refused -1
  const int64_t element = c10::elementSize(ScalarTypeOf(base_dtype));
  int64_t param_bytes = 0;
  int64_t rope_bytes = 0;
  int64_t bytes = 0;
  if (params < 0 || __builtin_mul_overflow(params, element, &param_bytes) ||
      __builtin_mul_overflow(config.max_position_embeddings, config.head_dim(),
                             &rope_bytes) ||
      __builtin_mul_overflow(rope_bytes, int64_t{2 * 4}, &rope_bytes) ||
      __builtin_add_overflow(param_bytes, rope_bytes, &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's byte count overflows int64 (", params,
                     " parameters, max_position_embeddings ",
                     config.max_position_embeddings, " x head_dim ", config.head_dim(),
                     " for the rotary caches): check num_hidden_layers, the sizes and "
                     "max_position_embeddings"));
  }
  const memory::DeviceRoom room =
      memory::QueryDeviceRoom(device.is_cpu() ? memory::kCpuDevice : device.index());
  if (room.free_bytes >= 0 && bytes > room.free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the model needs ", Gib(bytes), " for its ", params, " ",
        BaseDtypeName(base_dtype), " parameters and rotary caches, and the ",
        device.str(), " device has ", Gib(room.free_bytes), " free",
        room.total_bytes >= 0 ? absl::StrCat(" of ", Gib(room.total_bytes)) : "",
        ": load a smaller model or free memory on the daemon's host"));
  }
  return absl::OkStatus();
}

}  // namespace

ModelHost::ModelHost(const SessionOptions& options, std::string device,
                     memory::MemoryRecorder& recorder, PathRoots model_roots)
    : options_(options),
      device_(std::move(device)),
      recorder_(recorder),
      recorder_device_(RecorderDeviceOf(device_)),
      model_roots_(std::move(model_roots)) {}

ModelHost::~ModelHost() {
  // The trainer (whose optimizer state points at the model) and the
  // offloader go before the model, as in Load.
  trainer_.reset();
  offloader_.reset();
  model_.reset();
}

absl::StatusOr<std::string> ModelHost::ConfineDirectory(const std::string& directory,
                                                        absl::string_view what) const {
  return model_roots_.Confine(directory, what);
}

absl::StatusOr<LlamaConfig> ModelHost::ReadClientConfig(const std::string& directory,
                                                        absl::string_view what) const {
  ASSIGN_OR_RETURN(const std::string dir, ConfineDirectory(directory, what));
  ASSIGN_OR_RETURN(const std::string json, ReadConfigJson(dir, &model_roots_));
  absl::StatusOr<LlamaConfig> config = LlamaConfig::FromJson(json);
  if (!config.ok()) {
    return absl::Status(
        config.status().code(),
        absl::StrCat(what, " ", Echo(directory), ": ", config.status().message()));
  }
  return config;
}

absl::Status ModelHost::Load(const LoadModelSpec& spec,
                             const std::function<bool()>& cancelled) {
  PhaseScope phase(Phase::kLoad);
  auto stop_if_cancelled = [&](absl::string_view stage) -> absl::Status {
    if (!cancelled || !cancelled()) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("LoadModel cancelled ", stage,
                                             "; the model loaded before is unchanged"));
  };
  const c10::Device device(device_);
  std::unique_ptr<LlamaModel> model;
  std::string source;
  auto carried = std::make_shared<snapshot::CarriedFiles>();
  std::vector<std::string> notes;
  // A client's directory was confined (ConfineDirectory); every file read
  // from it is confined the same way.
  const PathRoots* file_roots = spec.operator_named ? nullptr : &model_roots_;
  // The checkpoint a resume reads: a LoRA model's (its adapters and their
  // training state) is lora_adapter, loaded onto the base.
  const std::string& checkpoint_dir =
      spec.lora_adapter.empty() ? spec.hf_directory : spec.lora_adapter;
  if (spec.resume && spec.lora_adapter.empty() && !spec.hf_directory.empty() &&
      snapshot::IsAdapterDirectory(spec.hf_directory)) {
    return absl::FailedPreconditionError(absl::StrCat(
        Echo(spec.hf_directory),
        " holds LoRA adapters without their base (adapter_config.json): resume with the "
        "base model as hf_directory or preset and this directory as lora_adapter"));
  }
  // All of the checkpoint is read and checked against the new model before
  // the old one is replaced: any failure leaves the daemon as it was.
  std::optional<snapshot::LoadedCheckpoint> checkpoint;
  std::optional<TrainerState> state;
  // A rank of a run with its optimizer state sharded keeps the state of its
  // pieces: a sharded checkpoint is read into them alone.
  const std::optional<FlatShardSpec> shard = OptimizerShard(options_);
  auto read_checkpoint = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(checkpoint,
                     snapshot::LoadCheckpointFiles(checkpoint_dir, file_roots,
                                                   shard ? &*shard : nullptr));
    ASSIGN_OR_RETURN(state, TrainerStateFromJson(checkpoint->trainer_state_json,
                                                 (std::filesystem::path(checkpoint_dir) /
                                                  snapshot::kTrainerStateFile)
                                                     .string()));
    return absl::OkStatus();
  };
  // A resumed LoRA run's base loads in the dtype the run keeps it in, unless
  // the request says: its checkpoint is read first.
  if (spec.resume && !spec.lora_adapter.empty() && !spec.base_dtype) {
    RETURN_IF_ERROR(read_checkpoint());
  }
  const BaseDtype dtype = spec.base_dtype.value_or(
      state && state->run ? state->run->options.base_dtype : BaseDtype::kFloat32);
  const at::ScalarType base_dtype = ScalarTypeOf(dtype);
  if (!spec.preset.empty()) {
    ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfig::Preset(spec.preset));
    RETURN_IF_ERROR(CheckModelFits(config, device, dtype));
    ASSIGN_OR_RETURN(model, LlamaModel::Create(config, spec.seed, device, base_dtype));
    source = absl::StrCat("preset:", spec.preset);
  } else {
    ASSIGN_OR_RETURN(HfDirectory dir, ReadHfDirectory(spec.hf_directory, file_roots));
    ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfig::FromJson(dir.config_json));
    // Fresh weights only when asked for: a directory whose weights went
    // missing must not train from random ones as if nothing had happened.
    if (!dir.weights && !spec.init_weights && !spec.init_if_no_weights) {
      return absl::FailedPreconditionError(absl::StrCat(
          Echo(spec.hf_directory),
          " holds a config.json but no weights (no model.safetensors, no "
          "model.safetensors.index.json, no *.safetensors); set init_weights to start "
          "from freshly initialised weights"));
    }
    RETURN_IF_ERROR(CheckModelFits(config, device, dtype));
    RETURN_IF_ERROR(stop_if_cancelled("after reading the directory"));
    ASSIGN_OR_RETURN(model, LlamaModel::Create(config, spec.seed, device, base_dtype));
    // init_weights: the config alone, whatever weights the directory holds.
    if (dir.weights && !spec.init_weights) {
      RETURN_IF_ERROR(stop_if_cancelled("after building the model"));
      int64_t ignored = 0;
      RETURN_IF_ERROR(model->LoadStateDict(dir.weights->tensors, &ignored));
      if (ignored > 0) {
        notes.push_back(absl::StrCat(
            "ignored ", ignored,
            " rotary_emb.inv_freq tensors (a buffer older transformers saved; the model "
            "computes it from config.json, as transformers does)"));
      }
    }
    source = spec.hf_directory;
    *carried = std::move(dir.carried);
    if (!carried->files.empty()) {
      std::vector<std::string> names;
      for (const snapshot::CarriedFile& f : carried->files) names.push_back(f.name);
      notes.push_back(absl::StrCat("snapshots carry ", absl::StrJoin(names, ", ")));
    }
    for (const std::string& skipped : carried->skipped) {
      notes.push_back(absl::StrCat("not carried into snapshots: ", skipped));
    }
  }
  for (const auto& [module, placement] : spec.placement) {
    RETURN_IF_ERROR(PlaceModule(*model, module, placement));
  }
  if (!spec.lora_adapter.empty()) {
    ASSIGN_OR_RETURN(snapshot::LoadedWeights adapter,
                     snapshot::LoadPeftAdapterDirectory(spec.lora_adapter, file_roots));
    ASSIGN_OR_RETURN(const LoraOptions lora,
                     LoraOptionsFromAdapterConfig(adapter.config_json, &notes));
    // Adapters the daemon saved name the base they trained on; onto another
    // they would load and train silently wrong. (A resume's trainer state
    // records the same fingerprint, which Restore checks.)
    if (!adapter.lora_base_fingerprint.empty() && !spec.resume) {
      RETURN_IF_ERROR(model->CheckBaseFingerprint(
          adapter.lora_base_fingerprint,
          absl::StrCat("the LoRA adapters in ", Echo(spec.lora_adapter))));
    }
    RETURN_IF_ERROR(model->AddLora(lora, spec.seed));
    const std::string prefix = PeftAdapterName("");
    snapshot::TensorList named;
    for (auto& [name, t] : adapter.tensors) {
      named.emplace_back(
          absl::StartsWith(name, prefix) ? name.substr(prefix.size()) : name, t);
    }
    RETURN_IF_ERROR(model->LoadAdapters(named));
    notes.push_back(absl::StrCat(
        "LoRA adapters from ", spec.lora_adapter, ": r ", lora.r, ", alpha ", lora.alpha,
        " on ", LoraTargetsName(lora.Targets()), lora.use_rslora ? ", rslora" : ""));
  }
  RETURN_IF_ERROR(stop_if_cancelled("after loading the weights"));
  auto trainer = std::make_unique<Trainer>(model.get());
  if (spec.resume) {
    if (!state) RETURN_IF_ERROR(read_checkpoint());
    // Sharded, the state of this rank's pieces: read as such from a sharded
    // checkpoint of any world size, narrowed here from an unsharded one's.
    RETURN_IF_ERROR(trainer->Restore(*state, checkpoint->optimizer_tensors,
                                     shard ? &*shard : nullptr));
    RETURN_IF_ERROR(stop_if_cancelled("after reading the checkpoint"));
  }
  // The old model (and the optimizer state that points at it) goes first.
  trainer_.reset();
  offloader_.reset();
  model_ = std::move(model);
  model_source_ = source;
  carried_files_ = std::move(carried);
  load_notes_ = std::move(notes);
  trainer_ = std::move(trainer);
  // Its steps are numbered afresh (or from its checkpoint): the kept step
  // records of the model it replaces would diff against the wrong steps.
  recorder_.ClearStepRecords();
  TagModelMemory(*model_);
  PublishModel();
  PublishCategories();
  PublishRun();
  return absl::OkStatus();
}

absl::Status ModelHost::PlaceModule(LlamaModel& model, const std::string& module,
                                    Placement placement) {
  snapshot::TensorList weights;
  for (const auto& [name, t] : model.NamedParameters()) {
    if (ModuleOfParameter(name) == module) weights.emplace_back(name, t);
  }
  if (placement == Placement::kDevice)
    return model.PlaceModule(module, placement, weights);
  if (placement == Placement::kCpu) {
    RETURN_IF_ERROR(TorchBoundary("moving weights to host memory", [&] {
      for (auto& [name, t] : weights) t = t.detach().to(at::kCPU);
    }));
    return model.PlaceModule(module, placement, weights);
  }
  // Disk: write the module's weights to a file of our own in the spill
  // directory, map it and unlink it (the mapping keeps the data).
  const std::string path =
      absl::StrCat(options_.offload.spill_dir, "/memprofd-placement-", getpid(), "-",
                   placement_files_++, ".safetensors");
  snapshot::TensorList host;
  RETURN_IF_ERROR(TorchBoundary("staging weights for disk placement", [&] {
    for (const auto& [name, t] : weights) host.emplace_back(name, t.detach());
  }));
  RETURN_IF_ERROR(
      snapshot::WriteSafetensorsFile(path, host, options_.snapshot_staging_bytes));
  absl::StatusOr<std::unique_ptr<snapshot::SafetensorsFile>> file =
      snapshot::SafetensorsFile::Open(path);
  ::unlink(path.c_str());
  if (!file.ok()) return file.status();
  ASSIGN_OR_RETURN(snapshot::TensorList on_disk, (*file)->Tensors());
  return model.PlaceModule(module, placement, on_disk);
}

void ModelHost::DescribeSource(snapshot::SnapshotOptions* options) const {
  options->carried_files = carried_files_;
  options->model_source = model_source_;
}

absl::StatusOr<offload::Offloader*> ModelHost::OffloaderFor(
    const offload::OffloadOptions& options) {
  if (!offloader_ || offloader_->options() != options) {
    offloader_.reset();
    ASSIGN_OR_RETURN(offloader_,
                     offload::Offloader::Create(options, c10::Device(device_)));
  }
  return offloader_.get();
}

void ModelHost::PublishModel() {
  ModelSummary summary;
  summary.source = model_source_;
  summary.config = model_->config();
  summary.num_parameters = model_->NumParameters();
  summary.base_dtype = BaseDtypeOf(model_->base_dtype());
  summary.device = device_;
  summary.steps_trained = trainer_ ? trainer_->global_step() : 0;
  summary.load_notes = load_notes_;
  // A parameter that is the same tensor data as one listed before (a tied
  // head) is listed once, under the first name, with its own name in
  // `tied`. (Parameters mapped from one file share a storage at different
  // offsets, so the data's address tells them apart, not the storage.)
  std::map<std::pair<const void*, const void*>, size_t> listed;
  std::set<const void*> storages;
  for (const auto& [name, t] : model_->NamedParameters()) {
    const std::pair<const void*, const void*> data(t.storage().unsafeGetStorageImpl(),
                                                   t.data_ptr());
    if (auto it = listed.find(data); it != listed.end() && t.numel() > 0) {
      summary.parameters[it->second].tied.push_back(name);
      continue;
    }
    listed.emplace(data, summary.parameters.size());
    if (storages.insert(data.first).second) {
      summary.parameter_bytes += static_cast<int64_t>(t.storage().nbytes());
    }
    ParameterSummary p;
    p.name = name;
    p.shape = t.sizes().vec();
    p.dtype = std::string(c10::toString(t.scalar_type()));
    p.bytes = static_cast<int64_t>(t.nbytes());
    p.placement = model_->PlacementOf(ModuleOfParameter(name));
    summary.parameters.push_back(std::move(p));
  }
  absl::MutexLock lock(&mu_);
  summary_ = std::move(summary);
}

void ModelHost::PublishCategories() {
  memory::CategoryBytes bytes = CategoriesNow();
  if (offloader_) {
    bytes.offloaded_host = offloader_->host_bytes_held();
    bytes.offloaded_disk = offloader_->disk_bytes_held();
  }
  absl::MutexLock lock(&mu_);
  categories_ = bytes;
}

void ModelHost::PublishRun() {
  std::optional<RunState> run;
  if (trainer_) run = trainer_->run();
  absl::MutexLock lock(&mu_);
  run_ = std::move(run);
}

void ModelHost::PublishStep(int64_t global_step) {
  {
    absl::MutexLock lock(&mu_);
    if (summary_) summary_->steps_trained = global_step;
  }
  PublishCategories();
  PublishRun();
}

std::optional<ModelSummary> ModelHost::Summary() const {
  absl::MutexLock lock(&mu_);
  return summary_;
}

std::optional<RunState> ModelHost::Run() const {
  absl::MutexLock lock(&mu_);
  return run_;
}

memory::CategoryBytes ModelHost::Categories() const {
  memory::CategoryBytes c = CategoriesNow();
  absl::MutexLock lock(&mu_);
  c.offloaded_host = categories_.offloaded_host;
  c.offloaded_disk = categories_.offloaded_disk;
  return c;
}

memory::CategoryBytes ModelHost::PublishedCategories() const {
  absl::MutexLock lock(&mu_);
  return categories_;
}

memory::CategoryBytes ModelHost::CategoriesNow() const {
  const std::array<int64_t, kNumCategories> b =
      recorder_.CategoryBytesOf(recorder_device_);
  memory::CategoryBytes c;
  for (int i = 0; i < kNumCategories; ++i) {
    c.Of(static_cast<Category>(i)) = b[static_cast<size_t>(i)];
  }
  c.activations_and_temporaries = c.saved_activations + c.temporaries;
  return c;
}

}  // namespace memprofd
