#include "core/session/snapshot_scheduler.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/common/phase.h"
#include "core/common/status_macros.h"
#include "core/common/threads.h"
#include "core/model/llama.h"
#include "core/session/merged_weights.h"
#include "core/session/model_host.h"
#include "core/session/optimizer_shards.h"
#include "core/session/owner_thread.h"
#include "core/session/session_counters.h"
#include "core/snapshot/checkpoint_files.h"
#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"
#include "core/train/trainer.h"
#include "core/train/trainer_state.h"

namespace memprofd {
namespace {

// What every snapshot call says when the daemon has no snapshot root.
absl::Status SnapshotsOff(absl::StatusCode code) {
  return OptionError(
      code, "snapshot_root",
      "snapshots are off: the daemon has no snapshot_root; start it with one");
}

// The hidden directory where the other ranks' optimizer files of
// checkpoint `name` wait for rank 0's (CleanLeftovers removes it after a
// kill, as the writer's own temporary directory).
std::string SideDirectory(const std::string& root, const std::string& name) {
  return (std::filesystem::absolute(root) /
          absl::StrCat(snapshot::kTempPrefix, name, "-ranks"))
      .lexically_normal()
      .string();
}

void RemoveSideDirectory(const snapshot::CheckpointPayload& checkpoint) {
  if (checkpoint.other_ranks_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(checkpoint.other_ranks_dir, ec);
}

}  // namespace

absl::Status SnapshotScheduler::GatherOptimizerShards(
    const LlamaModel& model, const std::string& name,
    snapshot::CheckpointPayload* checkpoint) {
  const std::string side = SideDirectory(options_.snapshot_root, name);
  std::error_code ec;
  std::filesystem::remove_all(side, ec);  // a leftover of an earlier attempt
  if (!std::filesystem::create_directories(side, ec) || ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        "creating ", side, " for the other ranks' optimizer state: ", ec.message(),
        "; make snapshot_root a writable directory"));
  }
  checkpoint->other_ranks_dir = side;
  if (absl::Status s = sharded_.GatherOptimizerShards(side); !s.ok()) {
    RemoveSideDirectory(*checkpoint);
    return s;
  }
  snapshot::OptimizerShardingDescription sharding;
  sharding.world_size = options_.world.world_size;
  sharding.level = std::string(ShardingName(RunSharding(options_)));
  sharding.parameters = ShardedParameters(model);
  checkpoint->sharding = std::move(sharding);
  return absl::OkStatus();
}

absl::Status SnapshotScheduler::WriteOptimizerShard(const std::string& dir) {
  Trainer* const trainer = host_.trainer();
  if (trainer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", options_.world.rank,
        " has no model loaded, so no optimizer state to checkpoint: start every rank "
        "with the same model option"));
  }
  PhaseScope phase(Phase::kSnapshot);
  return snapshot::WriteRankOptimizerFile(
             dir, options_.world.rank, options_.world.world_size,
             trainer->NamedOptimizerState(), trainer->OptimizerMetadata(),
             options_.snapshot_staging_bytes)
      .status();
}

SnapshotScheduler::SnapshotScheduler(Parts parts)
    : options_(parts.options),
      follower_(parts.follower),
      operations_(parts.operations),
      sharded_(parts.sharded),
      host_(parts.host),
      owner_(parts.owner),
      counters_(parts.counters),
      observers_(parts.observers) {}

SnapshotScheduler::~SnapshotScheduler() { Join(); }

void SnapshotScheduler::Join() {
  std::vector<std::thread> writers;
  {
    absl::MutexLock lock(&mu_);
    writers.swap(async_writers_);
  }
  for (auto& t : writers) t.join();
}

absl::Status SnapshotScheduler::QueueBoundaryWork(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  // When no training runs, this empty item wakes the owner thread, which
  // runs boundary work after every item. Posted under the lock, before the
  // work is queued: the owner's RunBoundaryWork after the empty item waits
  // for the lock, so it finds the work.
  RETURN_IF_ERROR(owner_.Post([] {}));
  boundary_.push_back(std::move(work));
  return absl::OkStatus();
}

bool SnapshotScheduler::HasBoundaryWork() const {
  absl::MutexLock lock(&mu_);
  return !boundary_.empty();
}

void SnapshotScheduler::RunBoundaryWork() {
  for (;;) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      if (boundary_.empty()) return;
      work = std::move(boundary_.front());
      boundary_.pop_front();
    }
    work();
  }
}

absl::StatusOr<std::shared_ptr<Operation>> SnapshotScheduler::StartSnapshot(
    const SnapshotSpec& spec, bool daemons_own) {
  if (options_.snapshot_root.empty()) {
    return SnapshotsOff(absl::StatusCode::kFailedPrecondition);
  }
  RETURN_IF_ERROR(snapshot::ValidateSnapshotName(spec.name));
  RETURN_IF_ERROR(snapshot::CheckCheckpointDtype(spec.options));
  if (!host_.Summary().has_value())
    return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  if (snapshot::DescribeSnapshot(options_.snapshot_root, spec.name).ok()) {
    return absl::AlreadyExistsError(
        absl::StrCat("a snapshot named '", spec.name,
                     "' exists; pick another name or DeleteSnapshot it"));
  }
  return QueueSnapshot(spec, daemons_own);
}

absl::StatusOr<std::shared_ptr<Operation>> SnapshotScheduler::QueueSnapshot(
    SnapshotSpec spec, bool daemons_own) {
  spec.options.staging_bytes = options_.snapshot_staging_bytes;
  std::shared_ptr<Operation> op;
  if (daemons_own) {
    op = operations_.Create(OperationKind::kSnapshot);
  } else {
    ASSIGN_OR_RETURN(op, operations_.Admit(OperationKind::kSnapshot));
  }
  if (!QueueBoundaryWork([this, op, spec] { RunSnapshot(op, spec); }).ok()) {
    op->Finish(absl::UnavailableError("memprofd is shutting down"));
    return absl::UnavailableError(
        "memprofd is shutting down; retry against another instance");
  }
  return op;
}

void SnapshotScheduler::MaybeQueuePeriodicSnapshot(int64_t global_step) {
  // Data parallel: rank 0 writes the run's snapshots, the followers wait.
  if (follower_ || options_.snapshot_every_steps <= 0 || options_.snapshot_root.empty() ||
      global_step % options_.snapshot_every_steps != 0) {
    return;
  }
  SnapshotSpec spec;
  spec.name = absl::StrCat("step-", global_step);
  spec.options.kind = options_.auto_snapshot_kind;
  if (snapshot::DescribeSnapshot(options_.snapshot_root, spec.name).ok()) return;
  absl::StatusOr<std::shared_ptr<Operation>> op =
      QueueSnapshot(spec, /*daemons_own=*/true);
  if (!op.ok())
    LogWarning(absl::StrCat("periodic snapshot not queued: ", op.status().message()));
}

namespace {

// A model with LoRA adapters trains them alone: a snapshot of it holds the
// adapters (as peft saves them, with their training state in a checkpoint)
// or the model with them merged; the base's weights would drop the training
// silently. A model without has nothing to save or merge as adapters.
absl::Status CheckKindFitsModel(snapshot::SnapshotKind kind, const LlamaModel& model) {
  if (kind == snapshot::SnapshotKind::kCheckpoint) return absl::OkStatus();
  const bool lora_kind =
      kind == snapshot::SnapshotKind::kAdapter || kind == snapshot::SnapshotKind::kMerged;
  if (lora_kind == model.lora().has_value()) return absl::OkStatus();
  if (lora_kind) {
    return absl::FailedPreconditionError(
        absl::StrCat("the model has no LoRA adapters to ",
                     kind == snapshot::SnapshotKind::kAdapter ? "save" : "merge",
                     ": train with lora_r first, or take a weights snapshot"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the model trains LoRA adapters on a frozen base: a ",
      snapshot::SnapshotKindName(kind),
      " snapshot would hold the base without them; take an adapter snapshot (kind "
      "adapter), a checkpoint of them (kind checkpoint) or the model with them folded "
      "in (kind merged)"));
}

}  // namespace

void SnapshotScheduler::RunSnapshot(const std::shared_ptr<Operation>& op,
                                    const SnapshotSpec& spec) {
  if (op->cancel_requested()) {
    op->Finish(absl::CancelledError("cancelled before it started"));
    return;
  }
  op->MarkRunning();
  PhaseScope phase(Phase::kSnapshot);
  LlamaModel& model = *host_.model();
  Trainer* const trainer = host_.trainer();
  SnapshotSpec s = spec;
  s.options.tie_word_embeddings = model.config().tie_word_embeddings;
  s.options.global_step = trainer ? trainer->global_step() : 0;
  host_.DescribeSource(&s.options);
  if (absl::Status fits = CheckKindFitsModel(s.options.kind, model); !fits.ok()) {
    FinishSnapshot(op, fits, s.mode);
    return;
  }
  const bool checkpointing = s.options.kind == snapshot::SnapshotKind::kCheckpoint;
  // A LoRA model's checkpoint holds its adapters as an adapter snapshot
  // does, with their training state (SnapshotWriter::WriteCheckpoint).
  if (checkpointing && model.lora()) s.options.kind = snapshot::SnapshotKind::kAdapter;
  const bool adapter = s.options.kind == snapshot::SnapshotKind::kAdapter;
  const bool merged = s.options.kind == snapshot::SnapshotKind::kMerged;
  const std::string config_json =
      adapter ? AdapterConfigJson(*model.lora(), s.options.model_source)
              : model.config().ToJson();
  // A checkpoint's training state, taken here at the step boundary with the
  // weights: the optimizer tensors are the live ones (streamed, never copied
  // whole, in blocking mode), the trainer state a copy.
  std::shared_ptr<snapshot::CheckpointPayload> checkpoint;
  if (checkpointing) {
    checkpoint = std::make_shared<snapshot::CheckpointPayload>();
    checkpoint->optimizer_tensors = trainer->NamedOptimizerState();
    checkpoint->optimizer_metadata = trainer->OptimizerMetadata();
    const TrainerState state = trainer->State();
    checkpoint->trainer_state_json = TrainerStateToJson(state);
    // The state holds the base's fingerprint already (a LoRA model's).
    s.options.lora_base_fingerprint = state.lora_base_fingerprint;
    if (OptimizerStateSharded(options_)) {
      absl::Status gathered = GatherOptimizerShards(model, s.name, checkpoint.get());
      if (!gathered.ok()) {
        FinishSnapshot(op, gathered, s.mode);
        return;
      }
    }
  }
  // What the adapters trained on, so that loading them checks the base.
  if (adapter && !checkpoint) s.options.lora_base_fingerprint = model.BaseFingerprint();
  // A fully sharded run's parameters are gathered one at a time as they
  // are read, every rank taking part, until `access` goes; a merged
  // snapshot's projections are merged one at a time the same way (a LoRA
  // model is never sharded).
  snapshot::TensorList weights;
  absl::StatusOr<std::unique_ptr<snapshot::TensorAccess>> access;
  if (adapter) {
    s.options.tie_word_embeddings = false;
    for (auto& [name, t] : model.NamedAdapters()) {
      weights.emplace_back(PeftAdapterName(name), t);
    }
    access = sharded_.StreamParameters(weights);
  } else if (merged) {
    auto merging = std::make_unique<MergedWeights>(model);
    weights = merging->tensors();
    access = std::move(merging);
  } else {
    weights = model.NamedBaseParameters();
    access = sharded_.StreamParameters(weights);
  }
  if (!access.ok()) {
    if (checkpoint) RemoveSideDirectory(*checkpoint);
    FinishSnapshot(op, access.status(), s.mode);
    return;
  }
  if (s.mode == SnapshotMode::kAsync) {
    // Copy every tensor to host memory now (the consistent point), then
    // write in the background while training goes on.
    absl::StatusOr<snapshot::AsyncSnapshotSource> copy =
        snapshot::CopyForAsyncSnapshot(weights, s.options, access->get());
    access->reset();
    if (!copy.ok()) {
      if (checkpoint) RemoveSideDirectory(*checkpoint);
      FinishSnapshot(op, copy.status(), s.mode);
      return;
    }
    int64_t held = copy->host_bytes;
    if (checkpoint) {
      snapshot::SnapshotOptions keep;  // the optimizer state in its own dtype
      absl::StatusOr<snapshot::AsyncSnapshotSource> opt_copy =
          snapshot::CopyForAsyncSnapshot(checkpoint->optimizer_tensors, keep);
      if (!opt_copy.ok()) {
        RemoveSideDirectory(*checkpoint);
        FinishSnapshot(op, opt_copy.status(), s.mode);
        return;
      }
      checkpoint->optimizer_tensors = std::move(opt_copy->tensors);
      held += opt_copy->host_bytes;
    }
    async_staging_bytes_ += held;
    s.options.held_host_bytes = held;
    s.options.enter_snapshot_phase = false;  // the phase belongs to the owner thread
    absl::MutexLock lock(&mu_);
    async_writers_.emplace_back(
        [this, op, s, copy = *std::move(copy), checkpoint, config_json, held]() mutable {
          NameThisThread("mpd-snapshot");
          RunAsyncWrite(op, s, std::move(copy.tensors), std::move(checkpoint),
                        config_json, held);
        });
    return;
  }
  snapshot::SnapshotWriter writer(options_.snapshot_root);
  auto progress = [&op](int64_t written, int64_t total) {
    op->SetProgress(written, total, "bytes", "");
  };
  auto cancel = [&op] { return op->cancel_requested(); };
  absl::StatusOr<snapshot::SnapshotManifest> manifest =
      checkpoint ? writer.WriteCheckpoint(s.name, weights, config_json, *checkpoint,
                                          s.options, progress, cancel, access->get())
                 : writer.Write(s.name, weights, config_json, s.options, progress, cancel,
                                access->get());
  access->reset();
  if (checkpoint) RemoveSideDirectory(*checkpoint);
  FinishSnapshot(op, std::move(manifest), s.mode);
}

void SnapshotScheduler::RunAsyncWrite(
    const std::shared_ptr<Operation>& op, const SnapshotSpec& spec,
    std::vector<std::pair<std::string, at::Tensor>> copies,
    std::shared_ptr<snapshot::CheckpointPayload> checkpoint, std::string config_json,
    int64_t staged_bytes) {
  snapshot::SnapshotWriter writer(options_.snapshot_root);
  auto progress = [&op](int64_t written, int64_t total) {
    op->SetProgress(written, total, "bytes", "");
  };
  auto cancel = [&op] { return op->cancel_requested(); };
  absl::StatusOr<snapshot::SnapshotManifest> manifest =
      checkpoint
          ? writer.WriteCheckpoint(spec.name, copies, config_json, *checkpoint,
                                   spec.options, progress, cancel)
          : writer.Write(spec.name, copies, config_json, spec.options, progress, cancel);
  copies.clear();
  if (checkpoint) RemoveSideDirectory(*checkpoint);
  checkpoint.reset();
  async_staging_bytes_ -= staged_bytes;
  FinishSnapshot(op, std::move(manifest), spec.mode);
}

void SnapshotScheduler::FinishSnapshot(
    const std::shared_ptr<Operation>& op,
    absl::StatusOr<snapshot::SnapshotManifest> manifest, SnapshotMode mode) {
  counters_.Update([&](SessionCounters& c) {
    if (manifest.ok()) {
      c.snapshots_succeeded += 1;
      c.snapshot_bytes_total += manifest->bytes_written;
    } else {
      c.snapshots_failed += 1;
    }
  });
  if (!manifest.ok()) {
    op->Finish(manifest.status());
    return;
  }
  for (const auto& observer : observers_.Get()) {
    observer->OnSnapshotPublished(*manifest);
  }
  SnapshotResult result{*std::move(manifest), mode};
  ApplyRetention();
  op->Finish(absl::OkStatus(), std::move(result));
}

void SnapshotScheduler::ApplyRetention() {
  if (options_.keep_last <= 0) return;
  absl::StatusOr<std::vector<std::string>> removed =
      snapshot::ApplyRetention(options_.snapshot_root, options_.keep_last);
  if (!removed.ok()) {
    LogWarning(absl::StrCat("retention (keep_last): ", removed.status().message()));
  }
}

absl::StatusOr<std::vector<snapshot::SnapshotManifest>> SnapshotScheduler::ListSnapshots()
    const {
  if (options_.snapshot_root.empty()) return std::vector<snapshot::SnapshotManifest>{};
  return snapshot::ListSnapshots(options_.snapshot_root);
}

absl::StatusOr<snapshot::SnapshotManifest> SnapshotScheduler::DescribeSnapshot(
    const std::string& name) const {
  if (options_.snapshot_root.empty()) {
    return SnapshotsOff(absl::StatusCode::kNotFound);
  }
  return snapshot::DescribeSnapshot(options_.snapshot_root, name);
}

absl::Status SnapshotScheduler::DeleteSnapshot(const std::string& name) {
  if (options_.snapshot_root.empty()) {
    return SnapshotsOff(absl::StatusCode::kNotFound);
  }
  absl::StatusOr<snapshot::SnapshotManifest> m =
      snapshot::DescribeSnapshot(options_.snapshot_root, name);
  if (!m.ok()) return m.status();
  std::error_code ec;
  const std::string dir = std::filesystem::weakly_canonical(m->directory, ec).string();
  std::map<std::string, std::string> loads;
  {
    absl::MutexLock lock(&mu_);
    loads = loads_in_flight_;
  }
  for (const auto& [id, named] : loads) {
    // A load reports done before its entry is dropped: a done one reads
    // nothing more.
    absl::StatusOr<std::shared_ptr<Operation>> load = operations_.Get(id);
    if (load.ok() && (*load)->View().done) continue;
    std::error_code named_ec;
    if (std::filesystem::weakly_canonical(named, named_ec).string() == dir && !named_ec) {
      return absl::FailedPreconditionError(absl::StrCat(
          "LoadModel operation ", id, " (queued or running) reads snapshot '", name,
          "'; wait for it or cancel it (CancelOperation) before deleting the snapshot"));
    }
  }
  return snapshot::DeleteSnapshot(options_.snapshot_root, name);
}

void SnapshotScheduler::TrackLoad(const std::string& id, const std::string& directory) {
  absl::MutexLock lock(&mu_);
  loads_in_flight_[id] = directory;
}

void SnapshotScheduler::ForgetLoad(const std::string& id) {
  absl::MutexLock lock(&mu_);
  loads_in_flight_.erase(id);
}

}  // namespace memprofd
