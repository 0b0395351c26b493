#include "core/dist/accumulator_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace memprofd {

class AccumulatorHooks::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(const std::function<void(size_t)>* on_ready, size_t index)
      : on_ready_(on_ready), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list&) override {
    (*on_ready_)(index_);
    return outputs;
  }

 private:
  const std::function<void(size_t)>* const on_ready_;
  const size_t index_;
};

AccumulatorHooks::AccumulatorHooks(const std::vector<at::Tensor>& parameters,
                                   std::function<void(size_t)> on_ready)
    : on_ready_(std::move(on_ready)) {
  for (size_t k = 0; k < parameters.size(); ++k) {
    std::shared_ptr<torch::autograd::Node> accumulator =
        torch::autograd::impl::grad_accumulator(parameters[k]);
    keys_.push_back(accumulator->add_post_hook(std::make_unique<Hook>(&on_ready_, k)));
    accumulators_.push_back(std::move(accumulator));
  }
}

AccumulatorHooks::~AccumulatorHooks() {
  for (size_t k = 0; k < accumulators_.size(); ++k)
    accumulators_[k]->del_post_hook(keys_[k]);
}

}  // namespace memprofd
