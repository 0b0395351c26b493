#include "core/common/threads.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/threads.h"

namespace memprofd {
namespace {

using ::memprofd::testing::ThisThreadName;

TEST(ThreadsTest, LoweringStopsAtNineteen) {
  int nice = -1;
  std::thread([&] {
    ASSERT_TRUE(LowerThisThreadPriority(kMaxNice).ok());
    ASSERT_TRUE(LowerThisThreadPriority(5).ok());
    nice = ThisThreadNice();
  }).join();
  EXPECT_EQ(nice, kMaxNice);
}

TEST(ThreadsTest, NiceHoldsForTheThreadAndWhatItStartsOnly) {
  const int before = ThisThreadNice();
  int set = -1, child = -1;
  std::thread t([&] {
    ASSERT_TRUE(LowerThisThreadPriority(3).ok());
    set = ThisThreadNice();
    std::thread([&] { child = ThisThreadNice(); }).join();
  });
  t.join();
  EXPECT_EQ(set, std::min(kMaxNice, before + 3));
  EXPECT_EQ(child, set);
  EXPECT_EQ(ThisThreadNice(), before);
}

TEST(ThreadsTest, ParallelRegionsOfANicedThreadRunAtItsNice) {
  // The owner thread relies on this: libgomp starts a pool per thread that
  // starts parallel regions, from that thread, so the workers inherit.
  const int before = ThisThreadNice();
  absl::Mutex mu;
  std::set<pid_t> tids;
  std::vector<std::pair<int, std::string>> seen;  // nice, name
  std::thread t([&] {
    ASSERT_TRUE(LowerThisThreadPriority(5).ok());
    NameThisThread("mpd-test-owner");
    at::parallel_for(0, 64, 1, [&](int64_t, int64_t) {
      absl::MutexLock lock(&mu);
      tids.insert(gettid());
      seen.emplace_back(ThisThreadNice(), ThisThreadName());
    });
  });
  t.join();
  ASSERT_FALSE(seen.empty());
  for (const auto& [nice, name] : seen) {
    EXPECT_EQ(nice, std::min(kMaxNice, before + 5));
    EXPECT_EQ(name, "mpd-test-owner");
  }
#ifdef _OPENMP
  if (at::get_num_threads() > 1) {
    EXPECT_GT(tids.size(), 1u) << "the region ran on one thread: inheritance untested";
  }
#endif
}

TEST(ThreadsTest, RefusesValuesOutsideZeroToNineteen) {
  for (int bad : {-1, -20, kMaxNice + 1}) {
    absl::Status s = LowerThisThreadPriority(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("0..19"), std::string::npos) << s.message();
  }
}

TEST(ThreadsTest, NamesAreCutAtFifteenBytes) {
  std::string name;
  std::thread([&] {
    NameThisThread("mpd-a-name-longer-than-fifteen");
    name = ThisThreadName();
  }).join();
  EXPECT_EQ(name, "mpd-a-name-long");
}

}  // namespace
}  // namespace memprofd
