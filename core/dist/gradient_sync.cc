#include "core/dist/gradient_sync.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memprofd {

struct GradientSync::Bucket {
  std::vector<size_t> parameters;  // indices into parameters_
  int64_t numel = 0;
  int64_t pending = 0;  // gradients not yet ready this step
  bool started = false;
  // A gradient changed after the bucket started (a parameter accumulated
  // twice in one backward): it is reduced again in Finish.
  bool stale = false;
  at::Tensor flat;
  PendingCollective reduce;
};

// Runs after a parameter's AccumulateGrad: its .grad is final for this
// backward.
class GradientSync::ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  ReadyHook(GradientSync* sync, size_t parameter) : sync_(sync), parameter_(parameter) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list&) override {
    sync_->OnGradientReady(parameter_);
    return outputs;
  }

 private:
  GradientSync* const sync_;
  const size_t parameter_;
};

GradientSync::GradientSync(ProcessGroup* group, std::vector<at::Tensor> parameters)
    : group_(group), parameters_(std::move(parameters)) {}

absl::StatusOr<std::unique_ptr<GradientSync>> GradientSync::Create(
    ProcessGroup* group, std::vector<at::Tensor> parameters, int64_t bucket_bytes) {
  if (bucket_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket size must be positive, got ", bucket_bytes, " bytes"));
  }
  std::vector<at::Tensor> trainable;
  for (at::Tensor& p : parameters) {
    if (!p.requires_grad()) continue;
    if (!trainable.empty() && p.device() != trainable.front().device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data-parallel gradients must share one device; found ",
                       trainable.front().device().str(), " and ", p.device().str()));
    }
    trainable.push_back(std::move(p));
  }
  std::unique_ptr<GradientSync> sync(new GradientSync(group, std::move(trainable)));
  const std::vector<at::Tensor>& params = sync->parameters_;
  sync->bucket_of_.resize(params.size());
  // Reverse order: the last layers' gradients come first in backward. A
  // bucket holds one dtype and closes when it passes the cap.
  int64_t bucket_bytes_so_far = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const at::Tensor& p = params[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (sync->buckets_.empty() || bucket_bytes_so_far >= bucket_bytes ||
        params[sync->buckets_.back().parameters.front()].scalar_type() !=
            p.scalar_type()) {
      sync->buckets_.emplace_back();
      bucket_bytes_so_far = 0;
    }
    Bucket& bucket = sync->buckets_.back();
    bucket.parameters.push_back(k);
    bucket.numel += p.numel();
    bucket_bytes_so_far += bytes;
    sync->bucket_of_[k] = sync->buckets_.size() - 1;
    sync->stats_.bytes += bytes;
  }
  sync->stats_.buckets = static_cast<int64_t>(sync->buckets_.size());
  for (size_t k = 0; k < params.size(); ++k) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(params[k]);
    sync->hook_keys_.push_back(
        accumulator->add_post_hook(std::make_unique<ReadyHook>(sync.get(), k)));
    sync->accumulators_.push_back(std::move(accumulator));
  }
  return sync;
}

GradientSync::~GradientSync() {
  for (size_t k = 0; k < accumulators_.size(); ++k) {
    accumulators_[k]->del_post_hook(hook_keys_[k]);
  }
}

int64_t GradientSync::num_buckets() const {
  return static_cast<int64_t>(buckets_.size());
}

void GradientSync::Arm() {
  armed_ = true;
  hook_status_ = absl::OkStatus();
  const int64_t bytes = stats_.bytes;
  stats_ = GradientSyncStats();
  stats_.bytes = bytes;
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    bucket.started = false;
    bucket.stale = false;
    bucket.flat = at::Tensor();
  }
}

void GradientSync::OnGradientReady(size_t parameter) {
  if (!armed_) return;
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  if (bucket.started) {
    bucket.stale = true;
    return;
  }
  if (--bucket.pending > 0) return;
  absl::Status status = StartBucket(bucket);
  if (status.ok()) {
    ++stats_.buckets_started_in_backward;
  } else if (hook_status_.ok()) {
    hook_status_ = status;
  }
}

absl::Status GradientSync::StartBucket(Bucket& bucket) {
  std::vector<at::Tensor> pieces;
  pieces.reserve(bucket.parameters.size());
  for (size_t k : bucket.parameters) {
    const at::Tensor& p = parameters_[k];
    const at::Tensor& grad = p.grad();
    pieces.push_back(grad.defined() ? grad.detach().reshape({-1})
                                    : at::zeros({p.numel()}, p.options()));
  }
  {
    at::NoGradGuard no_grad;
    bucket.flat = at::cat(pieces);
  }
  bucket.started = true;
  absl::StatusOr<PendingCollective> pending = group_->StartAllReduceSum(bucket.flat);
  if (!pending.ok()) return pending.status();
  bucket.reduce = std::move(*pending);
  return absl::OkStatus();
}

absl::Status GradientSync::Finish() {
  if (!armed_) {
    return absl::FailedPreconditionError(
        "GradientSync::Finish without Arm before the backward");
  }
  armed_ = false;
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = hook_status_;
  // Every rank walks the buckets in the same order, so the collectives of the
  // buckets started here (and of stale ones, again) match across ranks.
  for (Bucket& bucket : buckets_) {
    if (!status.ok()) break;
    if (!bucket.started) status = StartBucket(bucket);
  }
  for (Bucket& bucket : buckets_) {
    absl::Status wait = bucket.reduce.Wait();
    if (status.ok()) status = wait;
  }
  for (Bucket& bucket : buckets_) {
    if (!status.ok() || !bucket.stale) continue;
    status = StartBucket(bucket);
    if (status.ok()) status = bucket.reduce.Wait();
  }
  stats_.exposed_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!status.ok()) return status;

  at::NoGradGuard no_grad;
  const double world = static_cast<double>(group_->world_size());
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
  return absl::OkStatus();
}

}  // namespace memprofd
