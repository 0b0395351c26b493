#include "core/train/meta_autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

// The key the kernels sit on: one no backend of this process uses.
constexpr c10::DispatchKey kKey = c10::DispatchKey::AutocastXLA;

// What an autocast kernel does with an op's floating arguments. kNone: the
// op runs as it is (it has no autocast kernel on that device).
enum class Policy { kNone, kLowerPrecision, kFloat32, kFloat32SetOptDtype, kPromote };

// The CPU autocast's lower-precision and promote ops (by name; every
// overload LibTorch registers for CPU autocast has its name's policy; its
// lists live in autocast_mode.cpp, not in a header). Every other op with a
// CPU autocast kernel is float32.
const std::set<std::string>& CpuLowerPrecisionOps() {
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

const std::set<std::string>& CpuPromoteOps() {
  static const auto* ops =
      new std::set<std::string>{"aten::stack", "aten::cat", "aten::index_copy"};
  return *ops;
}

// CUDA's lists are LibTorch's own (ATen/autocast_mode.h names each entry as
// `op` or `op, overload`); stringized here and read back as operator names.
#define MEMPROFD_AUTOCAST_ENTRY(...) #__VA_ARGS__,

c10::OperatorName EntryName(const std::string& entry) {
  const size_t comma = entry.find(',');
  if (comma == std::string::npos) return {"aten::" + entry, ""};
  size_t overload = comma + 1;
  while (overload < entry.size() && entry[overload] == ' ') ++overload;
  return {"aten::" + entry.substr(0, comma), entry.substr(overload)};
}

using OperatorNames = std::unordered_set<c10::OperatorName>;

OperatorNames EntryNames(const std::vector<std::string>& entries) {
  OperatorNames names;
  for (const std::string& e : entries) names.insert(EntryName(e));
  return names;
}

// The policy CUDA's autocast gives the op `name` (which has a kernel on
// AutocastCUDA): LibTorch's lower-precision, set-opt-dtype and promote lists,
// the cuDNN convolutions (lower precision, registered beside the list), the
// two it registers with kernels of their own (the banned
// binary_cross_entropy, _cudnn_rnn's reflattening cast) run as they are, and
// everything else (the float32 list and norm's overloads) float32.
Policy CudaPolicy(const c10::OperatorName& name) {
  static const auto* lower = new OperatorNames(EntryNames(
      {AT_FORALL_LOWER_PRECISION_FP(MEMPROFD_AUTOCAST_ENTRY) "cudnn_convolution",
       "cudnn_convolution_transpose"}));
  static const auto* set_opt_dtype = new OperatorNames(
      EntryNames({AT_FORALL_FP32_SET_OPT_DTYPE(MEMPROFD_AUTOCAST_ENTRY)}));
  static const auto* promote =
      new OperatorNames(EntryNames({AT_FORALL_PROMOTE(MEMPROFD_AUTOCAST_ENTRY)}));
  if (lower->count(name) > 0) return Policy::kLowerPrecision;
  if (set_opt_dtype->count(name) > 0) return Policy::kFloat32SetOptDtype;
  if (promote->count(name) > 0) return Policy::kPromote;
  if (name.name == "aten::binary_cross_entropy" || name.name == "aten::_cudnn_rnn") {
    return Policy::kNone;
  }
  return Policy::kFloat32;
}

#undef MEMPROFD_AUTOCAST_ENTRY

Policy CpuPolicy(const c10::OperatorName& name) {
  if (CpuLowerPrecisionOps().count(name.name) > 0) return Policy::kLowerPrecision;
  if (CpuPromoteOps().count(name.name) > 0) return Policy::kPromote;
  return Policy::kFloat32;
}

// Each op with a kernel on kKey, and its policy under each target's autocast.
struct OpPolicies {
  Policy cpu = Policy::kNone;
  Policy cuda = Policy::kNone;
};
// Written once by Register (under EnableMetaAutocast's static init), then
// only read.
std::unordered_map<c10::OperatorName, OpPolicies>& Policies() {
  static auto* policies = new std::unordered_map<c10::OperatorName, OpPolicies>();
  return *policies;
}

thread_local MetaAutocastTarget target = MetaAutocastTarget::kCpu;

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

// The first argument, when it is a tensor autocast would cast (what CUDA's
// set-opt-dtype ops check before asking for float32).
bool FirstArgumentEligible(const torch::jit::Stack& stack, size_t arguments) {
  const c10::IValue& first = stack[stack.size() - arguments];
  return first.isTensor() && MetaAutocastEligible(first.toTensor());
}

void Kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
            torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  const auto it = Policies().find(op.operator_name());
  const Policy policy =
      it == Policies().end()
          ? Policy::kNone
          : (target == MetaAutocastTarget::kCuda ? it->second.cuda : it->second.cpu);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(kKey);
  switch (policy) {
    case Policy::kNone:
      break;
    case Policy::kFloat32SetOptDtype: {
      // An unset dtype becomes float32: the op computes (and returns) float32
      // from lower-precision input, as CUDA's autocast asks it to.
      if (!FirstArgumentEligible(*stack, arguments)) break;
      const std::optional<int> dtype = op.schema().argumentIndexWithName("dtype");
      if (!dtype) break;
      c10::IValue& value =
          (*stack)[stack->size() - arguments + static_cast<size_t>(*dtype)];
      if (value.isNone()) value = c10::IValue(at::kFloat);
      break;
    }
    case Policy::kLowerPrecision:
    case Policy::kFloat32:
    case Policy::kPromote: {
      at::ScalarType to = policy == Policy::kFloat32 ? at::kFloat : kMetaAutocastDtype;
      if (policy == Policy::kPromote) {
        // The widest floating type among the eligible arguments (float32 wins).
        CastArguments(stack, arguments, [&](const at::Tensor& t) {
          if (MetaAutocastEligible(t) && t.scalar_type() == at::kFloat) to = at::kFloat;
          return t;
        });
      }
      CastArguments(stack, arguments, [&](const at::Tensor& t) { return Cast(to, t); });
      break;
    }
  }
  op.callBoxed(stack);
}

absl::Status Register() {
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  if (dispatcher.hasBackendFallbackForDispatchKey(kKey)) {
    return absl::FailedPreconditionError(
        absl::StrCat("bf16 plans need the dispatch key ", c10::toString(kKey),
                     ", which something in this process already uses"));
  }
  std::unordered_map<c10::OperatorName, OpPolicies>& policies = Policies();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op) continue;
    OpPolicies p;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU))
      p.cpu = CpuPolicy(name);
    if (op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCUDA)) {
      p.cuda = CudaPolicy(name);
    }
    if (p.cpu == Policy::kNone && p.cuda == Policy::kNone) continue;
    if (op->hasKernelForDispatchKey(kKey)) {
      return absl::FailedPreconditionError(
          absl::StrCat("bf16 plans need the dispatch key ", c10::toString(kKey),
                       ", where ", c10::toString(name), " already has a kernel"));
    }
    policies.emplace(name, p);
  }
  if (policies.empty()) {
    return absl::FailedPreconditionError(
        "bf16 plans follow LibTorch's autocast, and this LibTorch has no autocast "
        "kernels");
  }
  // The dry run's stand-ins for scaled_dot_product_attention, which have no
  // autocast kernel of their own.
  policies[{"aten::_scaled_dot_product_flash_attention_for_cpu", ""}].cpu =
      Policy::kLowerPrecision;
  policies[{"aten::_scaled_dot_product_efficient_attention", ""}].cuda =
      Policy::kLowerPrecision;
  // Never destroyed: the registrations last as long as the process.
  auto* fallthrough =
      new torch::Library(torch::Library::IMPL, "_", kKey, __FILE__, __LINE__);
  fallthrough->fallback(torch::CppFunction::makeFallthrough());
  auto* kernels =
      new torch::Library(torch::Library::IMPL, "aten", kKey, __FILE__, __LINE__);
  for (const auto& [name, p] : policies) {
    const std::string full =
        name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    kernels->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&Kernel>());
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

void ClearMetaAutocastCache() { cache.clear(); }

bool MetaAutocastEligible(const at::Tensor& t) {
  return t.defined() && t.is_meta() && t.is_floating_point() &&
         t.scalar_type() != at::kDouble;
}

MetaAutocastTargetScope::MetaAutocastTargetScope(MetaAutocastTarget t)
    : previous_(target) {
  target = t;
}

MetaAutocastTargetScope::~MetaAutocastTargetScope() { target = previous_; }

MetaAutocastTarget CurrentMetaAutocastTarget() { return target; }

bool MetaAutocastOn() {
  return c10::impl::tls_is_dispatch_key_included(kKey) &&
         !c10::impl::tls_is_dispatch_key_excluded(kKey);
}

}  // namespace memprofd
