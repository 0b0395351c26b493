// Meta kernels for the ops a Llama training step reaches on the meta device
// and that LibTorch 2.11 has a Meta kernel for only in Python
// (torch/_meta_registrations.py, which a C++ process never loads;
// `torch._C._dispatch_dump(op)` shows "Meta: registered at
// .../_meta_registrations.py" and no C++ Meta or CompositeExplicitAutograd
// kernel). Found by running LlamaModel's forward, cross-entropy and backward
// (sdpa and eager attention) and at::_fused_adamw_ on meta
// (tests/plan/meta_kernels_test.cc) until nothing threw "no fake impl or Meta
// kernel registered":
// - aten::index_select: torch::embedding's lookup;
// - aten::embedding_dense_backward: the embedding's gradient;
// - aten::where.self_out and aten::where.self: SDPA on meta takes the math
//   path (the Meta kernel of _fused_sdp_choice picks it, so the CPU flash
//   kernels are never reached), whose _safe_softmax writes with where.out
//   and whose backward calls where;
// - aten::_fused_adamw_: FusedAdamW's step, in place.
// Each kernel only checks its arguments and allocates its outputs with the
// CPU kernel's shapes and dtypes; none reads data (meta tensors have none).

#include "core/plan/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace memprofd::plan {
namespace {

at::Tensor IndexSelectMeta(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK_INDEX(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt,
              "index_select(): Expected dtype int32 or int64 for index");
  if (self.dim() == 0) return at::empty({}, self.options());
  dim = at::maybe_wrap_dim(dim, self.dim());
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[dim] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor EmbeddingDenseBackwardMeta(const at::Tensor& grad_output,
                                      const at::Tensor& indices, c10::SymInt num_weights,
                                      c10::SymInt /*padding_idx*/,
                                      bool /*scale_grad_by_freq*/) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt,
              "embedding_dense_backward(): Expected dtype int32 or int64 for indices");
  return at::empty_symint({std::move(num_weights), grad_output.sym_size(-1)},
                          grad_output.options());
}

at::Tensor WhereSelfMeta(const at::Tensor& condition, const at::Tensor& self,
                         const at::Tensor& other) {
  TORCH_CHECK(
      condition.scalar_type() == at::kBool,
      "where expected condition to be a boolean tensor, but got a tensor with dtype ",
      condition.scalar_type());
  const at::ScalarType dtype = at::result_type(self, other);
  const std::vector<int64_t> sizes =
      at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, self.options().dtype(dtype));
}

at::Tensor& WhereSelfOutMeta(const at::Tensor& condition, const at::Tensor& self,
                             const at::Tensor& other, at::Tensor& out) {
  const at::Tensor shape = WhereSelfMeta(condition, self, other);
  TORCH_CHECK(out.scalar_type() == shape.scalar_type(), "where: expected out dtype ",
              shape.scalar_type(), ", got ", out.scalar_type());
  at::native::resize_output(out, shape.sizes());
  return out;
}

void FusedAdamWMeta(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                    at::TensorList state_steps, double /*lr*/, double /*beta1*/,
                    double /*beta2*/, double /*weight_decay*/, double /*eps*/,
                    bool amsgrad, bool /*maximize*/,
                    const std::optional<at::Tensor>& /*grad_scale*/,
                    const std::optional<at::Tensor>& /*found_inf*/) {
  // In place: no outputs to allocate, only the lists to check as the CPU
  // kernel does.
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n &&
                  state_steps.size() == n,
              "_fused_adamw_: params, grads, exp_avgs, exp_avg_sqs and state_steps must "
              "have the same length");
  TORCH_CHECK(!amsgrad || max_exp_avg_sqs.size() == n,
              "_fused_adamw_: amsgrad needs one max_exp_avg_sq per param");
  for (size_t i = 0; i < n; ++i) {
    TORCH_CHECK(grads[i].sizes() == params[i].sizes() &&
                    exp_avgs[i].sizes() == params[i].sizes() &&
                    exp_avg_sqs[i].sizes() == params[i].sizes(),
                "_fused_adamw_: param ", i, " of shape ", params[i].sizes(),
                " does not match its grad or state");
  }
}

// The ops above, by schema name, for RegisterMetaKernels' check.
constexpr const char* kOps[][2] = {
    {"aten::index_select", ""},  {"aten::embedding_dense_backward", ""},
    {"aten::where", "self"},     {"aten::where", "self_out"},
    {"aten::_fused_adamw_", ""},
};

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("index_select", TORCH_FN(IndexSelectMeta));
  m.impl("embedding_dense_backward", TORCH_FN(EmbeddingDenseBackwardMeta));
  m.impl("where.self", TORCH_FN(WhereSelfMeta));
  m.impl("where.self_out", TORCH_FN(WhereSelfOutMeta));
  m.impl("_fused_adamw_", TORCH_FN(FusedAdamWMeta));
}

absl::Status RegisterMetaKernels() {
  for (const auto& [name, overload] : kOps) {
    std::optional<c10::OperatorHandle> op =
        c10::Dispatcher::singleton().findSchema({name, overload});
    if (!op.has_value() || !op->hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
      return absl::InternalError(absl::StrCat(
          "no Meta kernel for ", name, *overload ? "." : "", overload,
          " after registration: rebuild memprofd_plan against this LibTorch"));
    }
  }
  return absl::OkStatus();
}

}  // namespace memprofd::plan
