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
// Thread-safety: none; the owner thread calls everything, and the hooks run
// on it (inside backward). The group and the parameters must outlive this.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dist/process_group.h"

namespace torch::autograd {
struct Node;
}

namespace memprofd {

struct GradientSyncStats {
  int64_t buckets = 0;
  int64_t bytes = 0;  // gradient bytes all-reduced per step
  // Buckets whose all-reduce started inside backward (overlapped with it);
  // the rest started in Finish.
  int64_t buckets_started_in_backward = 0;
  // Time Finish spent waiting for all-reduces: the communication backward did
  // not hide.
  double exposed_seconds = 0;
};

class GradientSync {
 public:
  static constexpr int64_t kDefaultBucketBytes = 25 * 1024 * 1024;

  // Buckets `parameters` (those with requires_grad; all on one device) and
  // installs the hooks. INVALID_ARGUMENT for a non-positive bucket size or
  // parameters of mixed devices.
  static absl::StatusOr<std::unique_ptr<GradientSync>> Create(
      ProcessGroup* group, std::vector<at::Tensor> parameters,
      int64_t bucket_bytes = kDefaultBucketBytes);
  ~GradientSync();  // removes the hooks
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Call before the backward whose gradients are final (the last micro-batch
  // of a step): from here on, a ready bucket starts its all-reduce. Earlier
  // backwards only accumulate.
  void Arm();
  // After that backward: starts the buckets that did not start (a parameter
  // without a gradient counts as zeros), waits for all, averages. Every rank
  // must call it once per step. The collective's status on failure (a peer
  // died or hangs: UNAVAILABLE or DEADLINE_EXCEEDED naming this rank); the
  // gradients are then unspecified and the step must fail.
  absl::Status Finish();

  const GradientSyncStats& last_step() const { return stats_; }
  int64_t num_buckets() const;

 private:
  struct Bucket;
  class ReadyHook;
  GradientSync(ProcessGroup* group, std::vector<at::Tensor> parameters);
  void OnGradientReady(size_t parameter);
  absl::Status StartBucket(Bucket& bucket);

  ProcessGroup* const group_;
  const std::vector<at::Tensor> parameters_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter index -> bucket index
  // The accumulators the hooks sit on, kept alive (a leaf holds its own only
  // weakly) with the key to remove each hook.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  bool armed_ = false;
  absl::Status hook_status_;  // the first failure to start inside backward
  GradientSyncStats stats_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_DIST_GRADIENT_SYNC_H_
