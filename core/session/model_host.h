#ifndef MEMPROFD_CORE_SESSION_MODEL_HOST_H_
#define MEMPROFD_CORE_SESSION_MODEL_HOST_H_

// The session's model host: the one loaded model with what belongs to it,
// and the copies of it any thread may read. It loads a model (a preset or a
// Hugging Face directory, its modules placed as asked, with a checkpoint's
// training state when resuming) and swaps it in only once every stage
// succeeded; it owns that model's trainer and the activation offloader its
// training runs use (made for a run's offload options, kept while the next
// run asks the same, released with the model it served); and it publishes a
// summary of the model, the trainer's run (for resume merges) and the
// offloaded bytes, which the session's readers take copies of.
//
// Threads:
// - The session's owner thread: Load, model, trainer, offloader,
//   OffloaderFor, and the Publish* calls. Before that thread starts and
//   after it has been joined, the thread that makes or destroys the session.
// - Any thread: Summary, Run, Categories, PublishedCategories,
//   recorder_device, ConfineDirectory; ReadClientConfig too, but it reads a
//   file, so never on one of gRPC's threads.
//
// Invariants:
// - A failed or cancelled Load leaves the model, trainer, offloader and
//   everything published as they were.
// - The offloader and the trainer never outlive the model they serve: a
//   load releases them before it swaps the model, and the destructor goes
//   trainer, offloader, model.
// - Once a model is loaded, Summary() describes it: a load and
//   PublishModel replace it whole, PublishStep moves only its steps_trained.
//   Before the first load it is unset.
// - Locks: the host's own lock guards the published copies only. The host
//   calls nothing (its callback, the recorder) with that lock held, and the
//   session never calls into the host with its own lock held, so the two
//   locks are never nested.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/common/files.h"
#include "core/memory/category_bytes.h"
#include "core/session/session_types.h"
#include "core/train/trainer_state.h"

namespace memprofd {

class LlamaModel;
class Trainer;
namespace memory {
class MemoryRecorder;
}
namespace offload {
class Offloader;
}
namespace snapshot {
struct CarriedFiles;
struct LoadedWeights;
struct SnapshotOptions;
}  // namespace snapshot

class ModelHost {
 public:
  // `options` (offload.spill_dir and snapshot_staging_bytes, for modules
  // placed on disk) and `recorder` outlive the host. `device` is the
  // session's compute device, resolved ("cpu", "cuda:N"). `model_roots` are
  // where a client-named model directory may lead (ConfineDirectory). Loads
  // nothing.
  ModelHost(const SessionOptions& options, std::string device,
            memory::MemoryRecorder& recorder, PathRoots model_roots);
  // Releases the trainer, the offloader, then the model.
  ~ModelHost();

  ModelHost(const ModelHost&) = delete;
  ModelHost& operator=(const ModelHost&) = delete;

  // Owner thread: loads the model `spec` names (its source checked by
  // Session::LoadModel; hf_directory confined already when a client named
  // it), places its modules, reads the checkpoint's training state with
  // spec.resume, then swaps it in: a fresh trainer (or the restored one),
  // no offloader, the recorder's step records cleared, the memory tagged,
  // everything published. `cancelled` (may be empty) is polled between the
  // stages (weights read, model built, weights copied, checkpoint read):
  // true stops it with CANCELLED. Errors: INVALID_ARGUMENT for an unknown
  // preset or an unusable config.json, NOT_FOUND for a missing directory,
  // FAILED_PRECONDITION for a directory without weights (unless
  // init_weights or init_if_no_weights) or a checkpoint that does not fit
  // the model, DATA_LOSS for a corrupt file, RESOURCE_EXHAUSTED when the
  // model cannot fit on the device, and placing a module's own errors. On
  // every error the model loaded before is unchanged.
  absl::Status Load(const LoadModelSpec& spec,
                    const std::function<bool()>& cancelled = {});

  // Owner thread: the loaded model and its trainer (null: none loaded), and
  // the offloader of the last training run (null: none since the load).
  LlamaModel* model() const { return model_.get(); }
  Trainer* trainer() const { return trainer_.get(); }
  offload::Offloader* offloader() const { return offloader_.get(); }
  // Owner thread, as a training run starts: the offloader for `options`,
  // the one held when it was made for the same options, else a new one
  // (the old one released first). The factory's errors (offloader.h); no
  // offloader is held then.
  absl::StatusOr<offload::Offloader*> OffloaderFor(
      const offload::OffloadOptions& options);

  // Owner thread, a model loaded: where the model came from and the files
  // of its directory every snapshot of it carries (carried_files.h), into
  // `options` (model_source, carried_files).
  void DescribeSource(snapshot::SnapshotOptions* options) const;

  // Owner thread: publish what readers see. PublishModel: the summary of the
  // model as it is now (a model must be loaded); PublishCategories: the
  // categories now with the offloader's bytes; PublishRun: the trainer's run.
  // PublishStep, after each completed training step: the summary's
  // steps_trained, then PublishCategories and PublishRun.
  void PublishModel();
  void PublishCategories();
  void PublishRun();
  void PublishStep(int64_t global_step);

  // Any thread: the published summary (unset: no model is loaded), the
  // trainer's run (unset: none to resume).
  std::optional<ModelSummary> Summary() const;
  std::optional<RunState> Run() const;
  // Any thread: the compute device's bytes by category now, with the
  // offloaded bytes (outside the allocator) as last published.
  memory::CategoryBytes Categories() const;
  // Any thread: the categories as last published (PublishCategories).
  memory::CategoryBytes PublishedCategories() const;
  // Any thread: the recorder's number for the compute device.
  int recorder_device() const { return recorder_device_; }
  // Any thread: the canonical path of a client-named model directory inside
  // the model roots (PathRoots::Confine's errors, naming `what`, the
  // request's field).
  absl::StatusOr<std::string> ConfineDirectory(
      const std::string& directory, absl::string_view what = "hf_directory") const;
  // Any thread but gRPC's: the model config of a client-named directory's
  // config.json alone (weights are not looked at), the directory confined
  // as ConfineDirectory confines it. ConfineDirectory's errors; NOT_FOUND
  // when it is not a directory; INVALID_ARGUMENT, naming `what` and the
  // directory, when it has no readable config.json or LlamaConfig::FromJson
  // refuses it.
  absl::StatusOr<LlamaConfig> ReadClientConfig(const std::string& directory,
                                               absl::string_view what) const;

 private:
  // Places one module of a model being loaded. Its weights placed on disk
  // go to a spill file of the daemon's own, mapped and unlinked at once:
  // never the loaded directory's files, which could be truncated under the
  // mapping (a mapped page past the end raises SIGBUS and kills the
  // process), even the daemon's own snapshots.
  absl::Status PlaceModule(LlamaModel& model, const std::string& module,
                           Placement placement);
  // The compute device's bytes by category now, as the recorder has them.
  memory::CategoryBytes CategoriesNow() const;

  const SessionOptions& options_;
  const std::string device_;
  memory::MemoryRecorder& recorder_;
  const int recorder_device_;
  // Where client-named model directories may lead: the data roots and the
  // snapshot root (SessionOptions).
  const PathRoots model_roots_;

  // The owner thread's.
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<offload::Offloader> offloader_;
  std::string model_source_;
  // The loaded directory's generation settings and tokenizer (empty for a
  // preset), and what the load has to tell (ModelSummary::load_notes).
  std::shared_ptr<const snapshot::CarriedFiles> carried_files_;
  std::vector<std::string> load_notes_;
  // Numbers the files of modules placed on disk.
  int64_t placement_files_ = 0;

  mutable absl::Mutex mu_;
  std::optional<ModelSummary> summary_ ABSL_GUARDED_BY(mu_);
  // The trainer's run (Trainer::run()), published for resume merges.
  std::optional<RunState> run_ ABSL_GUARDED_BY(mu_);
  memory::CategoryBytes categories_ ABSL_GUARDED_BY(mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_MODEL_HOST_H_
