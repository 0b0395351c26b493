#include "server/work_queue.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/testing/threads.h"

namespace memprofd {
namespace {

using ::memprofd::testing::ThisThreadName;

TEST(WorkQueueTest, RunsJobsInOrderOnItsOwnNamedThread) {
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::string name;
  {
    WorkQueue queue("mpd-test-queue");
    for (int i = 0; i < 5; ++i) {
      queue.Post([&, i] {
        order.push_back(i);
        threads.push_back(std::this_thread::get_id());
        name = ThisThreadName();
      });
    }
  }  // joins after running what was queued
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (const auto& id : threads) {
    EXPECT_NE(id, std::this_thread::get_id());
    EXPECT_EQ(id, threads.front());
  }
  EXPECT_EQ(name, "mpd-test-queue");
}

TEST(WorkQueueTest, PostReturnsWhileAJobRunsAndTheNextWaitsForIt) {
  absl::Notification release, ran_second;
  WorkQueue queue("mpd-test-queue");
  queue.Post([&] { release.WaitForNotification(); });
  queue.Post([&] { ran_second.Notify(); });  // returns: the first job still blocks
  EXPECT_FALSE(ran_second.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  release.Notify();
  ran_second.WaitForNotification();
}

}  // namespace
}  // namespace memprofd
