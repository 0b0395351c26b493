// FusedAdamW against LibTorch's own torch::optim::AdamW (the per-tensor
// implementation the trainer used before): the same trajectory within float
// rounding, over several steps, two groups with different weight decay, and
// a parameter without a gradient; bit-identical from run to run; and
// sharded into flat pieces, bit for bit the whole update.

#include "core/train/adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "core/common/flat_shard.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

std::vector<at::Tensor> MakeParams() {
  torch::manual_seed(7);
  return {torch::randn({33, 17}).requires_grad_(), torch::randn({64}).requires_grad_(),
          torch::randn({5, 5}).requires_grad_()};
}

// Gradients of step `k`: the same for every optimizer; the last parameter
// gets none on odd steps.
void SetGrads(std::vector<at::Tensor>& params, int k) {
  torch::manual_seed(100 + k);
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 2 && k % 2 == 1) {
      params[i].mutable_grad() = at::Tensor();
    } else {
      params[i].mutable_grad() = torch::randn(params[i].sizes());
    }
  }
}

constexpr int kSteps = 6;

std::vector<at::Tensor> TrainFused() {
  std::vector<at::Tensor> p = MakeParams();
  FusedAdamW::Options decay;
  decay.learning_rate = 1e-2;
  decay.weight_decay = 0.1;
  FusedAdamW::Options no_decay = decay;
  no_decay.weight_decay = 0.0;
  FusedAdamW opt({{p[0], p[2]}, {p[1]}}, {decay, no_decay});
  for (int k = 0; k < kSteps; ++k) {
    SetGrads(p, k);
    opt.Step();
  }
  EXPECT_EQ(opt.State().size(), 6u);  // two moments of each of the three
  return p;
}

std::vector<at::Tensor> TrainReference() {
  std::vector<at::Tensor> p = MakeParams();
  auto options = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(1e-2).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0], p[2]}, options(0.1));
  groups.emplace_back(std::vector<at::Tensor>{p[1]}, options(0.0));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(1e-2));
  for (int k = 0; k < kSteps; ++k) {
    SetGrads(p, k);
    opt.step();
  }
  return p;
}

TEST(FusedAdamWTest, MatchesTorchOptimAdamWWithinFloatRounding) {
  std::vector<at::Tensor> fused = TrainFused();
  std::vector<at::Tensor> reference = TrainReference();
  std::vector<at::Tensor> start = MakeParams();
  for (size_t i = 0; i < fused.size(); ++i) {
    // The parameters moved, and to where LibTorch's AdamW took them.
    EXPECT_GT((fused[i] - start[i]).abs().max().item<double>(), 1e-3) << i;
    EXPECT_TRUE(torch::allclose(fused[i], reference[i], /*rtol=*/1e-5, /*atol=*/1e-6))
        << i << ": max diff " << (fused[i] - reference[i]).abs().max().item<double>();
  }
}

TEST(FusedAdamWTest, BitIdenticalRunToRun) {
  std::vector<at::Tensor> a = TrainFused();
  std::vector<at::Tensor> b = TrainFused();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(FusedAdamWTest, AParameterWithoutAGradientKeepsItsValueAndHasNoState) {
  torch::manual_seed(3);
  at::Tensor used = torch::randn({8}).requires_grad_();
  at::Tensor unused = torch::randn({8}).requires_grad_();
  const at::Tensor before = unused.detach().clone();
  FusedAdamW opt({{used, unused}}, {FusedAdamW::Options()});
  used.mutable_grad() = torch::ones({8});
  opt.Step();
  EXPECT_TRUE(torch::equal(unused, before));
  EXPECT_EQ(opt.State().size(), 2u);
}

// Sharded after a few whole steps, each of 8 ranks updates its flat piece of
// every parameter (the 5x5 one leaves ranks 2 to 7 empty pieces): the pieces
// end bit for bit where the whole parameters do, and the state made before
// sharding is narrowed to them.
TEST(FusedAdamWTest, ShardedPiecesUpdateBitForBitAsTheWhole) {
  constexpr int kWorld = 8;
  const std::vector<at::Tensor> whole = TrainFused();
  FusedAdamW::Options decay;
  decay.learning_rate = 1e-2;
  decay.weight_decay = 0.1;
  FusedAdamW::Options no_decay = decay;
  no_decay.weight_decay = 0.0;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<at::Tensor> p = MakeParams();
    FusedAdamW opt({{p[0], p[2]}, {p[1]}}, {decay, no_decay});
    for (int k = 0; k < kSteps; ++k) {
      SetGrads(p, k);
      if (k == 3) opt.ShardFlat({rank, kWorld});
      if (k >= 3) {
        for (at::Tensor& param : p) {
          at::Tensor target = opt.TargetOf(param);
          ASSERT_EQ(target.dim(), 1);
          const FlatChunk piece = ChunkOf(param.numel(), rank, kWorld);
          ASSERT_EQ(target.numel(), piece.length);
          if (param.grad().defined() && piece.length > 0) {
            target.mutable_grad() =
                param.grad().reshape({-1}).narrow(0, piece.begin, piece.length);
          }
          param.mutable_grad() = at::Tensor();
        }
      }
      opt.Step();
      for (at::Tensor& param : p) {
        if (at::Tensor t = opt.TargetOf(param); t.defined())
          t.mutable_grad() = at::Tensor();
      }
    }
    for (size_t i = 0; i < p.size(); ++i) {
      const FlatChunk piece = ChunkOf(p[i].numel(), rank, kWorld);
      const at::Tensor mine =
          p[i].detach().reshape({-1}).narrow(0, piece.begin, piece.length);
      const at::Tensor theirs =
          whole[i].detach().reshape({-1}).narrow(0, piece.begin, piece.length);
      EXPECT_TRUE(torch::equal(mine, theirs)) << "rank " << rank << " parameter " << i;
      // An empty piece keeps no state; the others' state is the piece's.
      const std::optional<FusedAdamW::ParamState> state = opt.StateOf(p[i]);
      EXPECT_EQ(state.has_value(), piece.length > 0) << rank << " " << i;
      if (state) {
        EXPECT_EQ(state->exp_avg.numel(), piece.length);
      }
    }
  }
}

// PeekStep sees exactly what Step then makes (the same kernel on copies,
// chunked) and changes nothing: not the parameters, not the state.
TEST(FusedAdamWTest, PeekStepSeesWhatStepMakesAndChangesNothing) {
  std::vector<at::Tensor> p = MakeParams();
  FusedAdamW::Options o;
  o.learning_rate = 0.5;
  o.weight_decay = 0.1;
  FusedAdamW opt({p}, {o});
  for (int k = 0; k < 3; ++k) {
    SetGrads(p, k);
    std::vector<at::Tensor> before;
    for (const at::Tensor& t : p) before.push_back(t.detach().clone());
    std::vector<at::Tensor> state_before;
    for (const at::Tensor& t : opt.State()) state_before.push_back(t.clone());
    const FusedAdamW::Peek peek = opt.PeekStep(/*chunk_elements=*/100);
    for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], before[i])) << k;
    const std::vector<at::Tensor> state_now = opt.State();
    ASSERT_EQ(state_now.size(), state_before.size());
    for (size_t i = 0; i < state_now.size(); ++i) {
      EXPECT_TRUE(torch::equal(state_now[i], state_before[i])) << k;
    }
    opt.Step();
    double largest = 0;
    const at::Tensor* at_largest = nullptr;
    for (const at::Tensor& t : p) {
      const double m = t.detach().abs().max().item<double>();
      if (m > largest) {
        largest = m;
        at_largest = &t;
      }
    }
    EXPECT_EQ(peek.largest, largest) << k;
    ASSERT_NE(at_largest, nullptr);
    EXPECT_TRUE(peek.param.is_same(*at_largest)) << k;
  }
  // An update that overflows float (NaN or infinite values): infinity.
  o.learning_rate = 1e39;
  opt.set_options(0, o);
  SetGrads(p, 3);
  EXPECT_EQ(opt.PeekStep().largest, INFINITY);
}

TEST(FusedAdamWTest, ChunkOfCutsEqualPaddedAlignedPieces) {
  for (const auto& [numel, world] : std::vector<std::pair<int64_t, int>>{
           {25, 8}, {64, 4}, {1, 3}, {561, 4}, {7, 7}, {8192, 3}, {4096, 2}}) {
    int64_t covered = 0;
    for (int r = 0; r < world; ++r) {
      const FlatChunk c = ChunkOf(numel, r, world);
      // ceil(n / N), rounded up to the alignment.
      EXPECT_EQ(c.chunk % kFlatShardAlignment, 0);
      EXPECT_GE(c.chunk, (numel + world - 1) / world);
      EXPECT_LT(c.chunk, (numel + world - 1) / world + kFlatShardAlignment);
      EXPECT_EQ(c.begin, std::min(r * c.chunk, numel));
      EXPECT_GE(c.length, 0);
      EXPECT_LE(c.length, c.chunk);
      if (c.length > 0) {
        EXPECT_EQ(c.begin, covered);
      }
      covered += c.length;
    }
    EXPECT_EQ(covered, numel) << numel << " over " << world;
  }
  // 25 elements over 8 ranks: chunks of 16, the second rank's piece 9, the
  // others' empty; 8192 over 3: 2736, 2736 and 2720.
  EXPECT_EQ(ChunkOf(25, 0, 8).length, 16);
  EXPECT_EQ(ChunkOf(25, 1, 8).length, 9);
  EXPECT_EQ(ChunkOf(25, 2, 8).length, 0);
  EXPECT_EQ(ChunkOf(8192, 2, 3).length, 2720);
  EXPECT_EQ(ChunkOf(4096, 1, 2).length, 2048);
}

}  // namespace
}  // namespace memprofd
