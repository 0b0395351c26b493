#ifndef MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
#define MEMPROFD_CORE_DIST_DATA_PARALLEL_H_

// Makes a Trainer train data-parallel: at attach, every rank checks it holds
// the same model and takes rank 0's weights and optimizer state; then each step the
// trainer takes its shard of the global batch (DataShard) and GradientSync averages the
// gradients of the last micro-batch's backward, bucket by bucket as they become ready,
// before clipping and the AdamW update (the same update on every rank, so the replicas
// stay bit-identical).
//
// Thread-safety: the trainer's owner thread only. The trainer, its model and
// the group must outlive this; destroy this before replacing the trainer's
// hooks.

#include <memory>

#include "absl/status/statusor.h"
#include "core/dist/gradient_sync.h"
#include "core/dist/process_group.h"
#include "core/train/trainer.h"

namespace memprofd {

class DataParallel {
 public:
  // Wraps the trainer's current hooks (they still run) and sets its data
  // shard to (rank, world size). The status of TakeRankZeroParameters or
  // GradientSync::Create on failure; the trainer is then unchanged.
  static absl::StatusOr<std::unique_ptr<DataParallel>> Attach(
      ProcessGroup* group, Trainer* trainer,
      int64_t bucket_bytes = GradientSync::kDefaultBucketBytes);
  ~DataParallel();  // restores the trainer's hooks and shard
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The last step's gradient all-reduce: buckets, bytes, exposed time.
  const GradientSyncStats& last_step() const { return sync_->last_step(); }
  // The cross-rank checksum spread (ParameterDrift); a collective.
  absl::StatusOr<double> Drift();

 private:
  DataParallel(ProcessGroup* group, Trainer* trainer, std::unique_ptr<GradientSync> sync);

  ProcessGroup* const group_;
  Trainer* const trainer_;
  std::unique_ptr<GradientSync> sync_;
  StepHooks wrapped_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_DATA_PARALLEL_H_
