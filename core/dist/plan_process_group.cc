// The process group of a plan (ProcessGroup::ForPlan): core/plan's dry run of
// one rank, with no backend, no store and no peers. Every rank of a plan is
// the same dry run, so a collective does what it would do if every rank held
// this rank's tensors: an all-reduce, a reduce or a broadcast leaves the
// tensor as it is, an all-gather gives world_size copies of it, and a
// reduce-scatter this rank's chunk of its own input. On meta tensors nothing
// has values; what a plan needs is the tensors each collective makes and how
// long it keeps them, which are a real rank's.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/dist/process_group.h"

namespace memprofd {
namespace {

class PlanProcessGroup : public ProcessGroup {
 public:
  PlanProcessGroup(WorldSpec world, CollectiveBackend backend)
      : ProcessGroup(std::move(world)), backend_(backend) {}

  const char* backend_name() const override { return "plan"; }

  absl::StatusOr<PendingCollective> StartAllReduceSum(const at::Tensor&) override {
    return PendingCollective::DoneOnlyWhenWaited();
  }
  absl::StatusOr<PendingCollective> StartReduceSum(const at::Tensor&, int root) override {
    RETURN_IF_ERROR(CheckRoot("reduce", root));
    return PendingCollective::DoneOnlyWhenWaited();
  }
  absl::StatusOr<PendingCollective> StartBroadcast(const at::Tensor&, int root) override {
    RETURN_IF_ERROR(CheckRoot("broadcast", root));
    return PendingCollective::DoneOnlyWhenWaited();
  }
  absl::StatusOr<std::vector<at::Tensor>> AllGather(const at::Tensor& tensor) override {
    std::vector<at::Tensor> out;
    for (int r = 0; r < world_size(); ++r) out.push_back(tensor.clone());
    return out;
  }
  absl::StatusOr<PendingCollective> StartAllGatherInto(const at::Tensor& output,
                                                       const at::Tensor& input) override {
    RETURN_IF_ERROR(CheckChunks("all-gather into a tensor", output, input));
    at::NoGradGuard no_grad;
    output.view({world_size(), -1}).copy_(input.reshape({1, -1}));
    // Gloo's flat buffer of the output, alive while the collective may be.
    return PendingCollective::DoneOnlyWhenWaited(
        backend_ == CollectiveBackend::kGloo ? at::empty_like(output) : at::Tensor());
  }
  absl::StatusOr<PendingCollective> StartReduceScatterSum(
      const at::Tensor& output, const at::Tensor& input) override {
    RETURN_IF_ERROR(CheckChunks("reduce-scatter", input, output));
    at::NoGradGuard no_grad;
    output.copy_(input.view({world_size(), -1})[rank()]);
    return PendingCollective::DoneOnlyWhenWaited();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }

  absl::Status SetKey(const std::string&, const std::string&) override {
    return NoStore();
  }
  absl::StatusOr<std::string> WaitKey(const std::string&, absl::Duration) override {
    return NoStore();
  }
  absl::StatusOr<std::unique_ptr<StoreChannel>> OpenChannel() override {
    return NoStore();
  }

 private:
  const CollectiveBackend backend_;

  absl::Status NoStore() const {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank(), ": a group for planning has no key-value store"));
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::ForPlan(int rank, int world_size,
                                                    CollectiveBackend backend) {
  WorldSpec world;
  world.rank = rank;
  world.world_size = world_size;
  return std::make_unique<PlanProcessGroup>(std::move(world), backend);
}

}  // namespace memprofd
