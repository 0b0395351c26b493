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
// state each rank keeps. kNone replicates everything. Every other level
// gives each rank a flat piece of every trainable parameter (equal chunks of
// ceil(n / N) elements rounded up to 16, core/common/flat_shard.h) and shards the
// trainer's optimizer to it (optimizer_sharding.h): the rank keeps AdamW's state for its
// pieces only and updates them alone, so the optimizer state per rank falls as 1/N; the
// gradient norm that clipping and the non-finite check use is the root of the ranks'
// summed squares (CombineGradNorm, one all-reduce), so every rank clips and skips alike.
//   kOptimizer (ZeRO-1): gradients are all-reduced whole, each piece takes
// its part of them (AfterBackward), and after the update each parameter is
// all-gathered from the ranks' pieces (AfterUpdate), so the replicas stay
// bit-identical to an unsharded run's.
//   kGradients (ZeRO-2) also keeps only its pieces' gradients: GradientSync
// reduce-scatters each bucket of every micro-batch's backward while backward
// goes on (gradient_sync.h). Its results equal an unsharded run's to float32
// rounding (bit for bit with 2 ranks, one micro-batch and no clipping).
//   kFull (ZeRO-3) does all kGradients does and also keeps only its shards of
// the parameters between their uses (ParameterSharding): from Create on,
// the parameters' storages are freed; each unit of the model (the
// embedding, each decoder layer, the head) all-gathers its parameters before
// its forward and again before its backward (BeforeUnit), frees them after
// its forward and, in backward, each one as its gradient is accumulated. The
// optimizer updates the shards in place, the only copy: nothing to share.
// Evaluations inside the run gather unit by unit as forward does
// (ShardedEvaluation), evaluations, snapshots and checkpoints at its step
// boundaries follow rank 0's streams of units and parameters
// (parameter_sharding(), which RankCoordinator leads). After the run the
// session may keep this object, and the model sharded, for the work between
// runs (the same streams); Finish makes the model whole again. Its results
// equal kGradients' bit for bit: the same arithmetic on the same values.
//   At every sharded level the trainer's optimizer state holds this rank's
// pieces only (a checkpoint of the run needs every rank's part;
// Trainer::Restore with a FlatShardSpec narrows a whole state back to them).
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
  // too (sharded, the trainer's optimizer is sharded to this rank's pieces,
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

  // After a run, on every rank alike: the model whole again (kFull:
  // GatherAll, a collective; OK at once at the other levels). The
  // collective's status on failure (the run is broken; the parameters other
  // ranks own stay freed on this rank).
  absl::Status Finish();
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
  // backward comes next), and drops autocast's cached casts of them.
  void AfterUnitForward(const ModelUnit& unit) override;
  // kFull: an evaluation in the run gathers unit by unit (a ShardedEvaluation
  // from BeforeEvaluation to AfterEvaluation, which frees what it holds);
  // null at the other levels, where every rank holds the whole model.
  absl::Status BeforeEvaluation() override;
  absl::Status AfterEvaluation() override;
  EvalUnits* evaluation_units() override { return evaluation_.get(); }
  void BeforeBackward(bool last) override;
  absl::Status AfterBackward() override;
  // Sharded: the norm over every rank's pieces, sqrt of the sum of the
  // ranks' squares (one all-reduce of a float64; its status on failure).
  // kNone: `norm`, which already covers every gradient.
  absl::StatusOr<double> CombineGradNorm(double norm) override;
  // kFull: frees what backward left gathered. Otherwise nothing.
  void BeforeUpdate() override;
  // Sharded: the update is kept when no rank refused its pieces' (one
  // all-reduce of a float64). kNone: `keep`, which every rank decides alike.
  absl::StatusOr<bool> AgreeOnUpdate(bool keep) override;
  // kOptimizer and kGradients: all-gathers each parameter from the ranks'
  // pieces (a collective per parameter; its status on failure). Otherwise
  // OK at once.
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
  std::unique_ptr<OptimizerSharding> sharding_;    // null with kNone
  std::unique_ptr<ParameterSharding> params_;      // kFull only
  std::unique_ptr<ShardedEvaluation> evaluation_;  // kFull, in an evaluation
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
