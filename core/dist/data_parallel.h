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
// Thread-safety: the trainer's owner thread only. The trainer, its model and
// the group must outlive this.

#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "core/dist/gradient_sync.h"
#include "core/dist/process_group.h"
#include "core/train/step_listener.h"
#include "core/train/trainer.h"

namespace memprofd {

class DataParallel : public StepListener {
 public:
  // Makes every rank's model and optimizer state rank 0's and installs the
  // gradient hooks on the trainer's model. The status of
  // TakeRankZeroParameters, TakeRankZeroOptimizerState or GradientSync::Create
  // on failure.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Create(
      ProcessGroup* group, Trainer* trainer,
      int64_t bucket_bytes = GradientSync::kDefaultBucketBytes);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The last step's gradient all-reduce: buckets, bytes, exposed time.
  const GradientSyncStats& last_step() const { return sync_->last_step(); }
  // The cross-rank checksum spread (ParameterDrift); a collective.
  absl::StatusOr<double> Drift();

  // StepListener:
  // (rank, world size).
  std::optional<DataShard> data_shard() const override;
  // The last backward arms the gradient buckets; AfterBackward waits for
  // them and averages.
  void BeforeBackward(bool last) override;
  absl::Status AfterBackward() override;
  // Replaces the report's loss, tokens and tokens/s by the global batch's
  // (one all-reduce of three numbers): the loss is the mean over every rank's
  // tokens, as one process training the whole global batch would report it,
  // and this rank's own loss moves to rank_loss; tokens and tokens/s are
  // summed over the ranks. The collective's status on failure.
  absl::Status OnStepEnd(StepReport& report) override;

 private:
  DataParallel(ProcessGroup* group, Trainer* trainer, std::unique_ptr<GradientSync> sync);

  ProcessGroup* const group_;
  Trainer* const trainer_;
  std::unique_ptr<GradientSync> sync_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
