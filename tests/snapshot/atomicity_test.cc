// A snapshot is either fully published or not visible at all: cancellation,
// a write failure midway (RLIMIT_FSIZE) and SIGKILL at random points leave no
// partial snapshot and never touch earlier ones.
#include <ATen/Parallel.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;
using ::testing::HasSubstr;

// Small, so that one snapshot takes milliseconds, in several shards and
// many staging-buffer fills, so that a kill lands anywhere in a write.
TensorList KillModel() { return testing::MakeModel(7, 2, 128, 256); }

SnapshotOptions KillOptions() {
  SnapshotOptions o;
  o.staging_bytes = 16 << 10;
  o.max_shard_size = 200'000;
  return o;
}

// The child of KilledAtRandomPointsNeverPublishesAPartialSnapshot: forked,
// not re-executed, so that a kill costs a fork rather than LibTorch's start;
// writes snapshots until killed.
[[noreturn]] void WriteUntilKilled(const std::string& root, const TensorList& model) {
  // libgomp's worker threads do not survive fork: keep ATen's ops inline.
  at::set_num_threads(1);
  const SnapshotWriter writer(root);
  for (int i = 0;; ++i) {
    auto m =
        writer.Write(absl::StrCat("p", ::getpid(), "-", i), model, "{}", KillOptions());
    if (!m.ok()) _exit(3);
  }
}

void ExpectMatches(const std::string& dir, const TensorList& model) {
  auto loaded = LoadSafetensorsDirectory(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), model.size()) << dir;
  std::map<std::string, at::Tensor> by_name(loaded->tensors.begin(),
                                            loaded->tensors.end());
  for (const auto& [name, t] : model) {
    ASSERT_EQ(by_name.count(name), 1u) << dir << " " << name;
    EXPECT_TRUE(testing::BitEqual(t, by_name.at(name))) << dir << " " << name;
  }
}

class AtomicityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(SnapshotWriter(root_.path()).Write("earlier", model_, "{}", {}).ok());
  }
  void ExpectOnlyEarlier() {
    EXPECT_EQ(testing::ListDir(root_.path()), std::vector<std::string>{"earlier"});
    ExpectMatches(root_.Join("earlier"), model_);
  }
  TempDir root_;
  TensorList model_ = testing::MakeModel(1, 2, 64, 128);
};

TEST_F(AtomicityTest, CancelledMidwayLeavesNothingVisible) {
  SnapshotOptions o;
  o.staging_bytes = 4096;
  o.max_shard_size = 40000;
  int polls = 0;
  int64_t seen = 0;
  auto m = SnapshotWriter(root_.path())
               .Write(
                   "x", model_, "{}", o, [&](int64_t done, int64_t) { seen = done; },
                   [&] { return ++polls > 20; });
  EXPECT_EQ(m.status().code(), absl::StatusCode::kCancelled) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("nothing was published"));
  EXPECT_GT(seen, 40000);  // it was past its first shard
  ExpectOnlyEarlier();
}

TEST_F(AtomicityTest, WriteFailureMidwayIsResourceExhaustedAndCleanedUp) {
  // RLIMIT_FSIZE with SIGXFSZ ignored makes write() fail with EFBIG past the
  // limit, as a full disk fails with ENOSPC.
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  struct rlimit small = old;
  small.rlim_cur = 50000;
  struct sigaction ignore {
  }, old_action{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGXFSZ, &ignore, &old_action), 0);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  auto m = SnapshotWriter(root_.path()).Write("x", model_, "{}", {});
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::sigaction(SIGXFSZ, &old_action, nullptr);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted) << m.status();
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("model.safetensors"));
  ExpectOnlyEarlier();
  // The writer still works afterwards.
  EXPECT_TRUE(SnapshotWriter(root_.path()).Write("y", model_, "{}", {}).ok());
}

// The bar: SIGKILL during at least 100 snapshots. Each child is
// killed after a random delay spread over about two snapshot writes, so the
// kills land in every stage of a write (shards, staging fills, the index,
// the rename) and a few between writes; a child killed mid-write leaves its
// temporary directory, which is how those kills are counted.
TEST(KillTest, KilledAtRandomPointsNeverPublishesAPartialSnapshot) {
  constexpr int kKillsMidWrite = 100;
  TempDir root;
  const TensorList model = KillModel();
  const auto before = std::chrono::steady_clock::now();
  ASSERT_TRUE(
      SnapshotWriter(root.path()).Write("earlier", model, "{}", KillOptions()).ok());
  const int64_t write_us =
      std::max<int64_t>(1000, std::chrono::duration_cast<std::chrono::microseconds>(
                                  std::chrono::steady_clock::now() - before)
                                  .count());
  auto count_mid_write = [&] {
    int n = 0;
    for (const std::string& name : testing::ListDir(root.path())) {
      n += absl::StartsWith(name, kTempPrefix) ? 1 : 0;
    }
    return n;
  };
  std::mt19937 rng(12345);
  int children = 0, mid_write = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (std::chrono::steady_clock::now() < deadline && mid_write < kKillsMidWrite) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) WriteUntilKilled(root.path(), model);
    ++children;
    std::this_thread::sleep_for(
        std::chrono::microseconds(rng() % static_cast<uint64_t>(2 * write_us)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    mid_write = count_mid_write();
  }
  int published = 0;
  for (const std::string& name : testing::ListDir(root.path())) {
    if (absl::StartsWith(name, kTempPrefix)) continue;
    ++published;
    ExpectMatches(root.Join(name), model);
    EXPECT_TRUE(DescribeSnapshot(root.path(), name).ok()) << name;
  }
  std::cout << children << " children killed, " << published
            << " snapshots published (the earlier one included), " << mid_write
            << " killed mid-write; one write " << write_us / 1000.0 << " ms\n";
  EXPECT_GE(mid_write, kKillsMidWrite);
  EXPECT_GT(published, 1);
  auto cleaned = CleanLeftovers(root.path());
  ASSERT_TRUE(cleaned.ok());
  EXPECT_EQ(*cleaned, mid_write);
  for (const std::string& name : testing::ListDir(root.path())) {
    EXPECT_FALSE(absl::StartsWith(name, ".")) << name;
  }
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
