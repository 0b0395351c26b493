#include "core/plan/gemm_buffers.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "core/memory/cpu_allocator.h"

namespace memprofd::plan::internal {
namespace {

// The pad of the thread's Bf16GemmBuffers (-1: none).
thread_local int64_t g_pad = -1;

std::unique_ptr<at::ObserverContext> OnStart(const at::RecordFunction& /*fn*/) {
  return nullptr;
}

void OnEnd(const at::RecordFunction& fn, at::ObserverContext* /*context*/) {
  if (g_pad < 0) return;
  const char* name = fn.name();
  if (std::strcmp(name, "aten::mm") != 0 && std::strcmp(name, "aten::addmm") != 0) return;
  const c10::ArrayRef<c10::IValue> outputs = fn.outputs();
  if (outputs.empty() || !outputs[0].isTensor()) return;
  const at::Tensor& out = outputs[0].toTensor();
  if (!out.defined() || !out.is_meta() || out.scalar_type() != at::kBFloat16 ||
      out.dim() != 2) {
    return;
  }
  // Live beside the output, then gone, as in the real kernel.
  (void)at::empty({out.numel() * 4 + g_pad},
                  at::TensorOptions().dtype(at::kByte).device(at::kMeta));
}

}  // namespace

std::optional<int64_t> HostBf16GemmBufferPad() {
  static const std::optional<int64_t> pad = []() -> std::optional<int64_t> {
    if (!memory::IsCountingCpuAllocatorInstalled()) return std::nullopt;
    constexpr int64_t kSide = 64;
    constexpr int64_t kOutBytes = kSide * kSide * 2;
    // The least extra over a few tries: another thread's allocations can
    // only add to what one try sees.
    int64_t extra = std::numeric_limits<int64_t>::max();
    try {
      const at::Tensor a = at::ones({kSide, kSide}, at::kBFloat16);
      const at::Tensor b = at::ones({kSide, kSide}, at::kBFloat16);
      for (int i = 0; i < 5; ++i) {
        const int64_t before = memory::CpuAllocatedBytesTotal();
        { const at::Tensor c = at::mm(a, b); }
        extra = std::min(extra, memory::CpuAllocatedBytesTotal() - before - kOutBytes);
      }
    } catch (const std::exception&) {
      return std::nullopt;
    }
    const int64_t buffer = kSide * kSide * 4;
    if (extra < buffer) return std::nullopt;
    return extra - buffer;
  }();
  return pad;
}

Bf16GemmBuffers::Bf16GemmBuffers(int64_t pad) : previous_pad_(g_pad) {
  g_pad = pad;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&OnStart, &OnEnd)
                                           .needsInputs(false)
                                           .needsOutputs(true)
                                           .needsIds(false)
                                           .scopes({at::RecordScope::FUNCTION}));
}

Bf16GemmBuffers::~Bf16GemmBuffers() {
  at::removeCallback(handle_);
  g_pad = previous_pad_;
}

}  // namespace memprofd::plan::internal
