#ifndef MEMPROFD_CORE_SESSION_SESSION_TYPES_H_
#define MEMPROFD_CORE_SESSION_SESSION_TYPES_H_

// What goes into the session and what comes out of it: its options, the
// requests of its operations (each optional field unset takes the daemon's
// default), their results and events, and the counters it publishes. Plain
// structs, free of LibTorch, so that the server can fill and read them.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/dist/sharding.h"
#include "core/dist/world.h"
#include "core/memory/category_bytes.h"
#include "core/memory/oom_report.h"
#include "core/model/config.h"
#include "core/model/lora_options.h"
#include "core/model/placement.h"
#include "core/offload/offload_options.h"
#include "core/plan/planner.h"
#include "core/snapshot/manifest.h"
#include "core/snapshot/snapshot_options.h"
#include "core/train/train_options.h"

namespace memprofd {

struct SessionOptions {
  // "auto" (cuda:0 when LibTorch sees a GPU, else cpu), "cpu", "cuda:N".
  std::string device = "auto";
  // The model loaded at start: a preset name or a Hugging Face directory.
  // Empty: none.
  std::string model = "tiny";
  uint64_t model_seed = 0;
  // The most bytes this daemon may allocate on its compute device (0: as
  // much as the device has). Beyond it an allocation fails as on a device
  // of that size: RESOURCE_EXHAUSTED with an OOM report, and admission
  // plans against what it leaves. On a CPU device every tensor storage of
  // the process counts (memory::SetCpuMemoryLimit); on CUDA the caching
  // allocator reserves no more (memory::SetCudaMemoryLimit). Emulates a
  // smaller device, and keeps a shared one's daemons apart.
  int64_t device_memory_limit_bytes = 0;
  // Where snapshots live; empty disables them (FAILED_PRECONDITION).
  std::string snapshot_root;
  // The directories (absolute; canonical after symbolic links) that paths
  // named by clients must resolve into: training and evaluation data files,
  // and LoadModel's hf_directory (which may also be under snapshot_root).
  // Empty: no client-named file is opened (PERMISSION_DENIED), only the
  // embedded corpus, inline tokens, presets and snapshots.
  std::vector<std::string> data_roots;
  // The largest data file a client may name; it is mapped, not read into
  // memory, so this bounds address space, not RSS.
  int64_t max_data_file_bytes = int64_t{1} << 40;
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
  // What the daemon's own snapshots (every snapshot_every_steps, and
  // the shutdown snapshot) write: checkpoints by default, since they exist
  // to resume from after a crash or a preemption.
  snapshot::SnapshotKind auto_snapshot_kind = snapshot::SnapshotKind::kCheckpoint;
  // At start, instead of `model`: resume from a checkpoint under
  // snapshot_root. "latest": the newest checkpoint (by create time; the start
  // model when there is none yet, so that one command line serves the first
  // start and every restart); any other text: the checkpoint of that name.
  // Empty: no resume.
  std::string resume;
  // Where a step that runs out of memory writes its OOM report
  // (oom-step<N>-<unix ms>.json), created when first needed. Empty: reports
  // are only kept in memory (LastOomReport).
  std::string report_dir = "/tmp/memprofd-reports";
  // When set, the last completed step's peaks are written there after every
  // step, replacing the file atomically (a reader, or a process killed at any
  // point, sees a whole file). Its directory must exist and be writable.
  std::string peak_file;
  // Where this daemon sits in a data-parallel run (ReadWorldSpec of the
  // launcher's environment). A world of one rank is a single process.
  WorldSpec world;
  // The bound on the run's rendezvous and on every collective: a rank that
  // died or hangs makes the others fail within it.
  absl::Duration collective_timeout = absl::Seconds(60);
  // How much of the training state each rank of a data-parallel run keeps
  // (core/dist/sharding.h). Every rank of a run must use the same level:
  // the ranks compare theirs when they join the run and refuse to start on a
  // mismatch. A single process accepts any level and trains unsharded:
  // with one rank there is nothing to share the state with.
  Sharding sharding = Sharding::kNone;
  // The nice increment (0..19, over the process's nice value) of the
  // daemon's bulk work: the owner thread and
  // every thread it starts (the training's intra-op pool, the offloader's
  // threads, the snapshot writers), and the server's dump builder. Above 0,
  // the gRPC and metrics threads (which keep the process's value) run ahead
  // of that work when both want a CPU, so that RPCs are answered promptly on
  // a host whose cores the training fills; the training then gets what they
  // leave, and also yields to any other nice-0 process on the host. 0
  // leaves every thread at the process's priority.
  int bulk_nice = 0;
  // Keep the process's resident set near the bytes its tensors hold
  // (core/common/host_heap.h): every heap block of 128 KiB or more is a
  // mapping of its own, given back when freed, and the heap's free pages go
  // back after each piece of the owner thread's work. A plan's
  // host_rss_bytes holds only so. glibc's defaults (false) keep what a step
  // frees, so RSS grows to several times the allocator's bytes, but a CPU
  // step runs faster with them (no page faults for its big blocks:
  // docs/operating.md#host-memory has both figures). Process-wide, set at
  // start.
  bool return_host_memory = true;
  // Refuse a single-process Train whose step, planned just before the run
  // (its calibration plan), would peak above what the compute device has
  // free, or is beyond the plan's size admission, before it allocates
  // anything (RESOURCE_EXHAUSTED naming the peak). False: such a step runs,
  // and fails when an allocation does (with its OOM report).
  bool refuse_unfit_steps = true;
  // The wall-clock cap on one plan (PlanMemory, a training's calibration,
  // a budget's candidates), from when it starts running: past it the dry run
  // stops within a layer's work and the plan fails DEADLINE_EXCEEDED (a
  // training is then not admitted). The planner's size admission bounds
  // what a plan may cost; this bounds how long a slow host may take.
  absl::Duration max_plan_time = absl::Minutes(10);
};

// The one check of SessionOptions' values: Session::Create calls it first,
// and the daemon calls it on the options its flags fill, to refuse them
// before it starts anything. OK, or INVALID_ARGUMENT for the first field out
// of range, its message starting with the field's name in SessionOptions and
// ':' ("keep_last: must be >= 0 ..., got -1"; "offload." before
// OffloadOptions' fields, as offload::ValidateOffloadOptions writes them):
// keep_last or snapshot_every_steps < 0, snapshot_staging_bytes < 4096,
// collective_timeout or max_plan_time <= 0, bulk_nice outside 0..19, max_data_file_bytes
// < 1, resume without snapshot_root, and the offload options. Values only: paths
// (snapshot_root, data_roots, peak_file) are checked by Session::Create. Pure and
// thread-safe.
absl::Status ValidateSessionOptions(const SessionOptions& options);

struct LoadModelSpec {
  // Exactly one of preset / hf_directory.
  std::string preset;
  std::string hf_directory;
  uint64_t seed = 0;
  // Module name ("model.layers.3") -> placement; unlisted modules: kDevice.
  std::vector<std::pair<std::string, Placement>> placement;
  // hf_directory is a checkpoint: also restore its optimizer state and
  // training state (trainer_state.json), so that a Train with resume goes on
  // where it stopped.
  bool resume = false;
  // hf_directory: take its config.json only and initialise the weights from
  // `seed`, as for a preset. Without it a directory must hold weights for
  // every parameter. Refused with resume (a checkpoint's weights are its
  // point).
  bool init_weights = false;
  // A peft LoRA adapter directory (adapter_config.json,
  // adapter_model.safetensors) loaded onto the model: its adapters, which
  // later Trains train on a frozen base. Empty: none. With resume, a
  // checkpoint of adapters (their optimizer and training state beside them).
  std::string lora_adapter;
  // The dtype the weights are made and loaded in. bf16: half the bytes,
  // frozen from the start (the model trains LoRA adapters only, with
  // base_dtype bf16), never held in float32; no disk placement. Unset: the
  // resumed run's base_dtype when resuming a checkpoint of LoRA adapters
  // (its base then never holds float32 either), else float32.
  std::optional<BaseDtype> base_dtype;
  // A directory with config.json only gets weights from `seed` (the
  // operator's own model flag, where that is its documented meaning); a
  // directory with weights loads them. Never set from a client's request.
  bool init_if_no_weights = false;
  // hf_directory comes from the operator's own options (model, resume):
  // its files are read wherever their links lead. Otherwise (a client's
  // request, or a rank following one) every file read from the directory
  // must lie inside the data roots after its links. Never set from a
  // client's request.
  bool operator_named = false;
};

struct ParameterSummary {
  std::string name;
  Placement placement = Placement::kDevice;
  std::vector<int64_t> shape;
  std::string dtype;
  int64_t bytes = 0;
  // The other names of this parameter's storage ("lm_head.weight" for a
  // tied head's embedding), which the list does not repeat.
  std::vector<std::string> tied;
};

// What is known of the loaded model, published after every change.
struct ModelSummary {
  std::string source;  // "preset:tiny" or the directory
  LlamaConfig config;
  int64_t num_parameters = 0;
  int64_t parameter_bytes = 0;
  std::string device;
  int64_t steps_trained = 0;
  // The dtype of the base weights: bf16 when LoadModel made them so or a
  // LoRA run cast them (LlamaModel::base_dtype).
  BaseDtype base_dtype = BaseDtype::kFloat32;
  // Each parameter once: a tied head is in its embedding's `tied`.
  std::vector<ParameterSummary> parameters;
  // What the load has to tell: tensors of the directory it ignored, the
  // files snapshots carry, files it could not carry and why.
  std::vector<std::string> load_notes;
};

struct TrainSpec {
  // Each field unset takes TrainOptions' default; StartTraining merges and
  // validates them (MergeTrainOverrides).
  TrainOverrides train;
  // Each field unset takes the session's default (SessionOptions::offload,
  // the daemon's flags); StartTraining merges and validates them.
  offload::OffloadOverrides offload;
  // Continue the model's last run (restored from a checkpoint, or the last
  // run in this process) at its next step on the same data stream. Fields of
  // `train` left unset take that run's values instead of TrainOptions'
  // defaults; `steps` unset runs the rest of it (its total minus the steps
  // done).
  bool resume = false;
  // Train under this many bytes of peak memory on the compute device: the
  // session plans the candidates of this request (plan::ChooseUnderBudget,
  // core/plan/budget.h) and runs the fastest that fits in place of its
  // batch_size, grad_accumulation_steps, gradient_checkpointing and
  // offload.enabled. Unset: no budget. Not with resume, nor data parallel.
  std::optional<int64_t> memory_budget_bytes;
};

// A memory plan's ask (Session::StartPlan): a model's shape and a training
// configuration, planned by core/plan/planner.h's dry run.
struct PlanMemorySpec {
  // The model: at most one of preset / hf_config_dir (a Hugging Face
  // directory whose config.json alone is read, confined to the model roots
  // as LoadModelSpec::hf_directory is); neither: the loaded model.
  std::string preset;
  std::string hf_config_dir;
  // The training as a Train request carries it (TrainSpec): its fields
  // merged over TrainOptions' defaults by MergeTrainOverrides (steps may be
  // left unset: a plan runs no steps of the request), its offload fields
  // over the daemon's (SessionOptions::offload). resume is refused.
  TrainSpec train;
  // "cpu" or "cuda" (plan::ParseTarget); unset: the compute device's type.
  std::optional<std::string> target;
  // The device's capacity for the verdict; unset or 0: none.
  std::optional<int64_t> capacity_bytes;
  // A data-parallel run to plan (plan::PlanSpec::world_size, sharding, as
  // ParseSharding names the level); unset: one process, none.
  std::optional<int> world_size;
  std::optional<std::string> sharding;
};

// The result of a PLAN operation.
struct PlanResult {
  // What was planned: "preset:tiny", the directory, or the loaded model's
  // ModelSummary::source.
  std::string model;
  plan::PlanSpec::Target target = plan::PlanSpec::Target::kCpu;
  plan::MemoryPlan plan;
};

// One training step as the session reports it (the event type of TRAIN
// operations).
struct SessionStepReport {
  StepReport step;
  offload::OffloadStats offload;
  // Peak bytes allocated on the compute device during the step.
  int64_t peak_allocated_bytes = 0;
  // The planned peak of the run's configuration (a budgeted run: the
  // chosen one's; otherwise its calibration plan's, from the step after it
  // arrives); 0 while the run has no plan.
  int64_t planned_peak_bytes = 0;
  // A budgeted run's first step only: plan::BudgetCandidate::Describe of
  // the configuration chosen.
  std::string budget_choice;
};

enum class SnapshotMode { kBlocking, kAsync };

struct SnapshotSpec {
  std::string name;
  // Staging and tie flags are filled in. options.kind: kWeights unless asked
  // (an explicit snapshot is most often an export, and a checkpoint is three
  // times the size: the weights plus two moments each).
  snapshot::SnapshotOptions options;
  SnapshotMode mode = SnapshotMode::kBlocking;
};

// The result of a SNAPSHOT operation.
struct SnapshotResult {
  snapshot::SnapshotManifest manifest;
  SnapshotMode mode = SnapshotMode::kBlocking;
};

// The newest OOM report (Session::LastOomReport).
struct OomReportRecord {
  memory::OomReport report;
  std::string json;  // OomReportToJson, as written to the file
  // Where it was written; empty when report_dir is empty or writing failed,
  // and then write_error says why (the latter case).
  std::string path;
  std::string write_error;
  int64_t written_at_unix_ms = 0;  // when the report was built and written
};

// Data parallel, for status and /metrics (session_dist.cc).
struct DataParallelCounters {
  // A training run is data-parallel now or was last.
  bool active = false;
  // The level every rank of the run uses (SessionOptions::sharding), set
  // once the ranks agreed on it at start; kNone in a single process.
  Sharding sharding = Sharding::kNone;
  // The spread across ranks of a float64 checksum of the parameters, taken
  // every kDriftEverySteps steps and at a run's last step: 0 while the
  // replicas are bit-identical. Unset before the first check.
  std::optional<double> parameter_drift;
  int64_t drift_checks_total = 0;
  // The last step's gradient all-reduce: bytes, buckets (and how many
  // started inside backward), and the time it added after backward.
  int64_t allreduce_bytes = 0;
  int64_t buckets = 0;
  int64_t buckets_overlapped = 0;
  double allreduce_exposed_seconds = 0;
  double allreduce_exposed_seconds_total = 0;
  // Full sharding (ParameterShardingStats), the last step's: the bytes of
  // this rank's parameter shards, the most whole parameters it held at once,
  // the all-gathers that brought them, and the time spent waiting for them.
  int64_t owned_parameter_bytes = 0;
  int64_t peak_gathered_parameter_bytes = 0;
  int64_t parameter_gathers = 0;
  double gather_exposed_seconds = 0;
  double gather_exposed_seconds_total = 0;
  // Full sharding: the model is kept sharded now, between runs (it stays so
  // after a run); and the times it was gathered whole again since start
  // (before a LoadModel replaces it).
  bool model_sharded = false;
  int64_t whole_model_gathers_total = 0;
};

// One rank's memory, as MemoryOfAllRanks gathers it.
struct RankMemory {
  int rank = 0;
  int node_rank = 0;
  // False when the rank's figures could not be read (then `error` says why).
  bool ok = true;
  std::string error;
  std::string device;
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
  // The last completed step's peak on the compute device.
  int64_t last_step_peak_bytes = 0;
  int64_t steps_total = 0;
  // How old the figures are (0 for the rank that answers).
  double age_seconds = 0;
};

struct MemoryAcrossRanks {
  std::vector<RankMemory> ranks;  // by rank
  // max - min over the ranks read of last_step_peak_bytes and current_bytes.
  int64_t step_peak_imbalance_bytes = 0;
  int64_t current_imbalance_bytes = 0;
};

// Counters for /metrics, cumulative since start.
struct SessionCounters {
  int64_t steps_total = 0;
  int64_t tokens_total = 0;
  double last_loss = 0;
  bool has_loss = false;
  offload::OffloadStats offload_totals;
  int64_t snapshots_succeeded = 0;
  int64_t snapshots_failed = 0;
  int64_t snapshot_bytes_total = 0;
  memory::CategoryBytes categories;
  std::optional<SessionStepReport> last_step;
  // Evaluations finished (Evaluate operations and training's periodic ones)
  // and the last one.
  int64_t evaluations_total = 0;
  std::optional<EvalResult> last_eval;
  // Steps that ran out of memory (each wrote an OOM report).
  int64_t oom_reports_total = 0;
  // Steps whose loss or gradient norm was not finite: their update was
  // skipped and the training failed.
  int64_t nonfinite_steps_total = 0;
  DataParallelCounters data_parallel;
  // The planner's error on the last step with a plan (calibration, or a
  // budgeted run's choice): (measured peak - planned) / planned. Unset until
  // a step with a plan has run.
  std::optional<double> plan_error_ratio;
};

// Told of every training step and every published snapshot, for the
// server's metrics histograms. Called on the thread that did the work (the
// owner thread, or an async snapshot's writer) with no session lock held; an
// observer must be quick, thread-safe, and must not call into the session.
class SessionObserver {
 public:
  virtual ~SessionObserver() = default;
  virtual void OnStep(const SessionStepReport& report) = 0;
  virtual void OnSnapshotPublished(const snapshot::SnapshotManifest& manifest) = 0;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_SESSION_TYPES_H_
