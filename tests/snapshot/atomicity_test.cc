// A snapshot is either fully published or not visible at all: cancellation,
// a write failure midway (RLIMIT_FSIZE) and SIGKILL at random points leave no
// partial snapshot and never touch earlier ones.
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

constexpr char kChildEnv[] = "MEMPROFD_SNAPSHOT_KILL_CHILD_ROOT";

TensorList KillModel() { return testing::MakeModel(7, 2, 256, 512); }

SnapshotOptions KillOptions() {
  SnapshotOptions o;
  o.staging_bytes = 64 << 10;
  o.max_shard_size = 1'000'000;
  return o;
}

// The child of KilledAtRandomPointsNeverPublishesAPartialSnapshot: this
// binary re-executed with kChildEnv set writes snapshots until killed.
[[maybe_unused]] const bool kIsKillChild = [] {
  const char* root = std::getenv(kChildEnv);
  if (root == nullptr) return false;
  const TensorList model = KillModel();
  const SnapshotWriter writer(root);
  for (int i = 0;; ++i) {
    auto m =
        writer.Write(absl::StrCat("p", ::getpid(), "-", i), model, "{}", KillOptions());
    if (!m.ok()) _exit(3);
  }
}();

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

TEST(KillTest, KilledAtRandomPointsNeverPublishesAPartialSnapshot) {
  TempDir root;
  const TensorList model = KillModel();
  std::mt19937 rng(12345);
  int children = 0;
  // Read only by the re-executed child's static initializer.
  ::setenv(kChildEnv, root.path().c_str(), 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  // On a loaded machine startup can take longer than the first delays; until
  // a snapshot has been published, each kill waits longer (up to 4 s), so
  // that some children get past startup into their writes.
  int base_ms = 300;
  auto any_published = [&] {
    for (const std::string& name : testing::ListDir(root.path())) {
      if (!absl::StartsWith(name, kTempPrefix)) return true;
    }
    return false;
  };
  while (std::chrono::steady_clock::now() < deadline && children < 25) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::execl("/proc/self/exe", "snapshot_test", "--gtest_filter=None", nullptr);
      _exit(4);
    }
    ++children;
    // Startup takes a few hundred ms; kill somewhere in the writes after it.
    std::this_thread::sleep_for(std::chrono::milliseconds(base_ms + rng() % 500));
    ::kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
    if (!any_published()) base_ms = std::min(2 * base_ms, 4000);
  }
  ::unsetenv(kChildEnv);
  int published = 0, leftovers = 0;
  for (const std::string& name : testing::ListDir(root.path())) {
    if (absl::StartsWith(name, kTempPrefix)) {
      ++leftovers;
      continue;
    }
    ++published;
    ExpectMatches(root.Join(name), model);
    EXPECT_TRUE(DescribeSnapshot(root.path(), name).ok()) << name;
  }
  EXPECT_GT(published, 0);
  auto cleaned = CleanLeftovers(root.path());
  ASSERT_TRUE(cleaned.ok());
  EXPECT_EQ(*cleaned, leftovers);
  for (const std::string& name : testing::ListDir(root.path())) {
    EXPECT_FALSE(absl::StartsWith(name, ".")) << name;
  }
  std::cout << children << " children killed, " << published << " snapshots published, "
            << leftovers << " killed mid-write\n";
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
