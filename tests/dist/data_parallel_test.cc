// Data parallel across real processes: dist_worker started once per rank with
// torchrun's variables, over Gloo on loopback, one thread each.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/common/flat_shard.h"
#include "core/dist/gradient_sync.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

// A port nobody listens on now (the kernel's pick for port 0).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct RankRun {
  int exit_code = -1;
  std::string output;
};

// Starts `world` ranks of dist_worker with `args`, in which "{rank}" becomes
// the rank (rank r also gets --out=<dir>/params<r>.bin), and waits for all.
std::vector<RankRun> RunRanks(const std::string& dir, int world,
                              const std::string& args) {
  const std::string worker = absl::StrCat(MEMPROFD_BINARY_DIR, "/tests/dist/dist_worker");
  const int port = FreePort();
  std::string script;
  for (int r = 0; r < world; ++r) {
    absl::StrAppend(&script, "(RANK=", r, " WORLD_SIZE=", world,
                    " MASTER_ADDR=127.0.0.1 MASTER_PORT=", port, " ", worker, " ",
                    absl::StrReplaceAll(args, {{"{rank}", absl::StrCat(r)}}),
                    " --out=", dir, "/params", r, ".bin > ", dir, "/rank", r,
                    ".log 2>&1; echo $? > ", dir, "/rank", r, ".rc) & ");
  }
  absl::StrAppend(&script, "wait");
  std::string shell_output;
  testing::RunCommand(script, &shell_output);
  std::vector<RankRun> runs(world);
  for (int r = 0; r < world; ++r) {
    runs[r].output = ReadFile(absl::StrCat(dir, "/rank", r, ".log"));
    std::string rc = ReadFile(absl::StrCat(dir, "/rank", r, ".rc"));
    absl::SimpleAtoi(absl::StripAsciiWhitespace(rc), &runs[r].exit_code);
  }
  return runs;
}

std::vector<float> Floats(const std::string& path) {
  const std::string bytes = ReadFile(path);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

TEST(DataParallelTest, CollectivesAgreeAcrossThreeRanks) {
  testing::TempDir dir;
  std::vector<RankRun> runs = RunRanks(dir.path(), 3, "--scenario=collectives");
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(runs[r].exit_code, 0) << "rank " << r << ":\n" << runs[r].output;
    EXPECT_THAT(runs[r].output, HasSubstr("collectives ok on gloo"));
  }
}

double MaxAbs(const std::vector<float>& a) {
  double worst = 0;
  for (float v : a) worst = std::max(worst, std::fabs(static_cast<double>(v)));
  return worst;
}

// The "step N loss L [rank_loss R]" lines of a worker's output: {N: {L, R}}
// (R is NaN when absent).
std::map<int, std::pair<double, double>> StepLosses(const std::string& output) {
  std::map<int, std::pair<double, double>> losses;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    int step = 0;
    double loss = 0, rank_loss = std::nan("");
    if (std::sscanf(line.c_str(), "step %d loss %lf rank_loss %lf", &step, &loss,
                    &rank_loss) >= 2) {
      losses[step] = {loss, rank_loss};
    }
  }
  return losses;
}

// Two ranks x batch B against one process x batch 2B, on the same windows.
// - The ranks end bit-identical to each other: the same averaged gradients
//   and the same AdamW step on each.
// - The first step's averaged gradients equal the single process's within
//   1e-6 of the largest gradient: the two runs add the same per-token terms
//   in another order (two halves, then the halves), which float32 rounds
//   differently by a few ulps of the partial sums.
// - After 4 AdamW steps the weights agree within 2e-5, not 1e-6: AdamW
//   divides each update by sqrt(v), so a gradient that nearly cancels (whose
//   relative rounding error is large) moves its weight by a different
//   fraction of lr = 1e-2 in the two runs. 4 steps x lr x 5e-4 bounds what
//   rounding can do; a real mistake (a missed bucket, a wrong shard, a
//   missing division) is off by ~lr per step (checked by the untrained
//   comparison below: 1e-4 and more).
void ExpectTwoRanksMatchOneProcess(const std::string& extra) {
  testing::TempDir one, two;
  std::vector<RankRun> single = RunRanks(
      one.path(), 1,
      "--steps=4 --batch_size=4 --grads_out=" + one.path() + "/grads{rank}.bin " + extra);
  ASSERT_EQ(single[0].exit_code, 0) << single[0].output;
  // --bucket_bytes small enough for several buckets, so that some start
  // inside backward.
  std::vector<RankRun> ranks =
      RunRanks(two.path(), 2,
               "--steps=4 --batch_size=2 --bucket_bytes=16384 --grads_out=" + two.path() +
                   "/grads{rank}.bin " + extra);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
    EXPECT_THAT(ranks[r].output, HasSubstr("drift 0\n"));
    EXPECT_THAT(ranks[r].output, ::testing::Not(HasSubstr("started_in_backward 0 ")));
  }
  std::vector<float> g1 = Floats(one.path() + "/grads0.bin");
  std::vector<float> g2 = Floats(two.path() + "/grads0.bin");
  ASSERT_EQ(g1.size(), g2.size());
  const double grad_error = MaxAbsDiff(g1, g2) / MaxAbs(g1);
  std::vector<float> p1 = Floats(one.path() + "/params0.bin");
  std::vector<float> r0 = Floats(two.path() + "/params0.bin");
  std::vector<float> r1 = Floats(two.path() + "/params1.bin");
  ASSERT_FALSE(p1.empty());
  ASSERT_EQ(r0.size(), p1.size());
  EXPECT_EQ(ReadFile(two.path() + "/params0.bin"), ReadFile(two.path() + "/params1.bin"))
      << "the ranks' parameters differ: max |r0 - r1| = " << MaxAbsDiff(r0, r1);
  std::cout << "first step's gradients: max |2 ranks - 1 process| / max |g| = "
            << grad_error << "; weights after 4 steps: max |2 ranks - 1 process| = "
            << MaxAbsDiff(r0, p1) << std::endl;
  EXPECT_LE(grad_error, 1e-6);
  EXPECT_LE(MaxAbsDiff(r0, p1), 2e-5);
  // Every rank reports the global batch's loss, the same bit for bit on both,
  // the mean of their own losses, and the one process's within float32
  // summation order (step 1 runs both on the same weights; the later steps
  // on weights that differ by the rounding above).
  const auto one_losses = StepLosses(single[0].output);
  const auto rank0 = StepLosses(ranks[0].output);
  const auto rank1 = StepLosses(ranks[1].output);
  ASSERT_EQ(one_losses.size(), 4u);
  ASSERT_EQ(rank0.size(), 4u);
  ASSERT_EQ(rank1.size(), 4u);
  for (const auto& [step, one_loss] : one_losses) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    EXPECT_TRUE(std::isnan(one_loss.second));  // no rank_loss in one process
    const auto& [loss0, own0] = rank0.at(step);
    const auto& [loss1, own1] = rank1.at(step);
    EXPECT_EQ(loss0, loss1);
    EXPECT_NE(own0, own1);
    EXPECT_NEAR((own0 + own1) / 2, loss0, 1e-12 * loss0);
    EXPECT_NEAR(loss0, one_loss.first, 1e-6 * one_loss.first);
  }
  testing::TempDir none;
  std::vector<RankRun> untrained = RunRanks(none.path(), 1, "--steps=0 --batch_size=4");
  ASSERT_EQ(untrained[0].exit_code, 0) << untrained[0].output;
  EXPECT_GT(MaxAbsDiff(Floats(none.path() + "/params0.bin"), p1), 1e-4);
}

TEST(DataParallelTest, TwoRanksMatchOneProcessWithTheDoubleBatch) {
  ExpectTwoRanksMatchOneProcess("");
}

TEST(DataParallelTest, TwoRanksMatchWithAccumulationAndCheckpointing) {
  ExpectTwoRanksMatchOneProcess("--grad_accumulation_steps=2 --gradient_checkpointing");
}

// Each sharded level on 2 ranks against one process with the same global
// batch (4 windows a step), directly: per-step losses within 1e-6
// relative, the weights after 3 steps within 2e-5, as for plain data
// parallel above (the summation order differs: the ranks' halves are summed
// by the collective).
TEST(DataParallelTest, EveryShardedLevelMatchesOneProcessWithTheDoubleBatch) {
  testing::TempDir one;
  std::vector<RankRun> single = RunRanks(one.path(), 1, "--steps=3 --batch_size=4");
  ASSERT_EQ(single[0].exit_code, 0) << single[0].output;
  const auto one_losses = StepLosses(single[0].output);
  ASSERT_EQ(one_losses.size(), 3u);
  const std::vector<float> p1 = Floats(one.path() + "/params0.bin");
  ASSERT_FALSE(p1.empty());
  for (const char* level : {"optimizer", "gradients", "full"}) {
    SCOPED_TRACE(level);
    testing::TempDir two;
    std::vector<RankRun> ranks = RunRanks(
        two.path(), 2,
        absl::StrCat("--steps=3 --batch_size=2 --bucket_bytes=16384 --sharding=", level));
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ranks[r].exit_code, 0) << "rank " << r << ":\n" << ranks[r].output;
      const auto losses = StepLosses(ranks[r].output);
      ASSERT_EQ(losses.size(), one_losses.size()) << ranks[r].output;
      for (const auto& [step, loss] : one_losses) {
        EXPECT_NEAR(losses.at(step).first, loss.first, 1e-6 * loss.first)
            << "step " << step;
      }
    }
    const std::vector<float> r0 = Floats(two.path() + "/params0.bin");
    ASSERT_EQ(r0.size(), p1.size());
    EXPECT_EQ(ReadFile(two.path() + "/params0.bin"),
              ReadFile(two.path() + "/params1.bin"));
    std::cout << level
              << ", 2 ranks against one process: weights after 3 steps, max |diff| = "
              << MaxAbsDiff(r0, p1) << std::endl;
    EXPECT_LE(MaxAbsDiff(r0, p1), 2e-5);
  }
}

// The "optimizer_state_bytes B largest_parameter_numel N parameters P" line
// of a worker: the bytes of AdamW moments it holds, and of its model.
struct StateFigures {
  long long bytes = -1, largest = -1, parameters = -1;
};
StateFigures StateBytes(const std::string& output) {
  const size_t at = output.find("optimizer_state_bytes ");
  StateFigures f;
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at,
                "optimizer_state_bytes %lld largest_parameter_numel %lld parameters %lld",
                &f.bytes, &f.largest, &f.parameters);
  }
  return f;
}

// The final weights of `world` sharded ranks (in `sharded_dir`) against an
// unsharded rank's (in `plain_dir`): every sharded rank's equal to rank 0's
// bit for bit, and rank 0's within `tolerance` of the unsharded (0: bit for
// bit). Returns the largest difference.
double ExpectShardedWeights(const std::string& plain_dir, const std::string& sharded_dir,
                            int world, double tolerance) {
  const std::vector<float> p = Floats(plain_dir + "/params0.bin");
  const std::vector<float> s0 = Floats(sharded_dir + "/params0.bin");
  EXPECT_FALSE(p.empty());
  EXPECT_EQ(s0.size(), p.size());
  if (p.empty() || s0.size() != p.size()) return -1;
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(ReadFile(sharded_dir + "/params0.bin"),
              ReadFile(absl::StrCat(sharded_dir, "/params", r, ".bin")))
        << "rank " << r;
  }
  const double gap = MaxAbsDiff(s0, p);
  if (tolerance == 0) {
    EXPECT_EQ(ReadFile(sharded_dir + "/params0.bin"),
              ReadFile(plain_dir + "/params0.bin"))
        << "max |sharded - unsharded| = " << gap;
  } else {
    EXPECT_LE(gap, tolerance);
  }
  return gap;
}

// `world` ranks with optimizer sharding (`sharded`) against `world`
// unsharded ranks (`unsharded`) on the same data, seed and steps:
// - the per-step global losses are equal within 1e-6 relative;
// - the parameters are within `tolerance` (0: bit for bit). Without
//   clipping they are bit-identical: the sharded ranks average the same
//   gradients and run the same fused AdamW kernel on their pieces (its
//   arithmetic is element-wise, so which elements share a call does not
//   matter, and the pieces start at multiples of 16 elements, so the
//   kernel's vector body and scalar tail cover the same elements as in the
//   whole parameter: flat_shard.h), and the all-gather copies the pieces'
//   bits exactly. With
//   clipping the global norm is the root of the ranks' summed squares
//   rather than one norm over every gradient, a few float32 ulps apart, and
//   the clipped update moves a nearly cancelled gradient element by a
//   visibly different fraction of lr (why each test's tolerance, there);
// - each sharded rank's AdamW moments are at most 1/world of an unsharded
//   rank's plus an aligned chunk per parameter of each moment (the flat
//   pieces are ceil(n / world) elements rounded up to kFlatShardAlignment),
//   and the shards together are exactly the unsharded moments.
void ExpectShardedMatchesUnsharded(int world, const std::string& unsharded,
                                   const std::string& sharded, double tolerance) {
  testing::TempDir plain_dir, sharded_dir;
  std::vector<RankRun> plain = RunRanks(plain_dir.path(), world, unsharded);
  std::vector<RankRun> ranks = RunRanks(sharded_dir.path(), world, sharded);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(plain[r].exit_code, 0) << "unsharded rank " << r << ":\n"
                                     << plain[r].output;
    ASSERT_EQ(ranks[r].exit_code, 0) << "sharded rank " << r << ":\n" << ranks[r].output;
    EXPECT_THAT(ranks[r].output, HasSubstr("drift 0\n"));
  }
  const auto plain_losses = StepLosses(plain[0].output);
  ASSERT_EQ(plain_losses.size(), 3u);
  double loss_gap = 0;
  for (int r = 0; r < world; ++r) {
    const auto losses = StepLosses(ranks[r].output);
    ASSERT_EQ(losses.size(), plain_losses.size()) << ranks[r].output;
    for (const auto& [step, loss] : plain_losses) {
      const double sharded_loss = losses.at(step).first;
      EXPECT_NEAR(sharded_loss, loss.first, 1e-6 * loss.first) << "step " << step;
      loss_gap = std::max(loss_gap, std::fabs(sharded_loss - loss.first) / loss.first);
    }
  }
  const double param_gap =
      ExpectShardedWeights(plain_dir.path(), sharded_dir.path(), world, tolerance);

  const StateFigures full = StateBytes(plain[0].output);
  ASSERT_GT(full.bytes, 0) << plain[0].output;
  ASSERT_GT(full.parameters, 0) << plain[0].output;
  const long long rounding =
      full.parameters * 2 * kFlatShardAlignment * static_cast<long long>(sizeof(float));
  const long long bound = full.bytes / world + rounding;
  long long together = 0;
  std::string shards;
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(StateBytes(plain[r].output).bytes, full.bytes) << "unsharded rank " << r;
    const long long shard = StateBytes(ranks[r].output).bytes;
    EXPECT_GT(shard, 0) << "rank " << r;
    EXPECT_LE(shard, bound) << "rank " << r;
    together += shard;
    absl::StrAppend(&shards, r == 0 ? "" : ", ", shard);
  }
  EXPECT_EQ(together, full.bytes);
  std::cout << world << " ranks, AdamW moment bytes per rank: unsharded " << full.bytes
            << "; sharded " << shards << " (bound " << bound << " = 1/" << world
            << " + an aligned chunk of each moment per parameter, " << rounding
            << "); per-step losses: max |sharded - unsharded| / loss = " << loss_gap
            << "; parameters: max |sharded - unsharded| = " << param_gap << std::endl;
}

TEST(DataParallelTest, OptimizerShardingMatchesUnshardedWithHalfTheState) {
  ExpectShardedMatchesUnsharded(2, "--steps=3 --bucket_bytes=16384",
                                "--steps=3 --bucket_bytes=16384 --sharding=optimizer", 0);
}

// 4 ranks, each a quarter of the state; still bit for bit without clipping
// (the gradients are all-reduced whole as unsharded).
TEST(DataParallelTest, OptimizerShardingMatchesUnshardedOnFourRanks) {
  ExpectShardedMatchesUnsharded(4, "--steps=3 --bucket_bytes=16384",
                                "--steps=3 --bucket_bytes=16384 --sharding=optimizer", 0);
}

// 3 ranks: no parameter of the test model divides by 3, so every
// parameter is padded for the all-gather (through a buffer of N * c
// elements), and the last ranks' pieces are short or empty; still bit for
// bit.
TEST(DataParallelTest, OptimizerShardingPadsUnevenPiecesOnThreeRanks) {
  ExpectShardedMatchesUnsharded(3, "--steps=3 --bucket_bytes=16384",
                                "--steps=3 --bucket_bytes=16384 --sharding=optimizer", 0);
}

// With clipping (by the global norm, summed over the ranks' pieces), weight
// decay (both parameter groups), and the last step in a second run with a
// new DataParallel, as the daemon's next Train makes: each rank must go on
// with its own pieces of the state. 2e-5, as for gradient sharding with
// clipping below: the norm's rounding, amplified where AdamW divides by a
// nearly cancelled sqrt(v); a real mistake is off by ~lr = 1e-2.
TEST(DataParallelTest, OptimizerShardingClipsByTheGlobalNormAndGoesOnInANewRun) {
  const std::string options = "--max_grad_norm=0.05 --weight_decay=0.1 ";
  ExpectShardedMatchesUnsharded(
      2, options + "--steps=3",
      options + "--steps=2 --continue_steps=1 --sharding=optimizer", 2e-5);
}

// A run that trained unsharded and goes on sharded: each rank narrows the
// whole state it holds to its pieces, and the next step is bit for bit the
// unsharded one's.
TEST(DataParallelTest, OptimizerShardingTakesOverAnUnshardedRunsState) {
  testing::TempDir plain_dir, dir;
  std::vector<RankRun> plain =
      RunRanks(plain_dir.path(), 2, "--steps=1 --continue_steps=1");
  std::vector<RankRun> ranks = RunRanks(
      dir.path(), 2, "--steps=1 --continue_steps=1 --continue_sharding=optimizer");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(plain[r].exit_code, 0) << plain[r].output;
    ASSERT_EQ(ranks[r].exit_code, 0) << ranks[r].output;
  }
  EXPECT_EQ(ReadFile(dir.path() + "/params0.bin"), ReadFile(dir.path() + "/params1.bin"));
  EXPECT_EQ(ReadFile(dir.path() + "/params0.bin"),
            ReadFile(plain_dir.path() + "/params0.bin"));
  EXPECT_EQ(StateBytes(ranks[0].output).bytes + StateBytes(ranks[1].output).bytes,
            StateBytes(plain[0].output).bytes);
}

// The "gradient_bytes peak P at_update U largest_bucket B" line of a worker.
struct GradientBytes {
  long long peak = -1, at_update = -1, largest_bucket = -1;
};
GradientBytes GradientBytesOf(const std::string& output) {
  GradientBytes g;
  const size_t at = output.find("gradient_bytes ");
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at,
                "gradient_bytes peak %lld at_update %lld largest_bucket %lld", &g.peak,
                &g.at_update, &g.largest_bucket);
  }
  return g;
}

// `world` ranks with gradient sharding against `world` unsharded ranks on
// the same data, seed and steps (`common` options for both; an 8-layer test
// model, so that its 32 KB embedding is not most of the 330 KB of
// gradients, and 4 KB buckets, so that there are many):
// - the per-step global losses agree within 1e-6 relative;
// - the sharded ranks end bit-identical to each other (each parameter is
//   all-gathered from the ranks' pieces), and within `tolerance` of the
//   unsharded ranks (0: bit for bit; why each test's tolerance, at the test);
// - at the update each rank holds the gradients of its pieces only:
//   together exactly the unsharded rank's, each at most a share plus an
//   aligned chunk per parameter;
// - the peak of the gradient bytes a sharded rank held during the step
//   (GradientSync samples it inside backward too) is at most its share plus
//   the buckets in flight (kMaxBucketsInFlight), the one being flattened and
//   one being filled, each at most the largest bucket; and with 4 ranks it
//   is below one whole copy of the gradients.
void ExpectGradientShardingMatches(int world, const std::string& common,
                                   double tolerance) {
  const std::string options = "--steps=3 --num_layers=8 --bucket_bytes=4096 " + common;
  testing::TempDir plain_dir, sharded_dir;
  std::vector<RankRun> plain = RunRanks(plain_dir.path(), world, options);
  std::vector<RankRun> ranks =
      RunRanks(sharded_dir.path(), world, options + " --sharding=gradients");
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(plain[r].exit_code, 0) << "unsharded rank " << r << ":\n"
                                     << plain[r].output;
    ASSERT_EQ(ranks[r].exit_code, 0) << "sharded rank " << r << ":\n" << ranks[r].output;
    EXPECT_THAT(ranks[r].output, HasSubstr("drift 0\n"));
    EXPECT_THAT(ranks[r].output, ::testing::Not(HasSubstr("started_in_backward 0 ")));
  }
  const auto plain_losses = StepLosses(plain[0].output);
  ASSERT_EQ(plain_losses.size(), 3u);
  double loss_gap = 0;
  for (int r = 0; r < world; ++r) {
    const auto losses = StepLosses(ranks[r].output);
    ASSERT_EQ(losses.size(), plain_losses.size()) << ranks[r].output;
    for (const auto& [step, loss] : plain_losses) {
      const double sharded_loss = losses.at(step).first;
      EXPECT_NEAR(sharded_loss, loss.first, 1e-6 * loss.first) << "step " << step;
      loss_gap = std::max(loss_gap, std::fabs(sharded_loss - loss.first) / loss.first);
    }
  }
  const double param_gap =
      ExpectShardedWeights(plain_dir.path(), sharded_dir.path(), world, tolerance);

  const GradientBytes full = GradientBytesOf(plain[0].output);
  const StateFigures state = StateBytes(plain[0].output);
  ASSERT_GT(full.at_update, 0) << plain[0].output;
  const long long rounding =
      state.parameters * kFlatShardAlignment * static_cast<long long>(sizeof(float));
  long long together = 0;
  std::string figures;
  for (int r = 0; r < world; ++r) {
    const GradientBytes g = GradientBytesOf(ranks[r].output);
    ASSERT_GT(g.at_update, 0) << ranks[r].output;
    together += g.at_update;
    EXPECT_LE(g.at_update, full.at_update / world + rounding) << "rank " << r;
    const long long slack = (GradientSync::kMaxBucketsInFlight + 2) * g.largest_bucket;
    EXPECT_LE(g.peak, g.at_update + slack) << "rank " << r;
    if (world >= 4) {
      EXPECT_LT(g.peak, full.at_update) << "rank " << r;
    }
    absl::StrAppend(&figures, r == 0 ? "" : ", ", g.peak, " (share ", g.at_update,
                    " + slack bound ", slack, ")");
  }
  EXPECT_EQ(together, full.at_update);
  std::cout << world << " ranks, gradient sharding: gradient bytes per rank, peak: "
            << "unsharded " << full.peak << " (whole gradients " << full.at_update
            << "); sharded " << figures
            << "; per-step losses: max |sharded - unsharded| / loss = " << loss_gap
            << "; parameters after 3 steps: max |sharded - unsharded| = " << param_gap
            << std::endl;
}

// 2 ranks, one micro-batch, no clipping: bit for bit. The reduce-scatter
// adds the same two terms as the all-reduce (a + b == b + a in IEEE), the
// division and the fused AdamW are elementwise and the same, and without
// clipping the differently rounded global norm is only reported.
TEST(DataParallelTest, GradientShardingMatchesUnshardedBitForBitOnTwoRanks) {
  ExpectGradientShardingMatches(2, "", 0);
}

// 4 ranks with clipping (a small max_grad_norm, so that every step clips)
// and weight decay: the reduce-scatter adds the 4 ranks' terms in another order than
// the ring all-reduce, and the global norm is sqrt of a sum of the ranks'
// squares rather than one norm over every gradient, both a few float32 ulps
// apart. AdamW divides each update by sqrt(v), so a nearly cancelled
// gradient element moves its weight by a visibly different fraction of
// lr = 1e-2: 2e-5 after 3 steps, as for 2 ranks against one process above;
// a real mistake (a lost bucket, a misplaced piece, a missing division or
// norm term) is off by ~lr.
TEST(DataParallelTest, GradientShardingClipsByTheGlobalNormOnFourRanks) {
  ExpectGradientShardingMatches(4, "--max_grad_norm=0.05 --weight_decay=0.1", 2e-5);
}

// Gradient accumulation (and checkpointing): each micro-batch's backward is
// reduce-scattered to the pieces, whose sums add up; unsharded adds the micro-batches
// locally and all-reduces once. The same terms in another order: 2e-5 as
// above.
// 3 ranks: every bucket's rows carry padded pieces (the reduce-scatter
// moves zeros in the padding). The terms are added in another order than
// the all-reduce's, so 2e-5 as above.
TEST(DataParallelTest, GradientShardingPadsUnevenPiecesOnThreeRanks) {
  ExpectGradientShardingMatches(3, "", 2e-5);
}

TEST(DataParallelTest, GradientShardingReducesEveryMicroBatch) {
  ExpectGradientShardingMatches(2, "--grad_accumulation_steps=2 --gradient_checkpointing",
                                2e-5);
}

// What a fully sharded rank printed of its parameters: its shards' bytes,
// the most bytes of whole parameters it held at once in the last step, and
// that step's all-gathers; -1s when absent.
struct ParameterBytes {
  long long owned = -1, peak_gathered = -1, gathers = -1, prefetched = -1;
};
ParameterBytes ParameterBytesOf(const std::string& output) {
  ParameterBytes b;
  const size_t at = output.find("parameter_bytes ");
  if (at != std::string::npos) {
    std::sscanf(
        output.c_str() + at,
        "parameter_bytes owned %lld peak_gathered %lld gathers %lld prefetched %lld",
        &b.owned, &b.peak_gathered, &b.gathers, &b.prefetched);
  }
  return b;
}

// The offloader's totals a rank printed: bytes copied out, saved tensors
// kept because they are parameters.
std::pair<long long, long long> OffloadOf(const std::string& output) {
  long long out = -1, parameter_skips = -1;
  const size_t at = output.find("offload bytes_out ");
  if (at != std::string::npos) {
    std::sscanf(output.c_str() + at, "offload bytes_out %lld parameter_skips %lld", &out,
                &parameter_skips);
  }
  return {out, parameter_skips};
}

// `world` ranks with full sharding against `world` ranks with gradient
// sharding (same data, seed, steps; `common` for both; 8 layers of the test
// model, whose embedding is tied to the head):
// - bit for bit: the losses, and every rank's parameters after 3 steps. Full
//   sharding changes where each parameter lives between its uses, not one
//   value or one sum: the forward and backward read the pieces' values
//   (all-gathered, exact), the gradients go through the same buckets to the
//   same pieces, which get the same update;
// - the shard bytes the ranks keep add up to the whole model's plus their
//   padding, each a share plus at most an aligned chunk per parameter; and
//   what a rank held gathered at
//   once is at most three units (the unit running, the next one's all-gathers in flight,
//   and the head between its forward and its backward), so that with its shards it stays
//   below the whole model: it never held the whole model in the step.
void ExpectFullShardingMatchesGradientSharding(int world, const std::string& common,
                                               int micro_batches = 1) {
  const std::string options = "--steps=3 --num_layers=8 --bucket_bytes=4096 " + common;
  testing::TempDir grads_dir, full_dir;
  std::vector<RankRun> grads =
      RunRanks(grads_dir.path(), world, options + " --sharding=gradients");
  std::vector<RankRun> full =
      RunRanks(full_dir.path(), world, options + " --sharding=full");
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(grads[r].exit_code, 0) << "gradient-sharded rank " << r << ":\n"
                                     << grads[r].output;
    ASSERT_EQ(full[r].exit_code, 0) << "fully sharded rank " << r << ":\n"
                                    << full[r].output;
  }
  for (int r = 0; r < world; ++r) {
    const auto want = StepLosses(grads[r].output);  // with each rank's own loss
    ASSERT_EQ(want.size(), 3u);
    EXPECT_EQ(StepLosses(full[r].output), want) << "rank " << r;
    EXPECT_EQ(ReadFile(absl::StrCat(full_dir.path(), "/params", r, ".bin")),
              ReadFile(grads_dir.path() + "/params0.bin"))
        << "rank " << r << ": max |full - gradients| = "
        << MaxAbsDiff(Floats(absl::StrCat(full_dir.path(), "/params", r, ".bin")),
                      Floats(grads_dir.path() + "/params0.bin"));
  }
  const long long model_bytes = static_cast<long long>(
      Floats(grads_dir.path() + "/params0.bin").size() * sizeof(float));
  const long long rounding =
      StateBytes(grads[0].output).parameters * kFlatShardAlignment * sizeof(float);
  long long owned = 0;
  std::string figures;
  for (int r = 0; r < world; ++r) {
    const ParameterBytes b = ParameterBytesOf(full[r].output);
    ASSERT_GE(b.owned, 0) << full[r].output;
    owned += b.owned;
    EXPECT_LE(b.owned, model_bytes / world + rounding) << "rank " << r;
    EXPECT_GT(b.peak_gathered, 0) << "rank " << r;
    EXPECT_LT(b.owned + b.peak_gathered, model_bytes) << "rank " << r;
    long long largest_unit = -1;
    const size_t at = full[r].output.find("largest_unit_bytes ");
    ASSERT_NE(at, std::string::npos) << full[r].output;
    std::sscanf(full[r].output.c_str() + at, "largest_unit_bytes %lld", &largest_unit);
    EXPECT_LE(b.peak_gathered, 3 * largest_unit) << "rank " << r;
    // One all-gather per unit's flat buffer, before its forward and again
    // before its backward, for each micro-batch: at most 2 x (8 layers +
    // embedding + head), the embedding's again for the tied head and none
    // for its backward.
    EXPECT_GT(b.gathers, 0) << "rank " << r;
    EXPECT_LE(b.gathers, 2 * (8 + 2) * micro_batches) << "rank " << r;
    // The next unit's all-gathers start while a unit computes.
    EXPECT_GT(b.prefetched, 0) << "rank " << r;
    EXPECT_LT(b.prefetched, b.gathers) << "rank " << r;
    absl::StrAppend(&figures, r == 0 ? "" : ", ", b.owned, " + ", b.peak_gathered, " (",
                    b.gathers, " all-gathers)");
  }
  // The shards hold every element once, plus their padding: none where
  // the sizes divide by the world, at most a piece per parameter otherwise.
  EXPECT_GE(owned, model_bytes);
  EXPECT_LE(owned, model_bytes + world * rounding);
  std::cout << world << " ranks, full sharding: parameter bytes per rank, shards + most "
            << "gathered at once (all-gathers in the last step): " << figures << " of "
            << model_bytes
            << " (the whole model); losses and parameters bit for bit as gradient "
               "sharding's"
            << std::endl;
}

TEST(DataParallelTest, FullShardingMatchesGradientShardingOnTwoRanks) {
  ExpectFullShardingMatchesGradientSharding(2, "");
}

// With clipping and weight decay at 4 ranks; and with accumulation and
// checkpointing (the recomputation of a checkpointed layer finds its
// parameters gathered again by the hook on its output).
TEST(DataParallelTest, FullShardingMatchesGradientShardingOnFourRanksWithClipping) {
  ExpectFullShardingMatchesGradientSharding(4, "--max_grad_norm=0.05 --weight_decay=0.1");
}

// 3 ranks: padded shards, all-gathered into storages of 3 * c elements.
TEST(DataParallelTest, FullShardingMatchesGradientShardingOnThreeRanks) {
  ExpectFullShardingMatchesGradientSharding(3, "");
}

TEST(DataParallelTest, FullShardingMatchesWithAccumulationAndCheckpointing) {
  ExpectFullShardingMatchesGradientSharding(
      2, "--grad_accumulation_steps=2 --gradient_checkpointing", /*micro_batches=*/2);
}

// A fully sharded run's last step in a second run, with a new DataParallel
// (new shards copied from the model made whole at the first run's end, the
// optimizer's targets moved to them): bit for bit the uninterrupted run.
TEST(DataParallelTest, FullShardingGoesOnInANewRunBitForBit) {
  testing::TempDir whole_dir, split_dir;
  std::vector<RankRun> whole = RunRanks(whole_dir.path(), 2, "--steps=3 --sharding=full");
  std::vector<RankRun> split =
      RunRanks(split_dir.path(), 2, "--steps=2 --continue_steps=1 --sharding=full");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(whole[r].exit_code, 0) << whole[r].output;
    ASSERT_EQ(split[r].exit_code, 0) << split[r].output;
    EXPECT_EQ(ReadFile(absl::StrCat(split_dir.path(), "/params", r, ".bin")),
              ReadFile(absl::StrCat(whole_dir.path(), "/params", r, ".bin")))
        << "rank " << r;
  }
}

// The evaluations a rank printed ("eval step S loss L peak_gathered G"):
// step -> (the loss as printed, G).
std::map<int, std::pair<std::string, long long>> Evaluations(const std::string& output) {
  std::map<int, std::pair<std::string, long long>> evals;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    int step = 0;
    char loss[64] = {0};
    long long peak = -1;
    if (std::sscanf(line.c_str(), "eval step %d loss %63s peak_gathered %lld", &step,
                    loss, &peak) == 3) {
      evals[step] = {loss, peak};
    }
  }
  return evals;
}

// An evaluation inside a fully sharded run (eval_every_steps) gathers the
// model unit by unit, as forward does, instead of whole:
// - its losses equal gradient sharding's bit for bit (the same arithmetic on
//   the same values), on every rank;
// - what it held gathered at once is at most two units (the one running and
//   the next one's all-gathers in flight), padded: well below the whole
//   model;
// - it leaves the step's figures alone: the last step's gathers and peak
//   equal those of the same run without evaluations, and so do its weights.
TEST(DataParallelTest, FullShardingEvaluatesUnitByUnit) {
  const std::string options = "--steps=3 --num_layers=8 --bucket_bytes=4096 ";
  testing::TempDir grads_dir, full_dir, plain_dir;
  std::vector<RankRun> grads = RunRanks(
      grads_dir.path(), 2, options + "--eval_every_steps=1 --sharding=gradients");
  std::vector<RankRun> full =
      RunRanks(full_dir.path(), 2, options + "--eval_every_steps=1 --sharding=full");
  std::vector<RankRun> plain = RunRanks(plain_dir.path(), 2, options + "--sharding=full");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(grads[r].exit_code, 0) << grads[r].output;
    ASSERT_EQ(full[r].exit_code, 0) << full[r].output;
    ASSERT_EQ(plain[r].exit_code, 0) << plain[r].output;
  }
  const long long model_bytes = static_cast<long long>(
      Floats(grads_dir.path() + "/params0.bin").size() * sizeof(float));
  const long long rounding =
      2 * StateBytes(grads[0].output).parameters * kFlatShardAlignment * sizeof(float);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const auto want = Evaluations(grads[r].output);
    const auto got = Evaluations(full[r].output);
    ASSERT_EQ(want.size(), 3u) << grads[r].output;
    ASSERT_EQ(got.size(), 3u) << full[r].output;
    long long largest_unit = -1;
    const size_t at = full[r].output.find("largest_unit_bytes ");
    ASSERT_NE(at, std::string::npos) << full[r].output;
    std::sscanf(full[r].output.c_str() + at, "largest_unit_bytes %lld", &largest_unit);
    for (const auto& [step, eval] : got) {
      EXPECT_EQ(eval.first, want.at(step).first) << "the loss at step " << step;
      EXPECT_EQ(want.at(step).second, 0) << "gradient sharding gathers nothing";
      EXPECT_GT(eval.second, 0) << "step " << step;
      EXPECT_LE(eval.second, 2 * largest_unit + rounding) << "step " << step;
      EXPECT_LT(eval.second, model_bytes / 2) << "step " << step;
    }
    const ParameterBytes with = ParameterBytesOf(full[r].output);
    const ParameterBytes without = ParameterBytesOf(plain[r].output);
    EXPECT_EQ(with.peak_gathered, without.peak_gathered);
    EXPECT_EQ(with.gathers, without.gathers);
    EXPECT_EQ(ReadFile(absl::StrCat(full_dir.path(), "/params", r, ".bin")),
              ReadFile(absl::StrCat(plain_dir.path(), "/params", r, ".bin")));
    if (r == 0) {
      std::cout << "2 ranks, full sharding: an evaluation held at most "
                << got.begin()->second.second << " bytes of gathered parameters (largest "
                << "unit " << largest_unit << ", whole model " << model_bytes << ")"
                << std::endl;
    }
  }
}

// Full sharding with the offloader on: the gathered parameters that autograd
// saves are the parameters' own storages (refilled in place), so the
// offloader keeps them as parameters and never copies them: the same bytes
// leave as with gradient sharding, where every parameter is whole, and the
// same saved tensors are kept as parameters; the weights equal the same
// fully sharded run without offloading bit for bit.
TEST(DataParallelTest, FullShardingOffloadsNoParameterBytes) {
  testing::TempDir spill, grads_dir, full_dir, plain_dir;
  const std::string options =
      "--steps=2 --num_layers=4 --bucket_bytes=4096 --gradient_checkpointing=false ";
  const std::string offload = " --offload=disk --spill_dir=" + spill.path();
  std::vector<RankRun> grads =
      RunRanks(grads_dir.path(), 2, options + "--sharding=gradients" + offload);
  std::vector<RankRun> full =
      RunRanks(full_dir.path(), 2, options + "--sharding=full" + offload);
  std::vector<RankRun> plain = RunRanks(plain_dir.path(), 2, options + "--sharding=full");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(grads[r].exit_code, 0) << grads[r].output;
    ASSERT_EQ(full[r].exit_code, 0) << full[r].output;
    ASSERT_EQ(plain[r].exit_code, 0) << plain[r].output;
    const auto [grads_out, grads_kept] = OffloadOf(grads[r].output);
    const auto [full_out, full_kept] = OffloadOf(full[r].output);
    EXPECT_GT(full_out, 0) << "rank " << r << " offloaded nothing";
    EXPECT_EQ(full_out, grads_out) << "rank " << r;
    EXPECT_GT(full_kept, 0) << "rank " << r;
    EXPECT_EQ(full_kept, grads_kept) << "rank " << r;
    EXPECT_EQ(ReadFile(absl::StrCat(full_dir.path(), "/params", r, ".bin")),
              ReadFile(absl::StrCat(plain_dir.path(), "/params", r, ".bin")))
        << "rank " << r;
  }
}

TEST(DataParallelTest, RanksStartFromRankZerosParameters) {
  // The workers draw their init with seed 7 + rank; after one step of
  // training the two ranks still agree, so rank 1 took rank 0's weights.
  testing::TempDir dir;
  std::vector<RankRun> ranks = RunRanks(dir.path(), 2, "--steps=0");
  ASSERT_EQ(ranks[0].exit_code, 0) << ranks[0].output;
  ASSERT_EQ(ranks[1].exit_code, 0) << ranks[1].output;
  EXPECT_EQ(ReadFile(dir.path() + "/params0.bin"), ReadFile(dir.path() + "/params1.bin"));
}

TEST(DataParallelTest, AnotherModelOnOneRankIsRefusedNamingIt) {
  testing::TempDir dir;
  const std::string worker = absl::StrCat(MEMPROFD_BINARY_DIR, "/tests/dist/dist_worker");
  const int port = FreePort();
  std::string output;
  testing::RunCommand(
      absl::StrCat("(RANK=0 WORLD_SIZE=2 MASTER_PORT=", port, " ", worker,
                   " --steps=1 --out=", dir.path(), "/a > ", dir.path(),
                   "/r0.log 2>&1) & (RANK=1 WORLD_SIZE=2 MASTER_PORT=", port, " ", worker,
                   " --steps=1 --hidden_size=64 --out=", dir.path(), "/b > ", dir.path(),
                   "/r1.log 2>&1) & wait"),
      &output);
  for (const char* log : {"/r0.log", "/r1.log"}) {
    const std::string text = ReadFile(dir.path() + log);
    EXPECT_THAT(text, HasSubstr("FAILED FAILED_PRECONDITION: rank 1 holds another model"))
        << log << ":\n"
        << text;
  }
}

// Rank 1 dies at the start of step 3: rank 0 fails in that step's first
// collective that needs rank 1, within the timeout, without reporting the
// step. Unsharded that is the gradient all-reduce; fully sharded, the
// all-gather of a parameter (or a gradient bucket's reduce-scatter).
void ExpectKilledRankFailsTheSurvivor(const std::string& sharding,
                                      const std::string& collective) {
  testing::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankRun> ranks =
      RunRanks(dir.path(), 2,
               "--steps=6 --die_at_step=3 --die_rank=1 --timeout_seconds=10 --sharding=" +
                   sharding);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ranks[1].exit_code, 3) << ranks[1].output;
  EXPECT_EQ(ranks[0].exit_code, 2) << ranks[0].output;
  EXPECT_THAT(ranks[0].output, HasSubstr("step 2 loss"));
  EXPECT_THAT(ranks[0].output, ::testing::Not(HasSubstr("step 3 loss")));
  // UNAVAILABLE (the peer's connection closed) or DEADLINE_EXCEEDED (no
  // answer within the timeout), naming the collective and this rank.
  EXPECT_THAT(ranks[0].output,
              ::testing::ContainsRegex(
                  "FAILED (UNAVAILABLE|DEADLINE_EXCEEDED): rank 0: " + collective));
  // Within the 10 s timeout and the start-up of two processes.
  EXPECT_LT(seconds, 40) << ranks[0].output;
}

TEST(DataParallelTest, KilledRankFailsTheSurvivorWithinTheTimeout) {
  ExpectKilledRankFailsTheSurvivor("none", "all-reduce");
}

TEST(DataParallelTest, KilledRankFailsAFullyShardedSurvivorWithinTheTimeout) {
  ExpectKilledRankFailsTheSurvivor("full", "(all-gather|reduce-scatter)");
}

}  // namespace
}  // namespace memprofd
