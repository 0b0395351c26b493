// Session: the LoadModel call of the one door. Its checks of the request are
// the session's; the load itself is the model host's (model_host.h).

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"
#include "core/model/config.h"
#include "core/session/model_host.h"
#include "core/session/rank_coordinator.h"
#include "core/session/session.h"
#include "core/session/snapshot_scheduler.h"
#include "core/session/training.h"

namespace memprofd {
namespace {

absl::Status CheckPlacement(const LoadModelSpec& spec) {
  std::set<std::string> seen;
  for (const auto& [module, placement] : spec.placement) {
    if (!seen.insert(module).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("placement names module ", Echo(module),
                       " twice; give one placement per module"));
    }
    const bool known = module == "model.embed_tokens" || module == "model.norm" ||
                       module == "lm_head" || absl::StartsWith(module, "model.layers.");
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement names unknown module ", Echo(module),
          ": use model.embed_tokens, model.layers.N, model.norm or lm_head"));
    }
    if (placement == Placement::kDisk && spec.base_dtype == BaseDtype::kBf16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "placement puts ", Echo(module),
          " on disk, which maps float32 weights, and base_dtype is bf16: place it on "
          "the device or cpu, or load the base in float32"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<Operation>> Session::LoadModel(const LoadModelSpec& spec) {
  RETURN_IF_ERROR(ranks_->CheckLeader("LoadModel"));
  if (spec.preset.empty() == spec.hf_directory.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("give exactly one model source: a preset (",
                     absl::StrJoin(LlamaConfig::PresetNames(), ", "),
                     ") or a Hugging Face directory"));
  }
  if (spec.resume && spec.hf_directory.empty() && spec.lora_adapter.empty()) {
    return absl::InvalidArgumentError(
        "resume needs hf_directory: the directory of a checkpoint (a preset has no "
        "training state to resume), or, for a checkpoint of LoRA adapters, their base "
        "and lora_adapter");
  }
  if (spec.init_weights && spec.hf_directory.empty()) {
    return absl::InvalidArgumentError(
        "init_weights applies to hf_directory (a preset's weights are always freshly "
        "initialised); drop it");
  }
  // (A LoRA checkpoint's base may be freshly initialised: the checkpoint's
  // fingerprint of it tells whether it is the same.)
  if (spec.init_weights && spec.resume && spec.lora_adapter.empty()) {
    return absl::InvalidArgumentError(
        "init_weights and resume contradict each other: resume continues from the "
        "checkpoint's weights; drop one");
  }
  RETURN_IF_ERROR(CheckPlacement(spec));
  if (options_.world.distributed() && !spec.placement.empty()) {
    // Every rank overwrites its weights with rank 0's in place, which a
    // module mapped from disk cannot take.
    return absl::UnimplementedError(
        "module placement is not supported in a data-parallel run: load the model "
        "without placement (every module on the compute device)");
  }
  if (!spec.preset.empty()) RETURN_IF_ERROR(LlamaConfig::Preset(spec.preset).status());
  if (training_slot_.held()) {
    return absl::FailedPreconditionError(
        "training is running on the current model; cancel it (CancelOperation) before "
        "loading another");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Operation> op,
                   operations_.Admit(OperationKind::kLoadModel));
  if (!spec.hf_directory.empty()) snapshots_->TrackLoad(op->id(), spec.hf_directory);
  auto forget = [this, id = op->id()] { snapshots_->ForgetLoad(id); };
  absl::Status posted = Post([this, op, forget, spec = LoadModelSpec(spec),
                              command = ranks_->LoadCommand(spec)]() mutable {
    absl::Cleanup done = forget;
    if (op->cancel_requested()) {
      op->Finish(absl::CancelledError("cancelled before it started"));
      return;
    }
    op->MarkRunning();
    // Resolved here, off gRPC's threads, and loaded by its canonical path
    // so that a link changed afterwards cannot redirect the load.
    if (!spec.hf_directory.empty()) {
      absl::StatusOr<std::string> dir = host_->ConfineDirectory(spec.hf_directory);
      if (!dir.ok()) {
        op->Finish(dir.status());
        return;
      }
      spec.hf_directory = *std::move(dir);
    }
    if (!spec.lora_adapter.empty()) {
      absl::StatusOr<std::string> dir =
          host_->ConfineDirectory(spec.lora_adapter, "lora_adapter");
      if (!dir.ok()) {
        op->Finish(dir.status());
        return;
      }
      spec.lora_adapter = *std::move(dir);
    }
    // Data parallel: the followers load the same (and the next Train checks
    // they did), in the order the owner runs things.
    if (!command.empty()) {
      if (absl::Status s = ranks_->PublishCommand(command); !s.ok()) {
        op->Finish(s);
        ranks_->FailRun(s);
        return;
      }
    }
    // Data parallel: once the followers were told to load, rank 0 loads
    // too, so that every rank holds the same model (whole first, as each
    // follower makes it, should the load fail and keep it).
    if (absl::Status whole = training_->MakeModelWhole(); !whole.ok()) {
      op->Finish(whole);
      ranks_->FailRun(whole);
      return;
    }
    std::function<bool()> cancelled;
    if (command.empty()) cancelled = [&op] { return op->cancel_requested(); };
    absl::Status status = host_->Load(spec, cancelled);
    if (!status.ok()) {
      op->Finish(status);
      return;
    }
    op->Finish(absl::OkStatus(), *Model());
  });
  if (!posted.ok()) {
    forget();
    return posted;
  }
  return op;
}

}  // namespace memprofd
