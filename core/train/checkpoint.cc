#include "core/train/checkpoint.h"

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "core/train/autocast.h"

namespace memprofd {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class CheckpointedLayerFunction
    : public torch::autograd::Function<CheckpointedLayerFunction> {
 public:
  // The layer's parameters are inputs so that autograd routes their
  // gradients through this node (no reentrant backward() into .grad).
  // Function::apply runs this with grad mode off.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            at::TensorList params, const LlamaModel* model,
                            int64_t index) {
    ctx->save_for_backward({hidden});
    // The model is kept by address: AutogradContext's saved_data holds
    // IValues only. The caller guarantees it outlives the backward pass.
    ctx->saved_data["model"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(model));
    ctx->saved_data["index"] = index;
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    // Backward runs outside the forward's autocast scope; the recomputation
    // replays it (as torch.utils.checkpoint does), so that it computes in
    // the same precision as the forward did.
    ctx->saved_data["mixed_precision"] =
        static_cast<int64_t>(CurrentMixedPrecision(model->device().type()));
    return model->Layer(index, hidden);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto* model = reinterpret_cast<const LlamaModel*>(
        static_cast<intptr_t>(ctx->saved_data["model"].toInt()));
    const int64_t index = ctx->saved_data["index"].toInt();
    at::Tensor input = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    std::vector<at::Tensor> params = model->LayerParameters(index);
    TORCH_CHECK(
        static_cast<int64_t>(params.size()) == ctx->saved_data["num_params"].toInt(),
        "layer ", index, " changed between forward and backward");

    at::Tensor output;
    {
      torch::AutoGradMode enable_grad(true);
      AutocastScope autocast(
          static_cast<MixedPrecision>(ctx->saved_data["mixed_precision"].toInt()),
          model->device().type());
      output = model->Layer(index, input);
    }
    // Frozen parameters (placed on disk, or requires_grad off) get no
    // gradient: autograd::grad refuses inputs that do not require grad.
    std::vector<at::Tensor> inputs = {input};
    std::vector<size_t> trainable;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].requires_grad()) {
        inputs.push_back(params[i]);
        trainable.push_back(i);
      }
    }
    variable_list found = torch::autograd::grad({output}, inputs, {grad_outputs[0]},
                                                /*retain_graph=*/false,
                                                /*create_graph=*/false,
                                                /*allow_unused=*/true);
    variable_list grads(1 + params.size());
    grads[0] = found[0];
    for (size_t j = 0; j < trainable.size(); ++j) grads[1 + trainable[j]] = found[1 + j];
    // No gradient for the model pointer and the index.
    grads.emplace_back();
    grads.emplace_back();
    return grads;
  }
};

}  // namespace

at::Tensor CheckpointedLayer(const LlamaModel& model, int64_t index,
                             const at::Tensor& hidden) {
  std::vector<at::Tensor> params = model.LayerParameters(index);
  return CheckpointedLayerFunction::apply(hidden, at::TensorList(params), &model, index);
}

}  // namespace memprofd
