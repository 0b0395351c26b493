#include "core/dist/gradient_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/attribution.h"
#include "core/common/flat_shard.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/dist/accumulator_hooks.h"
#include "core/memory/tagging.h"

namespace memprofd {

struct GradientSync::Bucket {
  std::vector<size_t> parameters;  // indices into parameters_
  // Sharded: each parameter's column in a row of the rank-major layout, and
  // a row's elements (the parameters' chunks, end to end).
  std::vector<int64_t> columns;
  int64_t row = 0;
  int64_t numel = 0;
  int64_t bytes = 0;
  int64_t pending = 0;  // gradients not yet ready this step
  bool started = false;
  // A gradient changed after the bucket started (a parameter accumulated
  // twice in one backward): it is reduced again in Finish.
  bool stale = false;
  at::Tensor flat;
  at::Tensor row_sums;  // sharded: this rank's row of the reduce-scatter
  PendingCollective reduce;
};

GradientSync::GradientSync(ProcessGroup* group, std::vector<at::Tensor> parameters,
                           std::vector<at::Tensor> targets)
    : group_(group), parameters_(std::move(parameters)), targets_(std::move(targets)) {}

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(
    ProcessGroup* group, std::vector<at::Tensor> parameters, int64_t bucket_bytes,
    std::vector<at::Tensor> targets, std::vector<int> units) {
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket size must be positive, got ", bucket_bytes, " bytes"));
  }
  if (!targets.empty() && targets.size() != parameters.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient sharding needs a piece per parameter: got ",
                     targets.size(), " pieces for ", parameters.size(), " parameters"));
  }
  if (!units.empty() && units.size() != parameters.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient buckets need a unit per "
                     "parameter: got ",
                     units.size(), " for ", parameters.size()));
  }
  std::vector<at::Tensor> trainable;
  std::vector<at::Tensor> trainable_targets;
  std::vector<int> trainable_units;
  for (size_t k = 0; k < parameters.size(); ++k) {
    at::Tensor& p = parameters[k];
    if (!p.requires_grad()) continue;
    if (!trainable.empty() && p.device() != trainable.front().device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data-parallel gradients must share one device; found ",
                       trainable.front().device().str(), " and ", p.device().str()));
    }
    if (!targets.empty()) {
      const FlatChunk piece = ChunkOf(p.numel(), group->rank(), group->world_size());
      if (!targets[k].defined() || targets[k].dim() != 1 ||
          targets[k].numel() != piece.length || !p.is_contiguous()) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", k, " (", p.numel(),
                         " elements) needs a contiguous layout and a "
                         "1-D piece of ",
                         piece.length, " elements for rank ", group->rank(), " of ",
                         group->world_size()));
      }
      trainable_targets.push_back(targets[k]);
    }
    trainable_units.push_back(units.empty() ? 0 : units[k]);
    trainable.push_back(std::move(p));
  }
  std::unique_ptr<GradientSync> sync(
      new GradientSync(group, std::move(trainable), std::move(trainable_targets)));
  const std::vector<at::Tensor>& params = sync->parameters_;
  sync->bucket_of_.resize(params.size());
  // Reverse order: the last layers' gradients come first in backward. A
  // bucket holds one dtype and one unit, and closes when it passes the cap.
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const size_t last =
        sync->buckets_.empty() ? 0 : sync->buckets_.back().parameters.front();
    if (sync->buckets_.empty() || sync->buckets_.back().bytes >= bucket_bytes ||
        params[last].scalar_type() != p.scalar_type() ||
        trainable_units[last] != trainable_units[k]) {
      sync->buckets_.emplace_back();
    }
    Bucket& bucket = sync->buckets_.back();
    bucket.parameters.push_back(k);
    bucket.columns.push_back(bucket.row);
    bucket.row += ChunkOf(p.numel(), 0, group->world_size()).chunk;
    bucket.numel += p.numel();
    bucket.bytes += bytes;
    sync->bucket_of_[k] = sync->buckets_.size() - 1;
    sync->stats_.bytes += bytes;
    sync->stats_.largest_bucket_bytes =
        std::max(sync->stats_.largest_bucket_bytes, bucket.bytes);
  }
  sync->stats_.buckets = static_cast<int64_t>(sync->buckets_.size());
  sync->piece_sums_.resize(params.size());
  GradientSync* raw = sync.get();
  sync->hooks_ = std::make_unique<AccumulatorHooks>(
      params, [raw](size_t k) { raw->OnGradientReady(k); });
  return sync;
}

GradientSync::~GradientSync() = default;

int64_t GradientSync::num_buckets() const {
  return static_cast<int64_t>(buckets_.size());
}

void GradientSync::BeginStep() {
  GradientSyncStats fresh;
  fresh.bytes = stats_.bytes;
  fresh.buckets = stats_.buckets;
  fresh.largest_bucket_bytes = stats_.largest_bucket_bytes;
  stats_ = fresh;
  armed_ = false;
  hook_status_ = absl::OkStatus();
  in_flight_.clear();
  piece_sums_.assign(parameters_.size(), at::Tensor());
  for (Bucket& bucket : buckets_) {
    bucket.started = false;
    bucket.stale = false;
    bucket.flat = at::Tensor();
    bucket.row_sums = at::Tensor();
    bucket.reduce = PendingCollective();
  }
}

void GradientSync::Arm() {
  if (sharded() && armed_) {
    // The previous micro-batch's backward: its sums reach the pieces before
    // this backward's gradients arrive.
    absl::Status status = CompleteRound();
    if (hook_status_.ok()) hook_status_ = status;
  }
  armed_ = true;
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    bucket.started = false;
    bucket.stale = false;
    bucket.flat = at::Tensor();
  }
}

void GradientSync::SampleBytes() {
  std::unordered_set<const c10::StorageImpl*> seen;
  int64_t bytes = 0;
  auto add = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    if (seen.insert(storage).second) bytes += static_cast<int64_t>(storage->nbytes());
  };
  for (const at::Tensor& p : parameters_) add(p.grad());
  for (const Bucket& bucket : buckets_) {
    add(bucket.flat);
    add(bucket.row_sums);
  }
  for (const at::Tensor& sum : piece_sums_) add(sum);
  stats_.peak_bytes = std::max(stats_.peak_bytes, bytes);
}

void GradientSync::OnGradientReady(size_t parameter) {
  SampleBytes();
  if (!armed_ || !hook_status_.ok()) return;
  const size_t b = bucket_of_[parameter];
  Bucket& bucket = buckets_[b];
  absl::Status status;
  if (bucket.started) {
    bucket.stale = true;
  } else if (--bucket.pending == 0) {
    status = StartBucket(b);
    if (status.ok()) ++stats_.buckets_started_in_backward;
  }
  if (status.ok() && sharded()) status = ConsumeFinished();
  if (!status.ok() && hook_status_.ok()) hook_status_ = status;
}

absl::Status GradientSync::StartBucket(size_t b) {
  Bucket& bucket = buckets_[b];
  if (sharded()) {
    RETURN_IF_ERROR(LayOutRows(b));
  } else {
    std::vector<at::Tensor> pieces;
    pieces.reserve(bucket.parameters.size());
    for (size_t k : bucket.parameters) {
      const at::Tensor& p = parameters_[k];
      const at::Tensor& grad = p.grad();
      pieces.push_back(grad.defined() ? grad.detach().reshape({-1})
                                      : at::zeros({p.numel()}, p.options()));
    }
    at::NoGradGuard no_grad;
    bucket.flat = at::cat(pieces);
  }
  SampleBytes();
  bucket.started = true;
  absl::StatusOr<PendingCollective> pending =
      sharded() ? group_->StartReduceScatterSum(bucket.row_sums, bucket.flat)
                : group_->StartAllReduceSum(bucket.flat);
  if (!pending.ok()) return pending.status();
  bucket.reduce = std::move(*pending);
  if (sharded()) in_flight_.push_back(b);
  return absl::OkStatus();
}

absl::Status GradientSync::LayOutRows(size_t b) {
  Bucket& bucket = buckets_[b];
  const int64_t world = group_->world_size();
  const at::Tensor& first = parameters_[bucket.parameters.front()];
  return TorchBoundary("laying out a gradient bucket", [&] {
    at::NoGradGuard no_grad;
    // The buffers hold the gradients now: the memory report counts them as
    // gradients, as the trainer tags .grads.
    memory::OwnedByScope scope(first, Category::kGradients);
    bucket.row_sums = at::empty({bucket.row}, first.options());
    // One parameter that the ranks divide: its gradient, read flat, is the
    // rank-major layout already, and is reduce-scattered in its own storage
    // (no copy; nothing left once the .grad is dropped).
    const at::Tensor& only = first.grad();
    if (bucket.parameters.size() == 1 && only.defined() && only.is_contiguous() &&
        first.numel() == world * bucket.row) {
      bucket.flat = only.detach().view({-1});
      first.mutable_grad() = at::Tensor();
      return;
    }
    bucket.flat = at::zeros({world * bucket.row}, first.options());
    const at::Tensor rows = bucket.flat.view({world, bucket.row});
    for (size_t i = 0; i < bucket.parameters.size(); ++i) {
      const at::Tensor& p = parameters_[bucket.parameters[i]];
      const at::Tensor& grad = p.grad();
      const int64_t chunk = ChunkOf(p.numel(), 0, static_cast<int>(world)).chunk;
      if (!grad.defined() || chunk == 0) continue;  // zeros
      // Piece r of the gradient into row r, the padding left zero: the
      // gradient's first full chunks in one copy, the short one after.
      const at::Tensor g = grad.detach().reshape({-1});
      const at::Tensor column = rows.narrow(1, bucket.columns[i], chunk);
      const int64_t full = p.numel() / chunk;
      column.narrow(0, 0, full).copy_(g.narrow(0, 0, full * chunk).view({full, chunk}));
      if (const int64_t rest = p.numel() - full * chunk; rest > 0) {
        column[full].narrow(0, 0, rest).copy_(g.narrow(0, full * chunk, rest));
      }
    }
    for (size_t k : bucket.parameters) parameters_[k].mutable_grad() = at::Tensor();
  });
}

absl::Status GradientSync::ConsumeBucket(size_t b) {
  Bucket& bucket = buckets_[b];
  RETURN_IF_ERROR(bucket.reduce.Wait());
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    const size_t k = bucket.parameters[i];
    const int64_t length = targets_[k].numel();
    if (length == 0) continue;
    at::Tensor sum = bucket.row_sums.narrow(0, bucket.columns[i], length);
    // The first sum is kept as it is (a view of the row); later
    // micro-batches' are added to it.
    if (piece_sums_[k].defined()) {
      piece_sums_[k].add_(sum);
    } else {
      piece_sums_[k] = sum;
    }
  }
  bucket.flat = at::Tensor();
  bucket.row_sums = at::Tensor();
  return absl::OkStatus();
}

absl::Status GradientSync::ConsumeFinished() {
  while (!in_flight_.empty()) {
    const size_t oldest = in_flight_.front();
    const bool too_many = in_flight_.size() > static_cast<size_t>(kMaxBucketsInFlight);
    // A plan's collectives (ProcessGroup::ForPlan) read as not finished
    // until waited for, so a plan keeps the buckets in flight as a real rank
    // does when its reduces have not finished yet: it counts the most a rank
    // can hold rather than the least.
    const bool finished = buckets_[oldest].reduce.Done();
    if (!too_many && !finished) break;
    const auto start = std::chrono::steady_clock::now();
    in_flight_.erase(in_flight_.begin());
    absl::Status status = ConsumeBucket(oldest);
    if (too_many) {
      stats_.exposed_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    RETURN_IF_ERROR(status);
  }
  return absl::OkStatus();
}

absl::Status GradientSync::CompleteRound() {
  armed_ = false;
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = hook_status_;
  // Every rank walks the buckets in the same order, so the collectives of the
  // buckets started here (and of stale ones, again) match across ranks.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!status.ok()) break;
    if (!buckets_[b].started) status = StartBucket(b);
  }
  if (sharded()) {
    for (size_t b : in_flight_) {
      absl::Status consumed = ConsumeBucket(b);
      if (status.ok()) status = consumed;
    }
    in_flight_.clear();
  } else {
    for (Bucket& bucket : buckets_) {
      absl::Status wait = bucket.reduce.Wait();
      if (status.ok()) status = wait;
    }
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!status.ok() || !buckets_[b].stale) continue;
    status = StartBucket(b);
    if (!status.ok()) break;
    if (sharded()) {
      in_flight_.clear();
      status = ConsumeBucket(b);
    } else {
      status = buckets_[b].reduce.Wait();
    }
  }
  stats_.exposed_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

absl::Status GradientSync::Finish() {
  if (!armed_) {
    return absl::FailedPreconditionError(
        "GradientSync::Finish without Arm before the backward");
  }
  RETURN_IF_ERROR(CompleteRound());

  at::NoGradGuard no_grad;
  const double world = static_cast<double>(group_->world_size());
  if (sharded()) {
    for (size_t k = 0; k < parameters_.size(); ++k) {
      parameters_[k].mutable_grad() = at::Tensor();
      at::Tensor target = targets_[k];
      if (target.numel() == 0) continue;
      at::Tensor& sum = piece_sums_[k];
      if (!sum.defined()) sum = at::zeros_like(target);
      sum.div_(world);
      target.mutable_grad() = std::move(sum);
      sum = at::Tensor();
    }
    SampleBytes();
    return absl::OkStatus();
  }
  for (Bucket& bucket : buckets_) {
    bucket.flat.div_(world);
    int64_t offset = 0;
    for (size_t k : bucket.parameters) {
      const at::Tensor& p = parameters_[k];
      at::Tensor average = bucket.flat.narrow(0, offset, p.numel()).view(p.sizes());
      offset += p.numel();
      if (p.grad().defined()) {
        p.mutable_grad().copy_(average);
      } else {
        p.mutable_grad() = average.clone();
      }
    }
    bucket.flat = at::Tensor();
  }
  SampleBytes();
  return absl::OkStatus();
}

}  // namespace memprofd
