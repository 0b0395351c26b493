#ifndef MEMPROFD_CORE_DIST_GRADIENT_SYNC_H_
#define MEMPROFD_CORE_DIST_GRADIENT_SYNC_H_

// Averages gradients across the ranks of a data-parallel run, the way
// PyTorch's DDP does, built from what LibTorch exports to C++ (its Reducer is
// not: REFERENCE.md §6). Parameters are grouped into buckets of about 25 MB
// (DDP's default cap), in reverse order, roughly the order in which backward
// produces their gradients. A post-hook on each parameter's gradient
// accumulator marks it ready; when a bucket's last gradient is ready, the
// bucket is flattened and its SUM all-reduce starts while backward goes on.
// Finish() waits for the buckets, divides by the world size and writes the
// averages back into each `.grad`.
//
// Invariant, checked by tests/dist: after Finish, every rank's gradients are
// bit-identical, and equal (to float rounding) to one process's gradients
// over the union of the ranks' batches.
//
// Sharded (ZeRO-2 and ZeRO-3: Create with `targets`, the optimizer's target
// for each parameter's flat piece, core/common/flat_shard.h): each rank ends a
// step holding only the averaged gradients of its pieces, as the targets'
// `.grad`s. A ready bucket is laid out rank-major, as FSDP2 lays out its
// reduce-scatter input: a flat buffer of N rows, row r holding piece r of
// every parameter of the bucket, each padded with zeros to its chunk; it is
// SUM-reduce-scattered (c10d reduce_scatter_tensor), so that rank r receives
// row r, the sums of its pieces. As soon as the bucket is laid out, its
// `.grad`s are set to none on every rank; once its reduce-scatter completes
// (checked at every later gradient-ready hook, and waited for when more
// than kMaxBucketsInFlight are in flight) the rank adds its row into its
// pieces' sums and frees the buffer. So a rank's gradient bytes stay near
// its share plus the buckets in flight and the one being filled, also inside
// backward. Every micro-batch's backward is reduced (Arm before each): the
// sums accumulate, nothing else is held between micro-batches. A bucket
// moves the bytes of one all-reduce's reduce-scatter half (plus padding):
// half the traffic of DDP's all-reduce.
//   With 2 ranks and no accumulation the averaged gradients are bit for bit
// the all-reduce's (a + b either way); with more ranks or micro-batches the
// terms are added in another order (per-micro-batch sums are added, not the
// ranks' accumulated gradients), a few float32 ulps apart.
//
// Thread-safety: none; the owner thread calls everything, and the hooks run
// on it (inside backward). The group and the parameters must outlive this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/accumulator_hooks.h"
#include "core/dist/process_group.h"

namespace memprofd {

struct GradientSyncStats {
  int64_t buckets = 0;
  // The buckets' gradient bytes: all-reduced once per step; sharded, reduced
  // once per micro-batch.
  int64_t bytes = 0;
  // Buckets whose all-reduce started inside backward (overlapped with it);
  // the rest started in Finish.
  int64_t buckets_started_in_backward = 0;
  // Time Finish (and, sharded, Arm before a later micro-batch's backward)
  // spent waiting for collectives: the communication backward did not hide.
  double exposed_seconds = 0;
  // The most gradient bytes this rank held at once during the step: the
  // distinct storages of its `.grad`s, of the buckets' flat copies and,
  // sharded, of its pieces' sums, sampled at every gradient-ready hook, after
  // each flattening and at the end of Finish.
  int64_t peak_bytes = 0;
  // The largest bucket's bytes (at most the cap plus a parameter).
  int64_t largest_bucket_bytes = 0;
};

class GradientSync {
 public:
  static constexpr int64_t kDefaultBucketBytes = 25 * 1024 * 1024;
  // Sharded: reduces started and not yet consumed, beyond which a
  // gradient-ready hook waits for the oldest (bounds the bytes in flight).
  // A plan's dry run (ProcessGroup::ForPlan) keeps this many waiting, the
  // most a real rank can hold, since its reduces complete at once.
  static constexpr int kMaxBucketsInFlight = 2;

  // Buckets `parameters` (those with requires_grad; all on one device) and
  // installs the hooks. With `targets` (one per parameter, aligned with
  // `parameters`: 1-D, as many elements as this rank's piece of it, which may
  // be none) the sync is sharded (above). With `units` (one per parameter,
  // aligned with `parameters`) a bucket never holds parameters of two units:
  // sharded runs pass the model's units (an embedding, a decoder layer, the
  // head), so that each unit's gradients are reduce-scattered as soon as
  // backward finishes it, as FSDP does, and a small model still makes
  // several buckets. INVALID_ARGUMENT for a non-positive bucket size,
  // parameters of mixed devices or non-contiguous ones when sharded, or
  // targets or units of another count, or targets of another size.
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      ProcessGroup* group, std::vector<at::Tensor> parameters,
      int64_t bucket_bytes = kDefaultBucketBytes, std::vector<at::Tensor> targets = {},
      std::vector<int> units = {});
  ~GradientSync();  // removes the hooks
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // At the start of each step: forgets the last step's figures, and what a
  // failed step left (buckets in flight, owned sums).
  void BeginStep();
  // Call before the backward whose gradients are final (the last micro-batch
  // of a step): from here on, a ready bucket starts its all-reduce. Earlier
  // backwards only accumulate. Sharded, call it before every micro-batch's
  // backward instead: it first completes the previous backward's reduces
  // (a failure is kept for Finish, and nothing more is started).
  void Arm();
  // After the step's last backward: starts the buckets that did not start (a
  // parameter without a gradient counts as zeros), waits for all, averages.
  // Sharded, the averages are the targets' `.grad`s and the parameters'
  // are none. Every rank must call it once per step. The collective's status
  // on failure (a peer died or hangs: UNAVAILABLE or DEADLINE_EXCEEDED naming
  // this rank); the gradients are then unspecified and the step must fail.
  absl::Status Finish();

  const GradientSyncStats& last_step() const { return stats_; }
  int64_t num_buckets() const;
  bool sharded() const { return !targets_.empty(); }

 private:
  struct Bucket;
  GradientSync(ProcessGroup* group, std::vector<at::Tensor> parameters,
               std::vector<at::Tensor> targets);
  void OnGradientReady(size_t parameter);
  absl::Status StartBucket(size_t bucket);
  // Sharded: fills the bucket's rank-major buffer from its `.grad`s (then
  // set to none) and makes its row's output.
  absl::Status LayOutRows(size_t bucket);
  // Sharded: waits for a started bucket's reduce-scatter, adds this rank's
  // row into its pieces' sums, releases the buffer.
  absl::Status ConsumeBucket(size_t bucket);
  // Sharded: consumes the reduces that finished, and the oldest while more
  // than kMaxBucketsInFlight are in flight.
  absl::Status ConsumeFinished();
  // Starts the buckets that did not start, waits for all, re-reduces stale
  // ones: the end of one backward's collectives.
  absl::Status CompleteRound();
  // Samples the gradient bytes held now into stats_.peak_bytes.
  void SampleBytes();

  ProcessGroup* const group_;
  const std::vector<at::Tensor> parameters_;
  const std::vector<at::Tensor> targets_;  // per parameter; empty unless sharded
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;            // parameter index -> bucket index
  std::unique_ptr<AccumulatorHooks> hooks_;  // OnGradientReady per parameter
  bool armed_ = false;
  absl::Status hook_status_;  // the step's first failure (inside backward too)
  // Sharded: indices of buckets whose reduce-scatter started and is not
  // consumed, in start order; and the sum so far of each piece's gradient.
  std::vector<size_t> in_flight_;
  std::vector<at::Tensor> piece_sums_;
  GradientSyncStats stats_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_GRADIENT_SYNC_H_
