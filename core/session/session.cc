#include "core/session/session.h"

#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <future>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/common/host_heap.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#ifdef MEMPROFD_WITH_CUDA
#endif
#include "core/memory/history.h"
#include "core/memory/recorder.h"
#include "core/session/model_host.h"
#include "core/session/oom_reporter.h"
#include "core/session/owner_thread.h"
#include "core/session/rank_coordinator.h"
#include "core/session/runtime.h"
#include "core/session/snapshot_scheduler.h"
#include "core/session/training.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"

namespace memprofd {
namespace {

// The checkpoint --resume names (SessionOptions::resume): its directory, or
// empty for "latest" when the root holds no checkpoint yet.
absl::StatusOr<std::string> ResumeDirectory(const SessionOptions& options) {
  if (options.resume.empty()) return std::string();
  if (options.resume == "latest") {
    ASSIGN_OR_RETURN(std::optional<snapshot::SnapshotManifest> latest,
                     snapshot::LatestCheckpoint(options.snapshot_root));
    return latest ? latest->directory : std::string();
  }
  ASSIGN_OR_RETURN(snapshot::SnapshotManifest m,
                   snapshot::DescribeSnapshot(options.snapshot_root, options.resume));
  return m.directory;
}

}  // namespace

absl::StatusOr<std::string> ResolveDevice(const std::string& requested, int local_rank) {
  const bool cuda_available = torch::cuda::is_available();
  if (requested == "auto") {
    if (!cuda_available) return std::string("cpu");
    return ResolveDevice("cuda", local_rank);
  }
  if (requested == "cpu") return std::string("cpu");
  if (requested == "cuda" || absl::StartsWith(requested, "cuda:")) {
    int index = local_rank;
    if (requested != "cuda" && !absl::SimpleAtoi(requested.substr(5), &index)) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad device '", requested,
                       "': write auto, cpu, cuda or cuda:N with N a number"));
    }
#ifndef MEMPROFD_WITH_CUDA
    return OptionError(
        absl::StatusCode::kUnimplemented, "device",
        absl::StrCat("device '", requested,
                     "' needs CUDA, and this memprofd was built against a LibTorch "
                     "without CUDA; use device cpu or rebuild against a CUDA LibTorch"));
#else
    const int count = static_cast<int>(torch::cuda::device_count());
    if (index < 0 || index >= count) {
      return OptionError(
          absl::StatusCode::kFailedPrecondition, "device",
          absl::StrCat("device '", requested,
                       requested == "cuda"
                           ? absl::StrCat("' (cuda:", index, ", LOCAL_RANK's GPU)")
                           : std::string("'"),
                       " is not there: LibTorch sees ", count,
                       " CUDA device(s); use device auto or cuda:0..", count - 1));
    }
    return absl::StrCat("cuda:", index);
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad device '", requested, "': write auto, cpu, cuda or cuda:N"));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const SessionOptions& options,
                                                         Runtime& runtime) {
  RETURN_IF_ERROR(ValidateSessionOptions(options));
  absl::StatusOr<std::string> device =
      ResolveDevice(options.device, options.world.local_rank);
  if (!device.ok()) return device.status();
  if (absl::Status s = runtime.UseDevice(*device, options.device_memory_limit_bytes);
      !s.ok()) {
    return AboutOption(s, "device_memory_limit");
  }
  if (options.return_host_memory && !KeepHostHeapNearLiveBytes()) {
    LogWarning(
        "return_host_memory: glibc refused the heap's thresholds; the resident "
        "set may grow past the plan's host_rss_bytes");
  }
  if (!options.snapshot_root.empty()) {
    if (absl::Status s = snapshot::CheckSnapshotRoot(options.snapshot_root); !s.ok()) {
      return s;
    }
    // Fail at start, not at the first snapshot, when the root is unusable.
    std::error_code ec;
    std::filesystem::create_directories(options.snapshot_root, ec);
    if (ec || ::access(options.snapshot_root.c_str(), W_OK | X_OK) != 0) {
      return OptionError(
          absl::StatusCode::kFailedPrecondition, "snapshot_root",
          absl::StrCat("snapshot_root='", options.snapshot_root,
                       "' cannot be created or written",
                       ec ? absl::StrCat(" (", ec.message(), ")") : std::string(),
                       "; give a writable directory"));
    }
    // Rank 0 alone writes and cleans snapshots; a follower may share its
    // root (shared storage) and must not touch what rank 0 is writing.
    absl::StatusOr<int> cleaned = 0;
    if (!options.world.distributed() || options.world.rank == 0) {
      cleaned = snapshot::CleanLeftovers(options.snapshot_root);
    }
    if (!cleaned.ok()) return cleaned.status();
    if (*cleaned > 0) {
      LogInfo(absl::StrCat("removed ", *cleaned, " leftover temporary snapshot director",
                           *cleaned == 1 ? "y" : "ies", " under ",
                           options.snapshot_root));
    }
  }
  if (!options.peak_file.empty()) {
    // Fail at start, not silently at every step, when it cannot be written.
    std::filesystem::path dir = std::filesystem::path(options.peak_file).parent_path();
    if (dir.empty()) dir = ".";
    if (std::filesystem::is_directory(options.peak_file) ||
        ::access(dir.c_str(), W_OK | X_OK) != 0) {
      return OptionError(
          absl::StatusCode::kFailedPrecondition, "peak_file",
          absl::StrCat("peak_file='", options.peak_file,
                       "' cannot be written (its directory must exist and be writable, "
                       "and it must not be a directory); give a file path there"));
    }
  }
  SessionOptions resolved = options;
  if (resolved.offload_target_auto) {
    resolved.offload.target =
        *device == "cpu" ? offload::Target::kDisk : offload::Target::kHost;
  }
  ASSIGN_OR_RETURN(PathRoots data_roots,
                   PathRoots::Create(options.data_roots, "data_roots"));
  std::vector<std::string> model_roots = options.data_roots;
  if (!options.snapshot_root.empty()) model_roots.push_back(options.snapshot_root);
  ASSIGN_OR_RETURN(PathRoots model_roots_checked,
                   PathRoots::Create(model_roots, "data_roots"));
  std::unique_ptr<Session> session(new Session(resolved, runtime, *std::move(device),
                                               std::move(data_roots),
                                               std::move(model_roots_checked)));
  // Data parallel: join the run before loading, so that every rank resumes
  // from the checkpoint rank 0 chose.
  ASSIGN_OR_RETURN(const std::string resume_dir,
                   options.world.distributed()
                       ? session->ranks_->JoinRun(
                             options.sharding,
                             [s = session.get()] { return ResumeDirectory(s->options_); })
                       : ResumeDirectory(session->options_));
  if (!options.resume.empty() && resume_dir.empty()) {
    LogInfo(absl::StrCat("resume=latest: no checkpoint under ", options.snapshot_root,
                         " yet; starting from the model option"));
  }
  if (!resume_dir.empty() || !options.model.empty()) {
    LoadModelSpec spec;
    spec.seed = options.model_seed;
    spec.operator_named = true;
    // A LoRA model's checkpoint holds its adapters alone: --model names
    // their base.
    const bool adapters = !resume_dir.empty() && snapshot::IsAdapterDirectory(resume_dir);
    if (adapters && options.model.empty()) {
      return AboutOption(
          absl::FailedPreconditionError(absl::StrCat(
              "resume from ", resume_dir,
              ": the checkpoint holds LoRA adapters without their base; start with "
              "--model naming the base they were trained on")),
          "resume");
    }
    if (!resume_dir.empty() && !adapters) {
      spec.hf_directory = resume_dir;
    } else if (absl::StrContains(options.model, "/")) {
      spec.hf_directory = options.model;
      // A LoRA checkpoint's fingerprint tells whether weights initialised
      // here are the base it trained on (the same config and seed).
      spec.init_if_no_weights = true;
    } else {
      spec.preset = options.model;
    }
    if (!resume_dir.empty()) {
      spec.resume = true;
      if (adapters) spec.lora_adapter = resume_dir;
    }
    std::promise<absl::Status> loaded;
    Session* s = session.get();
    if (absl::Status posted =
            session->Post([s, spec, &loaded] { loaded.set_value(s->host_->Load(spec)); });
        !posted.ok()) {
      return posted;
    }
    if (absl::Status status = loaded.get_future().get(); !status.ok()) {
      if (spec.resume) {
        return AboutOption(
            absl::Status(status.code(), absl::StrCat("resume from ", resume_dir, ": ",
                                                     status.message())),
            "resume");
      }
      return status;
    }
    if (spec.resume) {
      LogInfo(absl::StrCat("resumed from checkpoint ", resume_dir, " at step ",
                           session->Model()->steps_trained));
    }
  }
  if (session->ranks_->group() != nullptr) {
    // Every rank checks it holds the same model and takes rank 0's weights
    // and optimizer state, before anything is served.
    std::promise<absl::Status> aligned;
    Session* s = session.get();
    RETURN_IF_ERROR(
        session->Post([s, &aligned] { aligned.set_value(s->AlignWithRankZero()); }));
    RETURN_IF_ERROR(aligned.get_future().get());
    session->ranks_->Start(session->snapshots_.get());
    LogInfo(absl::StrCat("data parallel: ", DescribeWorld(options.world),
                         session->follower() ? "; following rank 0's commands"
                                             : "; serving the run's API"));
  }
  return session;
}

Session::Session(const SessionOptions& options, Runtime& runtime, std::string device,
                 PathRoots data_roots, PathRoots model_roots)
    : options_(options),
      runtime_(runtime),
      device_(std::move(device)),
      data_roots_(std::move(data_roots)),
      start_time_(absl::Now()) {
  // Each part is made with the parts it uses, so this order is the graph
  // (docs/design.md draws it). The owner thread starts last, with the
  // snapshot scheduler's boundary work: the one loop, closed once both
  // exist.
  owner_ = std::make_unique<OwnerThread>("mpd-owner", options_.bulk_nice,
                                         options_.return_host_memory);
  plans_ = std::make_unique<OwnerThread>("mpd-plan", options_.bulk_nice,
                                         options_.return_host_memory);
  host_ = std::make_unique<ModelHost>(options_, device_, runtime_.recorder(),
                                      std::move(model_roots));
  ranks_ = std::make_unique<RankCoordinator>(
      RankCoordinator::Parts{options_.world, device_, options_.collective_timeout, *this,
                             *owner_, runtime_.recorder(), counters_});
  snapshots_ = std::make_unique<SnapshotScheduler>(
      SnapshotScheduler::Parts{options_, ranks_->follower(), operations_, *ranks_, *host_,
                               *owner_, counters_, observers_});
  oom_ = std::make_unique<OomReporter>(runtime_.recorder(), device_, options_.report_dir,
                                       options_.peak_file);
  training_ = std::make_unique<Training>(
      Training::Parts{options_, device_, data_roots_, runtime_, *host_, *ranks_,
                      *snapshots_, *oom_, *owner_, *plans_, counters_, observers_});
  owner_->Start(snapshots_.get());
  plans_->Start(nullptr);
}

Session::~Session() {
  Shutdown();
  snapshots_->Join();
  // The model, its trainer and offloader go once nothing can reach them,
  // and after what a fully sharded run kept of them.
  if (training_ != nullptr) training_->DropShardedModel();
  host_.reset();
}

absl::Status Session::Post(std::function<void()> work) {
  return owner_->Post(std::move(work));
}

bool Session::draining() const { return !operations_.admitting(); }

absl::Status Session::BeginDrain(const std::string& snapshot_name) {
  if (drain_begun_.exchange(true)) return absl::OkStatus();
  const std::vector<std::shared_ptr<Operation>> active = operations_.StopAdmitting();
  // Queued before the stop requests, so that a training stopping at its
  // next boundary runs it there first: the checkpoint holds the step the
  // run stopped at.
  std::shared_ptr<Operation> snapshot;
  absl::Status queued;
  if (!snapshot_name.empty()) {
    SnapshotSpec spec;
    spec.name = snapshot_name;
    spec.options.kind = options_.auto_snapshot_kind;
    absl::StatusOr<std::shared_ptr<Operation>> op =
        snapshots_->StartSnapshot(spec, /*daemons_own=*/true);
    if (op.ok()) {
      snapshot = *std::move(op);
    } else {
      queued = op.status();
    }
  }
  for (const auto& op : active) op->RequestDrain();
  if (snapshot == nullptr) return queued;
  OperationView view = snapshot->View();
  while (!view.done) view = snapshot->WaitForChange(view.version, absl::InfiniteFuture());
  return view.error;
}

void Session::Shutdown() {
  if (owner_->joined()) return;
  BeginDrain().IgnoreError();  // OK without a snapshot
  owner_->Stop();
  plans_->Stop();
  ranks_->Stop();
  // What a follower queued from rank 0 since the drain began.
  for (const auto& op : operations_.List(nullptr, /*active_only=*/true)) {
    op->RequestDrain();
  }
  if (owner_->Join()) {
    // Training stopped at a step boundary on every rank (the stop went to
    // all of them there); now the followers may go.
    ranks_->ReleaseFollowers();
  }
  ranks_->Join();
  plans_->Join();
}

std::optional<ModelSummary> Session::Model() const { return host_->Summary(); }

absl::StatusOr<ModelSummary> Session::DescribeModel() const {
  std::optional<ModelSummary> model = Model();
  if (!model) return absl::FailedPreconditionError("no model is loaded; LoadModel first");
  return *std::move(model);
}

SessionCounters Session::Counters() const {
  SessionCounters c = counters_.Read();
  // The allocator's categories as they are now, not at the last step.
  c.categories = host_->Categories();
  c.oom_reports_total = oom_->reports_total();
  return c;
}

absl::StatusOr<OomReportRecord> Session::LastOomReport() const {
  return oom_->LastReport();
}

void Session::AddObserver(std::shared_ptr<SessionObserver> observer) {
  observers_.Add(std::move(observer));
}

}  // namespace memprofd
