#include "core/plan/meta_kernels.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "core/model/config.h"
#include "core/model/llama.h"
#include "core/train/meta_autocast.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"

namespace memprofd::plan {
namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kSeq = 16;

// Wraps the meta allocator and counts the bytes it hands out and gets back,
// as a planner will. Installed for its lifetime.
class CountingMetaAllocator final : public c10::Allocator {
 public:
  CountingMetaAllocator() : base_(c10::GetAllocator(c10::DeviceType::Meta)) {
    c10::SetAllocator(c10::DeviceType::Meta, this);
  }
  ~CountingMetaAllocator() override { c10::SetAllocator(c10::DeviceType::Meta, base_); }

  c10::DataPtr allocate(size_t n) override {
    allocated_ += static_cast<int64_t>(n);
    live_ += static_cast<int64_t>(n);
    auto* ctx = new Allocation{base_->allocate(n), n, this};
    void* data = ctx->inner.get();
    return {data, ctx, &Free, c10::Device(c10::DeviceType::Meta)};
  }
  void copy_data(void* /*dest*/, const void* /*src*/, size_t /*count*/) const override {}

  int64_t allocated() const { return allocated_; }
  int64_t live() const { return live_; }

 private:
  struct Allocation {
    c10::DataPtr inner;
    size_t bytes;
    CountingMetaAllocator* owner;
  };
  static void Free(void* ctx) {
    auto* a = static_cast<Allocation*>(ctx);
    a->owner->live_ -= static_cast<int64_t>(a->bytes);
    delete a;
  }

  c10::Allocator* base_;
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> live_{0};
};

at::TensorOptions Meta(at::ScalarType dtype = at::kFloat) {
  return at::TensorOptions().dtype(dtype).device(at::kMeta);
}

class MetaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(RegisterMetaKernels().ok()); }
};

// One forward, loss and backward of a small Llama on meta with `attention`;
// returns the bytes the meta allocator handed out.
void RunStepOnMeta(AttentionImplementation attention, int64_t* allocated) {
  CountingMetaAllocator counter;
  const int64_t live_before = counter.live();
  {
    const LlamaConfig config = testing::SmallLlamaConfig();
    absl::StatusOr<std::unique_ptr<LlamaModel>> model =
        LlamaModel::Create(config, /*seed=*/1, c10::Device(c10::DeviceType::Meta));
    ASSERT_TRUE(model.ok()) << model.status();
    (*model)->set_attention_implementation(attention);
    const at::Tensor ids = at::zeros({kBatch, kSeq}, Meta(at::kLong));
    const at::Tensor targets = at::zeros({kBatch * kSeq}, Meta(at::kLong));

    const at::Tensor logits = (*model)->Forward(ids);
    EXPECT_TRUE(logits.is_meta());
    EXPECT_EQ(logits.sizes(), (at::IntArrayRef{kBatch, kSeq, config.vocab_size}));
    const at::Tensor loss = torch::nn::functional::cross_entropy(
        logits.view({-1, config.vocab_size}), targets);
    EXPECT_TRUE(loss.is_meta());
    EXPECT_EQ(loss.dim(), 0);
    loss.backward();
    for (const auto& [name, param] : (*model)->NamedParameters()) {
      ASSERT_TRUE(param.grad().defined()) << name;
      EXPECT_TRUE(param.grad().is_meta()) << name;
      EXPECT_EQ(param.grad().sizes(), param.sizes()) << name;
    }
  }
  *allocated = counter.allocated();
  EXPECT_GT(counter.allocated(), 0);
  EXPECT_EQ(counter.live(), live_before);
}

TEST_F(MetaKernelsTest, LlamaStepRunsOnMetaWithSdpa) {
  int64_t allocated = 0;
  RunStepOnMeta(AttentionImplementation::kSdpa, &allocated);
  std::cout << "meta bytes allocated (sdpa step): " << allocated << "\n";
}

TEST_F(MetaKernelsTest, LlamaStepRunsOnMetaWithEagerAttention) {
  int64_t allocated = 0;
  RunStepOnMeta(AttentionImplementation::kEager, &allocated);
  std::cout << "meta bytes allocated (eager step): " << allocated << "\n";
}

TEST_F(MetaKernelsTest, FusedAdamWStepRunsOnMeta) {
  CountingMetaAllocator counter;
  {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (const std::vector<int64_t>& shape :
         {std::vector<int64_t>{8, 4}, std::vector<int64_t>{4}}) {
      params.push_back(at::empty(shape, Meta()));
      grads.push_back(at::empty(shape, Meta()));
      exp_avgs.push_back(at::zeros(shape, Meta()));
      exp_avg_sqs.push_back(at::zeros(shape, Meta()));
      steps.push_back(at::zeros({}, Meta()));
    }
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps,
                      /*lr=*/1e-3, /*beta1=*/0.9, /*beta2=*/0.999, /*weight_decay=*/0.01,
                      /*eps=*/1e-8, /*amsgrad=*/false, /*maximize=*/false);
    EXPECT_EQ(params[0].sizes(), (at::IntArrayRef{8, 4}));
    EXPECT_TRUE(params[0].is_meta());
  }
  EXPECT_GT(counter.allocated(), 0);
  EXPECT_EQ(counter.live(), 0);
}

// Each kernel against the CPU kernel of the same op, for one small input.
void ExpectSameShape(const at::Tensor& meta, const at::Tensor& cpu) {
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.sizes(), cpu.sizes());
  EXPECT_EQ(meta.scalar_type(), cpu.scalar_type());
}

TEST_F(MetaKernelsTest, IndexSelectMatchesCpu) {
  const at::Tensor self = at::randn({5, 3, 4});
  const at::Tensor index = at::tensor(std::vector<int64_t>{0, 2, 2, 1});
  for (int64_t dim : {0, 1, -1}) {
    ExpectSameShape(at::index_select(self.to(at::kMeta), dim, index.to(at::kMeta)),
                    at::index_select(self, dim, index));
  }
}

TEST_F(MetaKernelsTest, EmbeddingDenseBackwardMatchesCpu) {
  const at::Tensor grad = at::randn({2, 3, 4});
  const at::Tensor indices =
      at::tensor(std::vector<int64_t>{0, 5, 1, 5, 2, 3}).view({2, 3});
  ExpectSameShape(at::embedding_dense_backward(grad.to(at::kMeta), indices.to(at::kMeta),
                                               /*num_weights=*/7, /*padding_idx=*/-1,
                                               /*scale_grad_by_freq=*/false),
                  at::embedding_dense_backward(grad, indices, 7, -1, false));
}

TEST_F(MetaKernelsTest, WhereSelfMatchesCpu) {
  const at::Tensor condition = at::rand({3, 1}) > 0.5;
  const at::Tensor self = at::randn({1, 4});
  const at::Tensor other = at::randn({4}, at::kDouble);
  ExpectSameShape(
      at::where(condition.to(at::kMeta), self.to(at::kMeta), other.to(at::kMeta)),
      at::where(condition, self, other));
}

TEST_F(MetaKernelsTest, WhereSelfOutMatchesCpu) {
  const at::Tensor condition = at::rand({3, 1}) > 0.5;
  const at::Tensor self = at::randn({1, 4});
  const at::Tensor other = at::randn({4});
  at::Tensor meta_out = at::empty({0}, Meta());
  at::Tensor cpu_out = at::empty({0});
  at::where_out(meta_out, condition.to(at::kMeta), self.to(at::kMeta),
                other.to(at::kMeta));
  at::where_out(cpu_out, condition, self, other);
  ExpectSameShape(meta_out, cpu_out);
}

// CUDA's flash attention on meta: the shapes and dtypes the CUDA kernel
// returns (output in [B, T, H, D] memory, float32 log-sum-exp [B, H, T],
// grouped key/value heads as they are), and its backward through autograd:
// gradients shaped as the inputs.
TEST_F(MetaKernelsTest, CudaFlashAttentionShapesAndBackward) {
  const int64_t b = 2, h = 4, kv = 2, t = 40, d = 16;
  const at::Tensor q = at::empty({b, h, t, d}, Meta(at::kBFloat16)).requires_grad_();
  const at::Tensor k = at::empty({b, kv, t, d}, Meta(at::kBFloat16)).requires_grad_();
  const at::Tensor v = at::empty({b, kv, t, d}, Meta(at::kBFloat16)).requires_grad_();
  const auto out = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, true, false);
  const at::Tensor& output = std::get<0>(out);
  EXPECT_EQ(output.sizes(), q.sizes());
  EXPECT_EQ(output.scalar_type(), at::kBFloat16);
  EXPECT_EQ(output.transpose(1, 2).is_contiguous(), true);  // [B, T, H, D] memory
  EXPECT_EQ(std::get<1>(out).sizes(), (at::IntArrayRef{b, h, t}));
  EXPECT_EQ(std::get<1>(out).scalar_type(), at::kFloat);
  EXPECT_EQ(std::get<5>(out), t);
  output.sum().backward();
  EXPECT_EQ(q.grad().sizes(), q.sizes());
  EXPECT_EQ(k.grad().sizes(), k.sizes());
  EXPECT_EQ(v.grad().scalar_type(), at::kBFloat16);
}

// CUDA's memory-efficient attention on meta: the log-sum-exp's length is
// rounded up to 32 when training needs it and 0 otherwise; backward through
// autograd.
TEST_F(MetaKernelsTest, CudaEfficientAttentionShapesAndBackward) {
  const int64_t b = 2, h = 4, t = 40, d = 16;
  const at::Tensor q = at::empty({b, h, t, d}, Meta()).requires_grad_();
  const at::Tensor k = at::empty({b, h, t, d}, Meta()).requires_grad_();
  const at::Tensor v = at::empty({b, h, t, d}, Meta()).requires_grad_();
  const auto out =
      at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt, true, 0.0, true);
  EXPECT_EQ(std::get<0>(out).sizes(), q.sizes());
  EXPECT_EQ(std::get<1>(out).sizes(), (at::IntArrayRef{b, h, 64}));
  const auto no_lse = at::_scaled_dot_product_efficient_attention(q, k, v, std::nullopt,
                                                                  false, 0.0, true);
  EXPECT_EQ(std::get<1>(no_lse).size(2), 0);
  std::get<0>(out).sum().backward();
  EXPECT_EQ(q.grad().sizes(), q.sizes());
  EXPECT_EQ(v.grad().sizes(), v.sizes());
}

// The meta autocast under the CUDA target follows CUDA's policy: matmuls in
// bf16, softmax and sum computing float32 (an unset dtype set to float32, a
// set one kept), rsqrt and pow in float32; under the CPU target the same
// ops that have no CPU autocast kernel run as they are.
TEST_F(MetaKernelsTest, MetaAutocastFollowsTheTargetsPolicy) {
  ASSERT_TRUE(EnableMetaAutocast().ok());
  const at::Tensor x = at::empty({4, 8}, Meta());
  const at::Tensor w = at::empty({8, 8}, Meta());
  const at::Tensor low = at::empty({4, 8}, Meta(at::kBFloat16));
  {
    MetaAutocastTargetScope cuda(MetaAutocastTarget::kCuda);
    MetaAutocastScope autocast(true);
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::softmax(low, -1).scalar_type(), at::kFloat);
    EXPECT_EQ(at::softmax(low, -1, at::kBFloat16).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::sum(low).scalar_type(), at::kFloat);
    EXPECT_EQ(at::rsqrt(low).scalar_type(), at::kFloat);
    EXPECT_EQ(low.pow(2).scalar_type(), at::kFloat);
    // Integer tensors are left alone.
    EXPECT_EQ(at::sum(at::empty({4}, Meta(at::kLong))).scalar_type(), at::kLong);
  }
  {
    MetaAutocastTargetScope cpu(MetaAutocastTarget::kCpu);
    MetaAutocastScope autocast(true);
    EXPECT_EQ(at::linear(x, w).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::softmax(low, -1).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::rsqrt(low).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(CurrentMetaAutocastTarget(), MetaAutocastTarget::kCpu);
  // Outside any scope nothing is cast.
  EXPECT_EQ(at::linear(x, w).scalar_type(), at::kFloat);
}

TEST_F(MetaKernelsTest, RegisterMetaKernelsIsIdempotent) {
  EXPECT_TRUE(RegisterMetaKernels().ok());
  EXPECT_TRUE(RegisterMetaKernels().ok());
}

TEST_F(MetaKernelsTest, FusedAdamWMatchesCpuShapes) {
  auto run = [](at::Device device) {
    std::vector<at::Tensor> params{at::randn({3, 2}).to(device)};
    std::vector<at::Tensor> grads{at::randn({3, 2}).to(device)};
    std::vector<at::Tensor> exp_avgs{at::zeros({3, 2}).to(device)};
    std::vector<at::Tensor> exp_avg_sqs{at::zeros({3, 2}).to(device)};
    std::vector<at::Tensor> steps{at::ones({}).to(device)};
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, {}, steps, 1e-3, 0.9, 0.999,
                      0.0, 1e-8, false, false);
    return params[0];
  };
  ExpectSameShape(run(at::kMeta), run(at::kCPU));
}

}  // namespace
}  // namespace memprofd::plan
