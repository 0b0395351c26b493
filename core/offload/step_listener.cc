#include "core/offload/step_listener.h"

#include <vector>

namespace memprofd::offload {
namespace {

// The head's scope when its saved tensors stay on the device: still inside
// the offloader's scope, so that they are counted, with the exemption nested
// inside it (destroyed first).
struct ExemptHeadScope {
  explicit ExemptHeadScope(Offloader* o) : offload(o) {}
  OffloadScope offload;
  NoOffloadScope exempt;
};

}  // namespace

OffloadStepListener::OffloadStepListener(Offloader* offloader, const LlamaModel* model)
    : offloader_(offloader), model_(model) {}

void OffloadStepListener::OnStepBegin(int64_t) {
  std::vector<at::Tensor> pinned = model_->Parameters();
  for (const at::Tensor& b : model_->Buffers()) pinned.push_back(b);
  offloader_->BeginStep(pinned);
}

std::shared_ptr<void> OffloadStepListener::BodyScope() {
  return std::make_shared<OffloadScope>(offloader_);
}

std::shared_ptr<void> OffloadStepListener::HeadScope() {
  if (offloader_->options().offload_head)
    return std::make_shared<OffloadScope>(offloader_);
  return std::make_shared<ExemptHeadScope>(offloader_);
}

void OffloadStepListener::OnForwardEnd() { offloader_->MarkForwardEnd(); }

absl::Status OffloadStepListener::OnStepEnd(StepReport&) {
  last_step_ = offloader_->EndStep();
  return absl::OkStatus();
}

}  // namespace memprofd::offload
