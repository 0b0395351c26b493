#ifndef MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
#define MEMPROFD_CORE_DIST_DATA_PARALLEL_H_

// Makes a run of a Trainer data-parallel, as one of its step listeners. At
// creation, every rank checks it holds the same model and takes rank 0's
// weights and optimizer state. Then, in each step of a run it is given to,
// the trainer takes this rank's shard of the global batch (data_shard),
// GradientSync averages the gradients of the last micro-batch's backward,
// bucket by bucket as they become ready, before clipping and the AdamW update
// (the same update on every rank, so the replicas stay bit-identical), and
// the step's report gets the global batch's loss and throughput (OnStepEnd).
//
// Sharding (DataParallelOptions::sharding) chooses how much of the training
// state each rank keeps: kNone replicates everything; kOptimizer (ZeRO-1)
// keeps AdamW's state only for the parameters this rank owns
// (optimizer_sharding.h says which), drops the other gradients once the norm
// and clipping have read them (BeforeUpdate), updates its own parameters and
// broadcasts them to the other ranks (AfterUpdate), so the replicas stay
// bit-identical to an unsharded run's while the optimizer state per rank
// falls as 1/N. kGradients (ZeRO-2) owns, updates and broadcasts as
// kOptimizer does, and also keeps only its own parameters' gradients:
// GradientSync reduces each bucket of every micro-batch's backward to the
// bucket's owner while backward goes on and frees it elsewhere
// (gradient_sync.h), and the gradient norm that clipping and the non-finite
// check use is combined across ranks (CombineGradNorm: the sum of the
// ranks' squared norms, one all-reduce), so every rank clips and skips
// alike. Its results equal an unsharded run's to float32 rounding (bit for
// bit with 2 ranks, one micro-batch and no clipping). With either sharded
// level the trainer's optimizer state holds this rank's shard only (a
// checkpoint of the run needs every rank's part: Trainer::Restore's `owned`
// takes a rank's part back), and optimizer state of parameters this rank
// does not own, outside such a restore, is refused (Create: it trained
// unsharded). kFull (ZeRO-3) does all kGradients does and also keeps only
// this rank's own parameters between their uses (ParameterSharding): from
// Create on, the others' storages are freed; each unit of the model (the
// embedding, each decoder layer, the head) takes its parameters from their
// owners before its forward and again before its backward (BeforeUnit),
// frees them after its forward and, in backward, each one as its gradient
// is accumulated. The update needs no broadcast: an owner's parameter is
// the only copy. Evaluations inside the run see the whole model
// (GatherWholeModel around them), snapshots and checkpoints at its step
// boundaries read the parameters one at a time (parameter_sharding()'s
// stream, which RankCoordinator leads), and Finish
// makes it whole again at the run's end, so the daemon outside a run holds
// the model as before. Its results equal kGradients' bit for bit: the same
// arithmetic on the same values.
//
// Thread-safety: the trainer's owner thread only. The trainer, its model and
// the group must outlive this.

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/dist/gradient_sync.h"
#include "core/dist/optimizer_sharding.h"
#include "core/dist/parameter_sharding.h"
#include "core/dist/process_group.h"
#include "core/dist/sharding.h"
#include "core/train/step_listener.h"
#include "core/train/trainer.h"

namespace memprofd {

struct DataParallelOptions {
  Sharding sharding = Sharding::kNone;
  // The gradient all-reduce's bucket cap (GradientSync).
  int64_t bucket_bytes = GradientSync::kDefaultBucketBytes;
};

class DataParallel : public StepListener {
 public:
  // Makes every rank's model rank 0's, and with kNone its optimizer state
  // too (sharded, each rank keeps its own shard, checked by
  // OptimizerSharding::Create), and installs the gradient hooks on the
  // trainer's model. The status of
  // TakeRankZeroParameters, TakeRankZeroOptimizerState, OptimizerSharding::Create or
  // GradientSync::Create on failure.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(
      ProcessGroup* group, Trainer* trainer, const DataParallelOptions& options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The last step's gradient collectives: buckets, bytes, exposed time, the
  // peak of the gradient bytes held.
  const GradientSyncStats& last_step() const { return sync_->last_step(); }
  // The cross-rank checksum spread (ParameterDrift); a collective.
  // Meaningful only where every rank holds every parameter between steps
  // (replicated(): not with kFull, which Drift refuses).
  absl::StatusOr<double> Drift();
  bool replicated() const { return params_ == nullptr; }

  // kFull: every parameter whole on every rank (GatherAll, a collective), and
  // sharded again. Every rank calls them at the same points. OK at once at
  // the other levels.
  absl::Status GatherWholeModel();
  absl::Status ShardModel();
  // At the end of a run, on every rank: the model whole again (kFull). The
  // collective's status on failure (the run is broken; the parameters other
  // ranks own stay freed on this rank).
  absl::Status Finish() { return GatherWholeModel(); }
  // kFull: the run's parameters, sharded (for what reads them at a step
  // boundary: ParameterSharding's stream); null at the other levels.
  ParameterSharding* parameter_sharding() const { return params_.get(); }
  // kFull: the parameter figures (owned bytes, gathered working set); null
  // at the other levels.
  const ParameterShardingStats* parameter_stats() const {
    return params_ != nullptr ? &params_->stats() : nullptr;
  }

  // StepListener:
  // (rank, world size).
  std::optional<DataShard> data_shard() const override;
  // Starts the step's gradient figures afresh.
  void OnStepBegin(int64_t global_step) override;
  // The last backward (kGradients: every backward) arms the gradient
  // buckets; AfterBackward waits for them and averages.
  // kFull: gathers the unit's parameters (ParameterSharding::Gather).
  absl::Status BeforeUnit(const ModelUnit& unit, bool backward) override;
  // kFull: frees them after the unit's forward (not the head's, whose
  // backward comes next).
  void AfterUnitForward(const ModelUnit& unit) override;
  absl::Status BeforeEvaluation() override { return GatherWholeModel(); }
  absl::Status AfterEvaluation() override { return ShardModel(); }
  void BeforeBackward(bool last) override;
  absl::Status AfterBackward() override;
  // kGradients and kFull: the norm over every rank's share, sqrt of the sum of the
  // ranks' squares (one all-reduce of a float64; its status on failure).
  // Otherwise `norm`, which already covers every gradient.
  absl::StatusOr<double> CombineGradNorm(double norm) override;
  // Sharded: drops the gradients of parameters other ranks own, so that
  // the update is this rank's share alone. kNone: nothing.
  void BeforeUpdate() override;
  // Sharded: broadcasts each parameter from its owner (a collective per
  // parameter; its status on failure). kNone: OK at once.
  absl::Status AfterUpdate() override;
  // Replaces the report's loss, tokens and tokens/s by the global batch's
  // (one all-reduce of three numbers): the loss is the mean over every rank's
  // tokens, as one process training the whole global batch would report it,
  // and this rank's own loss moves to rank_loss; tokens and tokens/s are
  // summed over the ranks. The collective's status on failure.
  absl::Status OnStepEnd(StepReport& report) override;

 private:
  DataParallel(ProcessGroup* group, Trainer* trainer, Sharding level,
               std::unique_ptr<GradientSync> sync,
               std::unique_ptr<OptimizerSharding> sharding,
               std::unique_ptr<ParameterSharding> params);

  ProcessGroup* const group_;
  Trainer* const trainer_;
  const Sharding level_;
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<OptimizerSharding> sharding_;  // null with kNone
  std::unique_ptr<ParameterSharding> params_;    // kFull only
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
