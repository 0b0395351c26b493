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

#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/log.h"
#include "core/common/option_status.h"
#include "core/common/status_macros.h"
#include "core/common/threads.h"
#include "core/dist/process_group.h"
#include "core/session/owner_thread.h"
#include "core/session/rank_messages.h"

namespace memprofd {

using rank_messages::BadCommand;
using rank_messages::BoolField;
using rank_messages::ByeKey;
using rank_messages::CommandKey;
using rank_messages::DecodeTrainCommand;
using rank_messages::EncodeTrainCommand;
using rank_messages::IntField;
using rank_messages::kCommandPoll;
using rank_messages::kMemoryPublishEvery;
using rank_messages::kReleaseTimeout;
using rank_messages::MemoryKey;
using rank_messages::RankMemoryToJson;
using rank_messages::StringField;

RankCoordinator::RankCoordinator(Parts parts)
    : world_(parts.world),
      device_(std::move(parts.device)),
      collective_timeout_(parts.collective_timeout),
      followed_(parts.commands),
      owner_(parts.owner),
      recorder_(parts.recorder),
      counters_(parts.counters) {}

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

void RankCoordinator::Start(BoundaryWork* work) {
  boundary_work_ = work;
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
    spec.lora_adapter = StringField(command, "lora_adapter");
    if (const std::string dtype = StringField(command, "base_dtype"); !dtype.empty()) {
      ASSIGN_OR_RETURN(spec.base_dtype, ParseBaseDtype(dtype));
    }
    return followed_.FollowLoad(spec);
  }
  if (kind == "optimizer_shard") {
    // Rank 0 checkpoints while idle: write on the owner thread, which
    // holds the trainer, and answer from there.
    const std::string dir = StringField(command, "dir");
    const int64_t id = IntField(command, "id").value_or(-1);
    return owner_.Post([this, dir, id] {
      if (absl::Status s = AnswerOptimizerShard(dir, id); !s.ok()) FailRun(s);
    });
  }
  if (kind == "parameters" || kind == "units") {
    // Rank 0 reads the model kept sharded after a fully sharded run (a
    // snapshot, an evaluation): join its stream on the owner thread, which
    // holds the parameters.
    return owner_.Post([this, kind] {
      absl::Status followed =
          idle_sharded_ != nullptr
              ? FollowStream(idle_sharded_, kind)
              : absl::InternalError(absl::StrCat(
                    "rank 0 streams the sharded model ('", kind,
                    "'), but this rank's model is whole: did it miss the last run?"));
      if (!followed.ok()) FailRun(followed);
    });
  }
  if (kind != "train") return BadCommand(absl::StrCat("unknown kind '", kind, "'"));
  ASSIGN_OR_RETURN(rank_messages::TrainCommand train, DecodeTrainCommand(command));
  return followed_.FollowTrain(train.train, train.offload, train.resume);
}

std::string RankCoordinator::TrainCommand(const TrainOptions& train,
                                          const offload::OffloadOverrides& offload,
                                          bool resume) const {
  if (group_ == nullptr) return std::string();
  return EncodeTrainCommand({train, offload, resume});
}

std::string RankCoordinator::LoadCommand(const LoadModelSpec& spec) const {
  if (group_ == nullptr) return std::string();
  return DumpJson(
      Json{{"kind", "load"},
           {"preset", spec.preset},
           {"hf_directory", spec.hf_directory},
           {"seed", spec.seed},
           {"resume", spec.resume},
           {"init_weights", spec.init_weights},
           {"lora_adapter", spec.lora_adapter},
           {"base_dtype", spec.base_dtype ? std::string(BaseDtypeName(*spec.base_dtype))
                                          : std::string()}});
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
