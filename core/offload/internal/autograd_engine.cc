// OffloadingAutogradEngine: LibTorch's default autograd engine with saved-tensor
// hooks for tensors saved inside an OffloadScope, and its installation.

#include "core/offload/internal/autograd_engine.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <memory>
#include <mutex>
#include <utility>

#include "core/memory/tagging.h"
#include "core/offload/internal/saved_tensor_store.h"

namespace memprofd::offload::internal {
namespace {

// One per saved tensor, owned by its SavedVariable: what it packed is freed
// when autograd releases the variable (after its node ran, or with an unused
// graph).
class SavedTensorHooks final : public torch::autograd::SavedVariableHooks {
 public:
  SavedTensorHooks(std::shared_ptr<SavedTensorStore> store, bool exempt)
      : store_(std::move(store)), exempt_(exempt) {}

  void call_pack_hook(const at::Tensor& tensor) override {
    // Every saved storage passes here, offloaded or not: its bytes are saved
    // activations from now on (parameters and the like keep their category).
    memory::MarkSavedActivation(tensor);
    store_->Pack(tensor, exempt_, &packed_);
  }
  at::Tensor call_unpack_hook() override { return store_->Unpack(packed_); }

 private:
  const std::shared_ptr<SavedTensorStore> store_;
  const bool exempt_;
  PackedTensor packed_;
};

// The default engine, plus hooks for tensors saved inside an OffloadScope.
// Created once and leaked: Engine's worker threads outlive static destruction.
class OffloadingAutogradEngine final : public torch::autograd::Engine {
 public:
  static torch::autograd::Engine& Get() {
    static OffloadingAutogradEngine* engine = new OffloadingAutogradEngine();
    return *engine;
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks()
      override {
    const ThreadScope& scope = CurrentThreadScope();
    if (scope.store == nullptr) return nullptr;
    return std::make_unique<SavedTensorHooks>(scope.store->shared_from_this(),
                                              scope.exempt);
  }

 private:
  OffloadingAutogradEngine() = default;
};

}  // namespace

ThreadScope& CurrentThreadScope() {
  thread_local ThreadScope scope;
  return scope;
}

absl::Status InstallEngine() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Another stub (libtorch_python's) would already have replaced the base
    // engine; checked below.
    torch::autograd::set_default_engine_stub(&OffloadingAutogradEngine::Get);
  });
  if (&torch::autograd::Engine::get_default_engine() !=
      &OffloadingAutogradEngine::Get()) {
    return absl::FailedPreconditionError(
        "another autograd engine replaced memprofd's (is libtorch_python loaded?); "
        "activation offloading cannot work in this process");
  }
  return absl::OkStatus();
}

}  // namespace memprofd::offload::internal
