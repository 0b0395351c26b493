#ifndef MEMPROFD_CORE_SESSION_SESSION_H_
#define MEMPROFD_CORE_SESSION_SESSION_H_

// The daemon's engine: one owner thread that runs everything touching the
// model (loads, training steps, snapshots), the registry of operations it
// works through, and the state it publishes for readers. RPC handlers never
// block on it: they validate, enqueue work, get an Operation back, and read
// published copies.
//
// Thread-safety: every public method may be called from any thread. Work on
// the model runs on the owner thread only.

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/common/operation.h"
#include "core/memory/category_bytes.h"
#include "core/memory/memory_stats.h"
#include "core/model/config.h"
#include "core/model/placement.h"
#include "core/offload/offload_options.h"
#include "core/snapshot/manifest.h"
#include "core/snapshot/snapshot_options.h"
#include "core/train/train_options.h"

namespace at {
class Tensor;
}

namespace memprofd {

class LlamaModel;
class TokenDataset;
class Trainer;
namespace offload {
class Offloader;
}
namespace snapshot {
struct LoadedWeights;
}

struct SessionOptions {
  // "auto" (cuda:0 when LibTorch sees a GPU, else cpu), "cpu", "cuda:N".
  std::string device = "auto";
  // The model loaded at start: a preset name or a Hugging Face directory.
  // Empty: none.
  std::string model = "tiny";
  uint64_t model_seed = 0;
  // Where snapshots live; empty disables them (FAILED_PRECONDITION).
  std::string snapshot_root;
  // Defaults for training requests that leave offloading unset.
  offload::OffloadOptions offload;
  // Pick offload.target from the device: disk on a CPU, host on a GPU.
  bool offload_target_auto = true;
  // The staging buffer of the snapshot writer.
  int64_t snapshot_staging_bytes = int64_t{64} << 20;
  // Keep the newest N snapshots (0 keeps all).
  int64_t keep_last = 0;
  // Take a snapshot every N steps of training (0: never).
  int64_t snapshot_every_steps = 0;
};

struct LoadModelSpec {
  // Exactly one of preset / hf_directory.
  std::string preset;
  std::string hf_directory;
  uint64_t seed = 0;
  // Module name ("model.layers.3") -> placement; unlisted modules: kDevice.
  std::vector<std::pair<std::string, Placement>> placement;
};

struct ParameterSummary {
  std::string name;
  Placement placement = Placement::kDevice;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t bytes = 0;
};

// What is known of the loaded model, published after every change.
struct ModelSummary {
  std::string source;  // "preset:tiny" or the directory
  LlamaConfig config;
  int64_t num_parameters = 0;
  int64_t parameter_bytes = 0;
  std::string device;
  int64_t steps_trained = 0;
  std::vector<ParameterSummary> parameters;
};

struct TrainSpec {
  TrainOptions train;
  // Each field unset takes the session's default (SessionOptions::offload,
  // the daemon's flags); StartTraining merges and validates them.
  offload::OffloadRequest offload;
};

// One training step as the session reports it (the event type of TRAIN
// operations).
struct SessionStepReport {
  StepReport step;
  offload::OffloadStats offload;
  // Peak bytes allocated on the compute device during the step.
  int64_t peak_allocated_bytes = 0;
};

enum class SnapshotMode { kBlocking, kAsync };

struct SnapshotSpec {
  std::string name;
  snapshot::SnapshotOptions options;  // staging and tie flags are filled in
  SnapshotMode mode = SnapshotMode::kBlocking;
};

// The result of a SNAPSHOT operation.
struct SnapshotResult {
  snapshot::SnapshotManifest manifest;
  SnapshotMode mode = SnapshotMode::kBlocking;
};

// Counters for /metrics, cumulative since start.
struct SessionCounters {
  int64_t steps_total = 0;
  int64_t tokens_total = 0;
  double last_loss = 0;
  bool has_loss = false;
  // Durations not yet taken by TakeDurations (bounded).
  std::vector<double> recent_step_seconds;
  std::vector<double> recent_snapshot_seconds;
  offload::OffloadStats offload_totals;
  int64_t snapshots_succeeded = 0;
  int64_t snapshots_failed = 0;
  int64_t snapshot_bytes_total = 0;
  memory::CategoryBytes categories;
  std::optional<SessionStepReport> last_step;
};

class Session {
 public:
  // Resolves the device, installs memory accounting and the offload engine,
  // cleans leftover temporary snapshot directories, and loads the start model
  // on the owner thread (blocking until it is loaded). Errors: the device's
  // (see ResolveDevice), the model's (INVALID_ARGUMENT for an unknown
  // preset, NOT_FOUND / DATA_LOSS for a directory).
  static absl::StatusOr<std::unique_ptr<Session>> Create(const SessionOptions& options);

  // Shutdown(), then joins the owner and any async snapshot writer.
  ~Session();

  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const std::string& device() const { return device_; }
  absl::Time start_time() const { return start_time_; }
  OperationRegistry& operations() { return operations_; }

  // Queues a model load (LOAD_MODEL operation). INVALID_ARGUMENT for a spec
  // without exactly one source, FAILED_PRECONDITION while training runs,
  // UNIMPLEMENTED for placements this build cannot honour.
  absl::StatusOr<std::shared_ptr<Operation>> LoadModel(const LoadModelSpec& spec);

  // Validates and queues training (TRAIN operation; events are
  // SessionStepReport, result TrainResult). INVALID_ARGUMENT for bad options
  // or data (read here, so the caller learns at once), FAILED_PRECONDITION
  // without a model, ABORTED while another training is queued or running.
  absl::StatusOr<std::shared_ptr<Operation>> StartTraining(const TrainSpec& spec);

  // Queues a snapshot at the next step boundary (SNAPSHOT operation; result
  // snapshot::SnapshotManifest). INVALID_ARGUMENT for a bad name,
  // ALREADY_EXISTS when taken, FAILED_PRECONDITION without a model or a
  // snapshot root.
  absl::StatusOr<std::shared_ptr<Operation>> StartSnapshot(const SnapshotSpec& spec);

  absl::StatusOr<std::vector<snapshot::SnapshotManifest>> ListSnapshots() const;
  absl::StatusOr<snapshot::SnapshotManifest> DescribeSnapshot(
      const std::string& name) const;
  absl::Status DeleteSnapshot(const std::string& name);

  // Operations (LOAD_MODEL, TRAIN, SNAPSHOT). NOT_FOUND for an unknown id.
  absl::StatusOr<std::shared_ptr<Operation>> GetOperation(const std::string& id) const;
  // Newest first; `kind` unset lists every kind.
  std::vector<std::shared_ptr<Operation>> ListOperations(
      std::optional<OperationKind> kind, bool active_only) const;
  // Asks operation `id` to stop (training stops at its next step boundary).
  // NOT_FOUND for an unknown id, FAILED_PRECONDITION when it is already done.
  absl::StatusOr<std::shared_ptr<Operation>> CancelOperation(const std::string& id);
  int64_t ActiveOperationCount() const;

  // Memory, through the process's recorder (every allocation and free the
  // accounting sees). Thread-safe.
  memory::MemoryStatsView MemoryStats() const;
  void ResetPeakMemory();
  // Starts recording the history of allocations and frees, keeping the newest
  // `max_entries` (unset: kDefaultHistoryEntries). INVALID_ARGUMENT for
  // max_entries < 1.
  absl::Status StartMemoryRecording(std::optional<int64_t> max_entries);
  // Stops recording; the history is kept for DumpMemoryHistory until `clear`.
  void StopMemoryRecording(bool clear);
  // The history (and on CUDA the allocator's segments and trace) as a
  // memory_viz pickle. FAILED_PRECONDITION when nothing was recorded.
  absl::StatusOr<std::string> DumpMemoryHistory() const;
  static constexpr int64_t kDefaultHistoryEntries = 100000;

  // Published copies.
  std::optional<ModelSummary> Model() const;
  SessionCounters Counters() const;
  // The step and snapshot durations recorded since the last call, for one
  // consumer (the metrics histograms).
  void TakeDurations(std::vector<double>* step_seconds,
                     std::vector<double>* snapshot_seconds);

  // Runs `work` on the owner thread, after the work queued before it.
  // UNAVAILABLE once Shutdown has begun.
  absl::Status Post(std::function<void()> work);

  // Stops accepting work, cancels every active operation (training stops at
  // its step boundary), lets queued items finish as CANCELLED, joins the
  // owner thread. Idempotent.
  void Shutdown();
  bool draining() const;

  // For --snapshot_on_shutdown: a blocking snapshot named `name` of the
  // current model, taken on the owner thread before it stops. Call before
  // Shutdown.
  absl::Status SnapshotNow(const std::string& name);

 private:
  explicit Session(const SessionOptions& options, std::string device);
  void OwnerLoop();

  // Owner thread only.
  absl::Status LoadOnOwner(const LoadModelSpec& spec);
  void RunTraining(const std::shared_ptr<Operation>& op, const TrainSpec& spec,
                   const offload::OffloadOptions& offload_options,
                   const TokenDataset& data);
  void MaybeQueuePeriodicSnapshot(int64_t global_step);
  void RunBoundaryWork();
  // Queues a snapshot to run at the next step boundary, or when idle.
  absl::StatusOr<std::shared_ptr<Operation>> QueueSnapshot(SnapshotSpec spec);
  void RunSnapshot(const std::shared_ptr<Operation>& op, const SnapshotSpec& spec);
  void FinishSnapshot(const std::shared_ptr<Operation>& op,
                      absl::StatusOr<snapshot::SnapshotManifest> manifest,
                      SnapshotMode mode);
  void RunAsyncWrite(const std::shared_ptr<Operation>& op, const SnapshotSpec& spec,
                     std::vector<std::pair<std::string, at::Tensor>> copies,
                     std::string config_json, int64_t staged_bytes);
  // Places one module of a model being loaded; true when its weights map
  // the loaded directory's files.
  absl::StatusOr<bool> PlaceModule(LlamaModel& model, const std::string& module,
                                   Placement placement,
                                   const snapshot::LoadedWeights* mapped);
  void PublishModel();
  void PublishCategories();
  void ApplyRetention();

  const SessionOptions options_;
  const std::string device_;
  const absl::Time start_time_;
  OperationRegistry operations_;

  // Owned by the owner thread.
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<offload::Offloader> offloader_;
  std::string model_source_;
  int64_t placement_files_ = 0;
  // Host bytes held by async snapshot copies not yet written.
  std::atomic<int64_t> async_staging_bytes_{0};

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  // Run at the next step boundary (or next owner-queue item when idle).
  std::deque<std::function<void()>> boundary_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool training_active_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<ModelSummary> model_summary_ ABSL_GUARDED_BY(mu_);
  SessionCounters counters_ ABSL_GUARDED_BY(mu_);
  // Bytes of counters_.categories that live outside the attributed tensors
  // but inside the measured allocator (async snapshot copies on CPU).
  int64_t categories_external_in_allocator_ ABSL_GUARDED_BY(mu_) = 0;
  // The snapshot directory disk-placed weights map (empty: none); it may not
  // be deleted while mapped.
  std::string mapped_directory_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> async_writers_ ABSL_GUARDED_BY(mu_);
  std::thread owner_;
};

// Resolves "auto", "cpu", "cuda", "cuda:N" against this build and machine:
// INVALID_ARGUMENT for an unparsable name; UNIMPLEMENTED for cuda on a build
// without CUDA; FAILED_PRECONDITION for a GPU that is not there.
absl::StatusOr<std::string> ResolveDevice(const std::string& requested);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SESSION_H_
