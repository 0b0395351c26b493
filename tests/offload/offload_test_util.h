#ifndef MEMPROFD_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_
#define MEMPROFD_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_

// Helpers shared by the offloader tests: a factory that fails the test on
// error, and autograd functions that save exactly the tensors a test names
// and record what backward got back.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/offload/offloader.h"
#include "tests/testing/cuda.h"

namespace memprofd::offload::testing {

inline std::unique_ptr<Offloader> MakeOffloader(
    Target target, int64_t min_offload_bytes, bool enabled = true,
    c10::Device device = c10::Device(c10::kCPU), int prefetch_depth = kPrefetchAuto) {
  OffloadOptions options;
  options.enabled = enabled;
  options.target = target;
  options.min_offload_bytes = min_offload_bytes;
  options.prefetch_depth = prefetch_depth;
  auto offloader = Offloader::Create(options, device);
  EXPECT_TRUE(offloader.ok()) << offloader.status();
  return offloader.ok() ? std::move(offloader).value() : nullptr;
}

// The CUDA tests skip (and say why) without a CUDA device; a GPU host runs
// them (testing::HasCuda also initialises CUDA for them).
#define MEMPROFD_SKIP_WITHOUT_CUDA() \
  if (!::memprofd::testing::HasCuda()) GTEST_SKIP() << ::memprofd::testing::kNeedsCuda

// What backward got back for each saved tensor, in unpack order.
inline std::vector<at::Tensor>& Unpacked() {
  static std::vector<at::Tensor> unpacked;
  return unpacked;
}

// y = sum(a * a); saves `a` exactly as given (a view stays a view).
struct SaveOne : public torch::autograd::Function<SaveOne> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a) {
    ctx->save_for_backward({a});
    return (a * a).sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    Unpacked().push_back(saved[0]);
    return {2 * saved[0] * grads[0]};
  }
};

// y = sum(a * a) + sum(b * b); saves `a` and `b` as given.
struct SaveTwo : public torch::autograd::Function<SaveTwo> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& a,
                            const at::Tensor& b) {
    ctx->save_for_backward({a, b});
    return (a * a).sum() + (b * b).sum();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    Unpacked().push_back(saved[0]);
    Unpacked().push_back(saved[1]);
    return {2 * saved[0] * grads[0], 2 * saved[1] * grads[0]};
  }
};

// The bytes between the first and the last element of `t`, inclusive.
inline int64_t SpanBytes(const at::Tensor& t) {
  int64_t last = 0;
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return (last + 1) * static_cast<int64_t>(t.element_size());
}

}  // namespace memprofd::offload::testing

#endif  // MEMPROFD_TESTS_OFFLOAD_OFFLOAD_TEST_UTIL_H_
