#include "core/train/meta_autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

// The key the kernels sit on: one no backend of this process uses.
constexpr c10::DispatchKey kKey = c10::DispatchKey::AutocastXLA;

enum class Policy { kLowerPrecision, kFloat32, kPromote };

// The CPU autocast's lower-precision and promote ops (by name; every
// overload LibTorch registers for CPU autocast has its name's policy). Every
// other op with a CPU autocast kernel is float32.
const std::set<std::string>& LowerPrecisionOps() {
  static const auto* ops = new std::set<std::string>{
      "aten::conv1d",
      "aten::conv2d",
      "aten::conv3d",
      "aten::bmm",
      "aten::mm",
      "aten::linalg_vecdot",
      "aten::baddbmm",
      "aten::addmm",
      "aten::_addmm_activation",
      "aten::addbmm",
      "aten::linear",
      "aten::_convolution",
      "aten::matmul",
      "aten::conv_tbc",
      "aten::mkldnn_rnn_layer",
      "aten::conv_transpose1d",
      "aten::conv_transpose2d",
      "aten::conv_transpose3d",
      "aten::prelu",
      "aten::scaled_dot_product_attention",
      "aten::_native_multi_head_attention",
      // The dry run's stand-in for scaled_dot_product_attention (above).
      "aten::_scaled_dot_product_flash_attention_for_cpu",
  };
  return *ops;
}

const std::set<std::string>& PromoteOps() {
  static const auto* ops =
      new std::set<std::string>{"aten::stack", "aten::cat", "aten::index_copy"};
  return *ops;
}

// This thread's autocast state: the nesting of scopes, and the cached
// bfloat16 copies of weights by the source's TensorImpl (with a weak
// reference, so that a freed source's address is never mistaken for it).
struct CachedCast {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> source;
  at::Tensor cast;
};
thread_local int nesting = 0;
thread_local std::unordered_map<c10::TensorImpl*, CachedCast> cache;

at::Tensor Cast(at::ScalarType to, const at::Tensor& t) {
  if (!MetaAutocastEligible(t) || t.scalar_type() == to) return t;
  const bool cacheable = to == kMetaAutocastDtype && t.scalar_type() == at::kFloat &&
                         t.requires_grad() && t.is_leaf() && !t.is_view() &&
                         at::autocast::is_autocast_cache_enabled();
  if (!cacheable) return t.to(to);
  auto it = cache.find(t.unsafeGetTensorImpl());
  if (it != cache.end() && !it->second.source.expired()) return it->second.cast;
  at::Tensor cast = t.to(to);
  cache.insert_or_assign(
      t.unsafeGetTensorImpl(),
      CachedCast{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                     t.getIntrusivePtr()),
                 cast});
  return cast;
}

// Applies `cast` to every tensor argument on the stack (tensors, optional
// tensors, lists of them).
template <typename CastFn>
void CastArguments(torch::jit::Stack* stack, size_t arguments, const CastFn& cast) {
  for (size_t i = stack->size() - arguments; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      v = cast(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : v.toTensorVector()) out.push_back(cast(t));
      v = out;
    } else if (v.isList()) {
      // Tensor?[]: optional tensors.
      c10::List<c10::IValue> in = v.toList();
      bool tensors = false;
      for (const c10::IValue& e : in) tensors = tensors || e.isTensor();
      if (!tensors) continue;
      c10::List<std::optional<at::Tensor>> out;
      for (const c10::IValue& e : in) {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(cast(e.toTensor()))
                                   : std::nullopt);
      }
      v = out;
    }
  }
}

template <Policy kPolicy>
void Kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
            torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  at::ScalarType to = kPolicy == Policy::kFloat32 ? at::kFloat : kMetaAutocastDtype;
  if (kPolicy == Policy::kPromote) {
    // The widest floating type among the eligible arguments (float32 wins).
    CastArguments(stack, arguments, [&](const at::Tensor& t) {
      if (MetaAutocastEligible(t) && t.scalar_type() == at::kFloat) to = at::kFloat;
      return t;
    });
  }
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
    CastArguments(stack, arguments, [&](const at::Tensor& t) { return Cast(to, t); });
    op.callBoxed(stack);
  }
}

absl::Status Register() {
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.hasBackendFallbackForDispatchKey(kKey)) {
    return absl::FailedPreconditionError(
        absl::StrCat("bf16 plans need the dispatch key ", c10::toString(kKey),
                     ", which something in this process already uses"));
  }
  std::vector<c10::OperatorName> ops;
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU)) continue;
    if (op->hasKernelForDispatchKey(kKey)) {
      return absl::FailedPreconditionError(
          absl::StrCat("bf16 plans need the dispatch key ", c10::toString(kKey),
                       ", where ", c10::toString(name), " already has a kernel"));
    }
    ops.push_back(name);
  }
  if (ops.empty()) {
    return absl::FailedPreconditionError(
        "bf16 plans follow the CPU's autocast, and this LibTorch has no CPU autocast "
        "kernels");
  }
  ops.push_back({"aten::_scaled_dot_product_flash_attention_for_cpu", ""});
  // Never destroyed: the registrations last as long as the process.
  auto* fallthrough =
      new torch::Library(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
  fallthrough->fallback(torch::CppFunction::makeFallthrough());
  auto* kernels =
      new torch::Library(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
  for (const c10::OperatorName& name : ops) {
    const std::string full =
        name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    if (LowerPrecisionOps().count(name.name) > 0) {
      kernels->impl(
          full.c_str(),
          torch::CppFunction::makeFromBoxedFunction<&Kernel<Policy::kLowerPrecision>>());
    } else if (PromoteOps().count(name.name) > 0) {
      kernels->impl(
          full.c_str(),
          torch::CppFunction::makeFromBoxedFunction<&Kernel<Policy::kPromote>>());
    } else {
      kernels->impl(
          full.c_str(),
          torch::CppFunction::makeFromBoxedFunction<&Kernel<Policy::kFloat32>>());
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EnableMetaAutocast() {
  static const absl::Status* const registered = [] {
    absl::Status status;
    try {
      status = Register();
    } catch (const std::exception& e) {
      status = absl::InternalError(
          absl::StrCat("registering the meta device's autocast: ", e.what()));
    }
    return new absl::Status(status);
  }();
  return *registered;
}

MetaAutocastScope::MetaAutocastScope(bool active) : active_(active) {
  if (!active_) return;
  TORCH_CHECK(EnableMetaAutocast().ok(), "the meta device's autocast is not available: ",
              EnableMetaAutocast().message());
  // Like every autocast key, it is in the thread's excluded set by default
  // (autocast off); included and no longer excluded, it applies to every op.
  previous_included_ = c10::impl::tls_is_dispatch_key_included(kKey);
  previous_excluded_ = c10::impl::tls_is_dispatch_key_excluded(kKey);
  c10::impl::tls_set_dispatch_key_included(kKey, true);
  c10::impl::tls_set_dispatch_key_excluded(kKey, false);
  ++nesting;
}

MetaAutocastScope::~MetaAutocastScope() {
  if (!active_) return;
  if (--nesting == 0) cache.clear();
  c10::impl::tls_set_dispatch_key_included(kKey, previous_included_);
  c10::impl::tls_set_dispatch_key_excluded(kKey, previous_excluded_);
}

bool MetaAutocastEligible(const at::Tensor& t) {
  return t.defined() && t.is_meta() && t.is_floating_point() &&
         t.scalar_type() != at::kDouble;
}

bool MetaAutocastOn() {
  return c10::impl::tls_is_dispatch_key_included(kKey) &&
         !c10::impl::tls_is_dispatch_key_excluded(kKey);
}

}  // namespace memprofd
