// RankCoordinator: data parallel across ranks (docs/data-parallel.md).
//
// Rank 0 serves the whole API. It hands every Train and LoadModel to the
// other ranks (the followers) as a numbered command in the run's store,
// "cmd/<n>" = JSON, published by its owner thread in the order it runs them;
// each follower's command thread queues them on its own owner thread in the
// same order, so every rank issues the same collectives in the same order.
// During training every rank meets at each step boundary in one small
// all-reduce (SyncStepBoundary): all stop at the same step when any rank was
// cancelled, and the followers wait there while rank 0 writes a snapshot or
// evaluates. Idle ranks issue no collective; they only talk through the
// store, so an idle run can never hang in one.
//
// A failure of the run (a collective failed or timed out, rank 0's store
// went away) is final: the operation fails with a status naming the rank and
// the collective, and the run-ended handler tells the server to stop serving
// and exit non-zero, so that torchrun or Kubernetes restarts every rank and
// they resume from the last checkpoint.

#include "core/session/rank_coordinator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/common/threads.h"
#include "core/dist/parameter_sharding.h"
#include "core/dist/process_group.h"
#include "core/snapshot/writer.h"
#include "core/train/trainer_state.h"

namespace memprofd {
namespace {

// How often rank 0 reads what the followers published of their memory.
constexpr absl::Duration kRankMemoryPoll = absl::Milliseconds(500);
// How often an idle follower looks for rank 0's next command (one store
// round trip), and how often it publishes its memory.
constexpr absl::Duration kCommandPoll = absl::Milliseconds(100);
constexpr absl::Duration kMemoryPublishEvery = absl::Seconds(1);
// How long followers wait at a step boundary for rank 0's boundary work: a
// blocking snapshot of a large model takes minutes. Rank 0 dying ends the
// wait at once, since its store goes with it.
constexpr absl::Duration kBoundaryWorkTimeout = absl::Minutes(30);
// How long rank 0's Shutdown waits for every follower to read "shutdown".
constexpr absl::Duration kReleaseTimeout = absl::Seconds(5);

std::string CommandKey(int64_t n) { return absl::StrCat("cmd/", n); }
std::string MemoryKey(int rank) { return absl::StrCat("mem/", rank); }
std::string ByeKey(int rank) { return absl::StrCat("bye/", rank); }
std::string BoundaryEventKey(int64_t boundary, int64_t k) {
  return absl::StrCat("boundary/", boundary, "/", k);
}
std::string ShardAnswerKey(int64_t id, int rank) {
  return absl::StrCat("shard/", id, "/", rank);
}

// A status as a store value, and back: {"code", "error"}.
Json StatusToJson(const absl::Status& status) {
  return {{"code", static_cast<int>(status.code())},
          {"error", std::string(status.message())}};
}
absl::Status StatusFromJson(const Json& v) {
  const Json* code = JsonFind(v, "code");
  const Json* error = JsonFind(v, "error");
  int64_t c = static_cast<int64_t>(absl::StatusCode::kUnknown);
  if (code != nullptr) JsonToInt64(*code, &c);
  return absl::Status(static_cast<absl::StatusCode>(c),
                      error != nullptr && error->is_string()
                          ? error->get<std::string>()
                          : std::string("(no message)"));
}

Json OffloadOverridesToJson(const offload::OffloadOverrides& r) {
  Json v = Json::object();
  if (r.enabled) v["enabled"] = *r.enabled;
  if (r.target) v["target"] = std::string(offload::TargetName(*r.target));
  if (r.min_offload_bytes) v["min_offload_bytes"] = *r.min_offload_bytes;
  if (r.max_copies_in_flight) v["max_copies_in_flight"] = *r.max_copies_in_flight;
  if (r.prefetch_depth) v["prefetch_depth"] = *r.prefetch_depth;
  if (r.offload_head) v["offload_head"] = *r.offload_head;
  return v;
}

// Rank 0's commands come from the same binary: a field of the wrong type is
// a bug or a foreign writer, reported as INVALID_ARGUMENT.
absl::Status BadCommand(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("rank 0's command cannot be read: ", why,
                   " (are all ranks running the same memprofd version?)"));
}

std::optional<int64_t> IntField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  int64_t out = 0;
  if (f == nullptr || !JsonToInt64(*f, &out)) return std::nullopt;
  return out;
}

std::optional<bool> BoolField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  if (f == nullptr || !f->is_boolean()) return std::nullopt;
  return f->get<bool>();
}

std::string StringField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  return f != nullptr && f->is_string() ? f->get<std::string>() : std::string();
}

absl::StatusOr<offload::OffloadOverrides> OffloadOverridesFromJson(const Json& v) {
  offload::OffloadOverrides r;
  r.enabled = BoolField(v, "enabled");
  if (const std::string target = StringField(v, "target"); !target.empty()) {
    ASSIGN_OR_RETURN(r.target, offload::ParseTarget(target));
  }
  r.min_offload_bytes = IntField(v, "min_offload_bytes");
  if (auto n = IntField(v, "max_copies_in_flight")) {
    r.max_copies_in_flight = static_cast<int>(*n);
  }
  if (auto n = IntField(v, "prefetch_depth")) r.prefetch_depth = static_cast<int>(*n);
  r.offload_head = BoolField(v, "offload_head");
  return r;
}

Json RankMemoryToJson(const RankMemory& m) {
  return {{"rank", m.rank},
          {"node_rank", m.node_rank},
          {"device", m.device},
          {"current_bytes", m.current_bytes},
          {"peak_bytes", m.peak_bytes},
          {"last_step_peak_bytes", m.last_step_peak_bytes},
          {"steps_total", m.steps_total},
          {"published_unix_ms", absl::ToUnixMillis(absl::Now())}};
}

RankMemory RankMemoryFromJson(int rank, absl::string_view text) {
  RankMemory m;
  m.rank = rank;
  absl::StatusOr<Json> v = ParseJson(text);
  if (!v.ok() || !v->is_object()) {
    m.ok = false;
    m.error = absl::StrCat("rank ", rank, " published memory that is not a JSON object");
    return m;
  }
  m.node_rank = static_cast<int>(IntField(*v, "node_rank").value_or(0));
  m.device = StringField(*v, "device");
  m.current_bytes = IntField(*v, "current_bytes").value_or(0);
  m.peak_bytes = IntField(*v, "peak_bytes").value_or(0);
  m.last_step_peak_bytes = IntField(*v, "last_step_peak_bytes").value_or(0);
  m.steps_total = IntField(*v, "steps_total").value_or(0);
  const int64_t published = IntField(*v, "published_unix_ms").value_or(0);
  m.age_seconds =
      std::max<double>(0, (absl::ToUnixMillis(absl::Now()) - published) / 1000.0);
  return m;
}

}  // namespace
RankCoordinator::RankCoordinator(const WorldSpec& world, std::string device,
                                 absl::Duration collective_timeout, Callbacks callbacks)
    : world_(world),
      device_(std::move(device)),
      collective_timeout_(collective_timeout),
      callbacks_(std::move(callbacks)) {}

RankCoordinator::~RankCoordinator() {
  Stop();
  Join();
}

absl::StatusOr<std::string> RankCoordinator::JoinRun(
    Sharding sharding,
    const std::function<absl::StatusOr<std::string>()>& resume_directory) {
  ProcessGroupOptions group_options;
  group_options.cuda = !c10::Device(device_).is_cpu();
  group_options.timeout = collective_timeout_;
  ASSIGN_OR_RETURN(group_, ProcessGroup::Connect(world_, group_options));
  ASSIGN_OR_RETURN(command_channel_, group_->OpenChannel());
  if (!follower()) {
    ASSIGN_OR_RETURN(memory_channel_, group_->OpenChannel());
  }
  RETURN_IF_ERROR(AgreeOnSharding(sharding));
  // Rank 0 alone chooses the checkpoint every rank resumes from (so that
  // "latest" means the same one everywhere); the followers read it from
  // that directory (shared storage, or the same path on one host), and
  // the session's alignment then makes sure they hold rank 0's weights and
  // state.
  if (!follower()) {
    ASSIGN_OR_RETURN(std::string dir, resume_directory());
    RETURN_IF_ERROR(group_->SetKey("start/resume", dir));
    return dir;
  }
  absl::StatusOr<std::string> dir = group_->WaitKey("start/resume", collective_timeout_);
  if (!dir.ok()) {
    return absl::Status(dir.status().code(),
                        absl::StrCat("waiting for rank 0 to choose the checkpoint to "
                                     "resume from: ",
                                     dir.status().message()));
  }
  return *dir;
}

absl::Status RankCoordinator::AgreeOnSharding(Sharding sharding) {
  // Every rank learns every rank's level, so that each fails with the same
  // message: a rank that went on alone would hang in the first step's
  // collectives, which differ between the levels.
  const std::vector<Sharding>& levels = AllShardings();
  const int64_t index =
      std::find(levels.begin(), levels.end(), sharding) - levels.begin();
  ASSIGN_OR_RETURN(std::vector<at::Tensor> gathered,
                   group_->AllGather(at::tensor({index}, at::kLong)));
  auto level_of = [&](int rank) -> absl::string_view {
    const int64_t i = gathered[rank].item<int64_t>();
    return i >= 0 && i < static_cast<int64_t>(levels.size()) ? ShardingName(levels[i])
                                                             : "unknown";
  };
  for (int rank = 1; rank < static_cast<int>(gathered.size()); ++rank) {
    if (gathered[rank].item<int64_t>() == gathered[0].item<int64_t>()) continue;
    return OptionError(
        absl::StatusCode::kFailedPrecondition, "sharding",
        absl::StrCat("rank ", rank, " was started with sharding=", level_of(rank),
                     ", rank 0 with sharding=", level_of(0),
                     ": start every rank with the same sharding"));
  }
  return absl::OkStatus();
}

void RankCoordinator::Start() {
  if (group_ == nullptr) return;
  if (follower()) {
    follower_ = std::thread([this] { FollowerLoop(); });
  } else {
    rank_memory_reader_ = std::thread([this] { RankMemoryReaderLoop(); });
  }
}

void RankCoordinator::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
}

void RankCoordinator::Join() {
  if (follower_.joinable()) follower_.join();
  if (rank_memory_reader_.joinable()) rank_memory_reader_.join();
}

absl::Status RankCoordinator::CheckLeader(absl::string_view what) const {
  if (!follower()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("this daemon is rank ", world_.rank, " of a ", world_.world_size,
                   "-rank data-parallel run, which follows rank 0: send ", what,
                   " to rank 0 (the daemon beside the store at ", world_.master_addr,
                   "); the other ranks serve status, memory, metrics and health only"));
}

void RankCoordinator::SetFatalHandler(std::function<void(const absl::Status&)> handler) {
  std::optional<absl::Status> already;
  {
    absl::MutexLock lock(&mu_);
    fatal_handler_ = handler;
    already = fatal_;
  }
  // The run ended before anyone listened (a follower whose rank 0 went
  // while the server was starting).
  if (already && handler) handler(*already);
}

std::optional<absl::Status> RankCoordinator::fatal_status() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

void RankCoordinator::FailRun(const absl::Status& status) {
  std::function<void(const absl::Status&)> handler;
  {
    absl::MutexLock lock(&mu_);
    if (fatal_) return;
    fatal_ = status;
    handler = fatal_handler_;
  }
  if (status.ok()) {
    LogInfo(absl::StrCat("rank ", world_.rank,
                         ": rank 0 ended the data-parallel run; stopping"));
  } else {
    LogError(absl::StrCat(
        "rank ", world_.rank, ": the data-parallel run is broken (", status.ToString(),
        "); stopping so that the launcher restarts every rank, which resume from the "
        "last checkpoint with resume=latest"));
  }
  if (handler) handler(status);
}

absl::Status RankCoordinator::PublishCommand(const std::string& command) {
  return group_->SetKey(CommandKey(commands_++), command);
}

void RankCoordinator::FollowerLoop() {
  NameThisThread("mpd-follower");
  absl::Time next_publish = absl::InfinitePast();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // Polled rather than waited for in the store: c10d logs every store
      // wait that times out, and this loop must also see a shutdown.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), kCommandPoll);
      if (stopping_ || fatal_) return;
    }
    if (absl::Now() >= next_publish) {
      next_publish = absl::Now() + kMemoryPublishEvery;
      if (absl::Status s = command_channel_->SetKey(
              MemoryKey(world_.rank), DumpJson(RankMemoryToJson(OwnRankMemory())));
          !s.ok()) {
        FailRun(s);
        return;
      }
    }
    absl::StatusOr<std::optional<std::string>> command =
        command_channel_->GetKeyIfSet(CommandKey(commands_));
    if (!command.ok()) {
      // The store is rank 0's (or torchrun's agent's): it is gone.
      FailRun(absl::Status(command.status().code(),
                           absl::StrCat("rank 0 is gone: ", command.status().message())));
      return;
    }
    if (!command->has_value()) continue;
    ++commands_;
    absl::Status followed = FollowCommand(**command);
    if (absl::IsCancelled(followed)) return;  // rank 0 said shutdown
    if (!followed.ok()) {
      FailRun(followed);
      return;
    }
  }
}

absl::Status RankCoordinator::FollowCommand(const std::string& text) {
  ASSIGN_OR_RETURN(const Json command, ParseJson(text));
  const std::string kind = StringField(command, "kind");
  if (kind == "shutdown") {
    // Rank 0 waits for this before its store goes away.
    (void)command_channel_->SetKey(ByeKey(world_.rank), "1");
    FailRun(absl::OkStatus());
    return absl::CancelledError("rank 0 shut down");
  }
  if (kind == "load") {
    LoadModelSpec spec;
    spec.preset = StringField(command, "preset");
    spec.hf_directory = StringField(command, "hf_directory");
    spec.seed = static_cast<uint64_t>(IntField(command, "seed").value_or(0));
    spec.resume = BoolField(command, "resume").value_or(false);
    spec.init_weights = BoolField(command, "init_weights").value_or(false);
    return callbacks_.follow_load(spec);
  }
  if (kind == "optimizer_shard") {
    // Rank 0 checkpoints while idle: write on the owner thread, which
    // holds the trainer, and answer from there.
    const std::string dir = StringField(command, "dir");
    const int64_t id = IntField(command, "id").value_or(-1);
    return callbacks_.post([this, dir, id] {
      if (absl::Status s = AnswerOptimizerShard(dir, id); !s.ok()) FailRun(s);
    });
  }
  if (kind != "train") return BadCommand(absl::StrCat("unknown kind '", kind, "'"));
  ASSIGN_OR_RETURN(const TrainOptions train,
                   TrainOptionsFromJson(StringField(command, "options")));
  const Json* offload_json = JsonFind(command, "offload");
  ASSIGN_OR_RETURN(
      const offload::OffloadOverrides offload_request,
      OffloadOverridesFromJson(offload_json ? *offload_json : Json::object()));
  const bool resume = BoolField(command, "resume").value_or(false);
  return callbacks_.follow_train(train, offload_request, resume);
}

std::string RankCoordinator::TrainCommand(const TrainOptions& train,
                                          const offload::OffloadOverrides& offload,
                                          bool resume) const {
  if (group_ == nullptr) return std::string();
  return DumpJson(Json{{"kind", "train"},
                       {"options", TrainOptionsToJson(train)},
                       {"offload", OffloadOverridesToJson(offload)},
                       {"resume", resume}});
}

std::string RankCoordinator::LoadCommand(const LoadModelSpec& spec) const {
  if (group_ == nullptr) return std::string();
  return DumpJson(Json{{"kind", "load"},
                       {"preset", spec.preset},
                       {"hf_directory", spec.hf_directory},
                       {"seed", spec.seed},
                       {"resume", spec.resume},
                       {"init_weights", spec.init_weights}});
}

absl::StatusOr<bool> RankCoordinator::SyncStepBoundary(bool cancel_requested,
                                                       ParameterSharding* sharded) {
  const bool leader = !follower();
  // [any rank cancelled, rank 0 has boundary work]
  at::Tensor flags = at::tensor({int64_t{cancel_requested ? 1 : 0},
                                 int64_t{leader && callbacks_.has_boundary_work()}},
                                at::kLong);
  RETURN_IF_ERROR(group_->AllReduceSum(flags));
  const int64_t boundary = boundaries_++;
  if (flags[1].item<int64_t>() > 0) {
    sharded_ = sharded;
    absl::Cleanup forget = [this] { sharded_ = nullptr; };
    if (!leader) {
      RETURN_IF_ERROR(FollowBoundary(boundary));
      return flags[0].item<int64_t>() > 0;
    }
    current_boundary_ = boundary;
    boundary_events_ = 0;
    boundary_failure_ = absl::OkStatus();
    callbacks_.run_boundary_work();
    current_boundary_ = -1;
    const absl::Status failure = boundary_failure_;
    Json end = {{"kind", "done"}};
    if (!failure.ok()) {
      end = StatusToJson(failure);
      end["kind"] = "failed";
    }
    RETURN_IF_ERROR(
        group_->SetKey(BoundaryEventKey(boundary, boundary_events_++), DumpJson(end)));
    RETURN_IF_ERROR(failure);
  }
  return flags[0].item<int64_t>() > 0;
}

absl::Status RankCoordinator::PublishBoundaryEvent(const std::string& event) {
  absl::Status published =
      group_->SetKey(BoundaryEventKey(current_boundary_, boundary_events_++), event);
  FailBoundary(published);
  return published;
}

void RankCoordinator::FailBoundary(const absl::Status& status) {
  if (!status.ok() && current_boundary_ >= 0 && boundary_failure_.ok()) {
    boundary_failure_ = status;
  }
}

// Rank 0's side of the parameter stream, for the snapshot writer: each
// weight it acquires is broadcast from its owner (ParameterSharding's
// stream) while the followers join in FollowBoundary; destroying it ends
// the stream. After a failed collective nothing more is sent (the run is
// broken, and the boundary fails with it).
class BoundaryParameterStream : public snapshot::TensorAccess {
 public:
  BoundaryParameterStream(RankCoordinator* ranks, ParameterSharding* sharded,
                          std::vector<std::optional<size_t>> index_of)
      : ranks_(ranks), sharded_(sharded), index_of_(std::move(index_of)) {}
  ~BoundaryParameterStream() override {
    if (!broken_) ranks_->FailBoundary(sharded_->EndStream());
  }

  absl::StatusOr<int64_t> Acquire(size_t index) override {
    if (broken_) {
      return absl::AbortedError("the parameter stream broke at an earlier parameter");
    }
    if (index >= index_of_.size() || !index_of_[index]) return 0;  // not a parameter
    absl::StatusOr<int64_t> bytes = sharded_->StreamParameter(*index_of_[index]);
    if (!bytes.ok()) {
      broken_ = true;
      ranks_->FailBoundary(bytes.status());
    }
    return bytes;
  }
  void Release(size_t index) override {
    if (index < index_of_.size() && index_of_[index]) {
      sharded_->ReleaseParameter(*index_of_[index]);
    }
  }

 private:
  RankCoordinator* const ranks_;
  ParameterSharding* const sharded_;
  const std::vector<std::optional<size_t>> index_of_;
  bool broken_ = false;
};

absl::StatusOr<std::unique_ptr<snapshot::TensorAccess>> RankCoordinator::StreamParameters(
    const std::vector<std::pair<std::string, at::Tensor>>& weights) {
  if (!AtShardedBoundary()) return nullptr;
  std::vector<std::optional<size_t>> index_of;
  for (const auto& [name, tensor] : weights)
    index_of.push_back(sharded_->IndexOf(tensor));
  RETURN_IF_ERROR(PublishBoundaryEvent(DumpJson(Json{{"kind", "parameters"}})));
  return std::make_unique<BoundaryParameterStream>(this, sharded_, std::move(index_of));
}

absl::Status RankCoordinator::GatherModelForBoundary() {
  if (!AtShardedBoundary()) return absl::OkStatus();
  RETURN_IF_ERROR(PublishBoundaryEvent(DumpJson(Json{{"kind", "gather_model"}})));
  absl::Status gathered = sharded_->GatherAll();
  FailBoundary(gathered);
  return gathered;
}

void RankCoordinator::ShardModelAfterBoundary() {
  if (!AtShardedBoundary()) return;
  if (PublishBoundaryEvent(DumpJson(Json{{"kind", "shard_model"}})).ok()) {
    sharded_->ReleaseAll();
  }
}

absl::Status RankCoordinator::FollowBoundary(int64_t boundary) {
  for (int64_t k = 0;; ++k) {
    absl::StatusOr<std::string> event =
        group_->WaitKey(BoundaryEventKey(boundary, k), kBoundaryWorkTimeout);
    if (!event.ok()) {
      return absl::Status(event.status().code(),
                          absl::StrCat("waiting for rank 0's snapshot or evaluation at "
                                       "a step boundary: ",
                                       event.status().message()));
    }
    ASSIGN_OR_RETURN(const Json v, ParseJson(*event));
    const std::string kind = StringField(v, "kind");
    if (kind == "done") return absl::OkStatus();
    if (kind == "failed") {
      const absl::Status failure = StatusFromJson(v);
      return absl::Status(
          failure.code(),
          absl::StrCat("rank 0's work at a step boundary failed: ", failure.message()));
    }
    if (kind == "optimizer_shard") {
      RETURN_IF_ERROR(
          AnswerOptimizerShard(StringField(v, "dir"), IntField(v, "id").value_or(-1)));
      continue;
    }
    // The events of a fully sharded run: rank 0 publishes them only when its
    // SyncStepBoundary was given the sharded parameters, as every rank's was.
    const bool model_event =
        kind == "parameters" || kind == "gather_model" || kind == "shard_model";
    if (!model_event) {
      return BadCommand(absl::StrCat("unknown step-boundary event '", kind, "'"));
    }
    if (sharded_ == nullptr) {
      return absl::InternalError(absl::StrCat(
          "rank 0 sent the step-boundary event '", kind,
          "' of a fully sharded run, but this rank's parameters are not sharded"));
    }
    if (kind == "parameters") {
      RETURN_IF_ERROR(sharded_->FollowStream());
    } else if (kind == "gather_model") {
      RETURN_IF_ERROR(sharded_->GatherAll());
    } else {
      sharded_->ReleaseAll();
    }
  }
}

absl::Status RankCoordinator::AnswerOptimizerShard(const std::string& dir, int64_t id) {
  absl::Status written = callbacks_.write_optimizer_shard(dir);
  if (!written.ok()) {
    LogError(
        absl::StrCat("rank ", world_.rank,
                     ": writing this rank's optimizer state for rank 0's checkpoint: ",
                     written.ToString()));
  }
  return group_->SetKey(ShardAnswerKey(id, world_.rank), DumpJson(StatusToJson(written)));
}

absl::Status RankCoordinator::GatherOptimizerShards(const std::string& dir) {
  if (group_ == nullptr || world_.world_size < 2) return absl::OkStatus();
  const int64_t id = gathers_++;
  const Json ask = {{"kind", "optimizer_shard"}, {"dir", dir}, {"id", id}};
  const bool at_boundary = current_boundary_ >= 0;
  RETURN_IF_ERROR(at_boundary ? group_->SetKey(BoundaryEventKey(current_boundary_,
                                                                boundary_events_++),
                                               DumpJson(ask))
                              : PublishCommand(DumpJson(ask)));
  absl::Status status;
  const absl::Time deadline = absl::Now() + collective_timeout_;
  for (int r = 1; r < world_.world_size && status.ok(); ++r) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    absl::StatusOr<std::string> answer = group_->WaitKey(ShardAnswerKey(id, r), left);
    if (!answer.ok()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          "rank ", r, " did not write its optimizer state for the checkpoint within ",
          absl::FormatDuration(collective_timeout_),
          " (the collective timeout): it died "
          "or hangs; ",
          answer.status().message()));
      break;
    }
    absl::StatusOr<Json> v = ParseJson(*answer);
    const absl::Status theirs =
        v.ok() ? StatusFromJson(*v) : absl::InternalError("an unreadable answer");
    if (!theirs.ok()) {
      // A follower's bad argument is no bad argument of the caller's.
      status = absl::Status(
          absl::IsInvalidArgument(theirs) ? absl::StatusCode::kInternal : theirs.code(),
          absl::StrCat("rank ", r,
                       " could not write its optimizer state for the "
                       "checkpoint: ",
                       theirs.message()));
    }
  }
  if (!status.ok() && at_boundary && boundary_failure_.ok()) boundary_failure_ = status;
  return status;
}

RankMemory RankCoordinator::OwnRankMemory() const {
  RankMemory m;
  m.rank = world_.rank;
  m.node_rank = world_.node_rank;
  m.device = device_;
  const memory::MemoryStatsView stats = callbacks_.memory_stats();
  for (const auto& d : stats.devices) {
    if (d.name != device_) continue;
    m.current_bytes = d.current_bytes;
    m.peak_bytes = d.peak_bytes;
  }
  for (const auto& p : stats.last_step_peaks) {
    if (p.device == device_) m.last_step_peak_bytes = p.peak_bytes;
  }
  m.steps_total = callbacks_.steps_total();
  return m;
}

absl::StatusOr<MemoryAcrossRanks> RankCoordinator::MemoryOfAllRanks() const {
  RETURN_IF_ERROR(CheckLeader("GetMemoryStats with all_ranks"));
  MemoryAcrossRanks all;
  all.ranks.push_back(OwnRankMemory());
  std::vector<absl::StatusOr<std::optional<std::string>>> published;
  {
    absl::MutexLock lock(&mu_);
    published = follower_memory_;
  }
  for (int r = 1; r < world_.world_size; ++r) {
    // Each follower publishes about once a second; one that never has (it
    // is still starting) is reported as such, not waited for.
    const absl::StatusOr<std::optional<std::string>> text =
        static_cast<size_t>(r - 1) < published.size()
            ? published[static_cast<size_t>(r - 1)]
            : absl::StatusOr<std::optional<std::string>>(std::nullopt);
    if (text.ok() && text->has_value()) {
      all.ranks.push_back(RankMemoryFromJson(r, **text));
    } else {
      RankMemory missing;
      missing.rank = r;
      missing.ok = false;
      missing.error =
          text.ok() ? absl::StrCat("rank ", r, " has not published its memory yet")
                    : absl::StrCat("rank ", r,
                                   "'s memory cannot be read: ", text.status().message());
      all.ranks.push_back(std::move(missing));
    }
  }
  bool first = true;
  int64_t peak_low = 0, peak_high = 0, now_low = 0, now_high = 0;
  for (const RankMemory& m : all.ranks) {
    if (!m.ok) continue;
    if (first) {
      peak_low = peak_high = m.last_step_peak_bytes;
      now_low = now_high = m.current_bytes;
      first = false;
    }
    peak_low = std::min(peak_low, m.last_step_peak_bytes);
    peak_high = std::max(peak_high, m.last_step_peak_bytes);
    now_low = std::min(now_low, m.current_bytes);
    now_high = std::max(now_high, m.current_bytes);
  }
  all.step_peak_imbalance_bytes = peak_high - peak_low;
  all.current_imbalance_bytes = now_high - now_low;
  return all;
}

void RankCoordinator::RankMemoryReaderLoop() {
  NameAndLowerThisThread("mpd-rank-memory", 0);
  for (;;) {
    std::vector<absl::StatusOr<std::optional<std::string>>> read;
    for (int r = 1; r < world_.world_size && memory_channel_; ++r) {
      read.push_back(memory_channel_->GetKeyIfSet(MemoryKey(r)));
    }
    absl::MutexLock lock(&mu_);
    follower_memory_ = std::move(read);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), kRankMemoryPoll);
    if (stopping_) return;
  }
}

void RankCoordinator::ReleaseFollowers() {
  // After a failure the followers fail on their own (rank 0's store goes
  // when it exits), and exit non-zero as the run did.
  if (group_ == nullptr || follower() || fatal_status()) return;
  if (absl::Status s = PublishCommand(DumpJson(Json{{"kind", "shutdown"}})); !s.ok()) {
    LogWarning(absl::StrCat("telling the other ranks to stop: ", s.message()));
    return;
  }
  const absl::Time deadline = absl::Now() + kReleaseTimeout;
  for (int r = 1; r < world_.world_size; ++r) {
    const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
    if (absl::StatusOr<std::string> bye = group_->WaitKey(ByeKey(r), left); !bye.ok()) {
      LogWarning(absl::StrCat(
          "rank ", r, " did not acknowledge the shutdown: ", bye.status().message()));
    }
  }
}

}  // namespace memprofd
