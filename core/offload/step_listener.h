#ifndef MEMPROFD_CORE_OFFLOAD_STEP_LISTENER_H_
#define MEMPROFD_CORE_OFFLOAD_STEP_LISTENER_H_

// The activation offloader's part in a training step, as a step listener
// (core/train/step_listener.h): each step begins with the model's parameters
// and buffers pinned (never copied), the body's forward runs inside an
// OffloadScope, the head's inside one too, under a NoOffloadScope unless
// options.offload_head (little compute, large activations that backward needs
// first: its saved tensors are counted and stay on the device), and the
// step's statistics are taken when it ends.
//
// Thread-safety: the trainer's owner thread only. The offloader and the model
// must outlive this.

#include <cstdint>
#include <memory>

#include "core/model/llama.h"
#include "core/offload/offloader.h"
#include "core/train/step_listener.h"

namespace memprofd::offload {

class OffloadStepListener : public StepListener {
 public:
  OffloadStepListener(Offloader* offloader, const LlamaModel* model);

  // The statistics of the last step that ended (zeros before the first).
  const OffloadStats& last_step() const { return last_step_; }

  void OnStepBegin(int64_t global_step) override;
  std::shared_ptr<void> BodyScope() override;
  std::shared_ptr<void> HeadScope() override;
  void OnForwardEnd() override;
  absl::Status OnStepEnd(StepReport& report) override;

 private:
  Offloader* const offloader_;
  const LlamaModel* const model_;
  OffloadStats last_step_;
};

}  // namespace memprofd::offload

#endif  // MEMPROFD_CORE_OFFLOAD_STEP_LISTENER_H_
