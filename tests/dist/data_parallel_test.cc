// Data parallel across real processes: dist_worker started once per rank with
// torchrun's variables, over Gloo on loopback, one thread each.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

TEST(DataParallelTest, KilledRankFailsTheSurvivorWithinTheTimeout) {
  testing::TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankRun> ranks = RunRanks(
      dir.path(), 2, "--steps=6 --die_at_step=3 --die_rank=1 --timeout_seconds=10");
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
                  "FAILED (UNAVAILABLE|DEADLINE_EXCEEDED): rank 0: all-reduce"));
  // Within the 10 s timeout and the start-up of two processes.
  EXPECT_LT(seconds, 40) << ranks[0].output;
}

}  // namespace
}  // namespace memprofd
