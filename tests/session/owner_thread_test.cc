// The owner thread: work posted before it starts waits for Start, runs in
// order, with the boundary work after every item and once more at the end.

#include "core/session/owner_thread.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace memprofd {
namespace {

// Records the order of items and boundary calls.
class Log : public BoundaryWork {
 public:
  void Add(const std::string& what) {
    absl::MutexLock lock(&mu_);
    entries_.push_back(what);
  }
  std::vector<std::string> entries() const {
    absl::MutexLock lock(&mu_);
    return entries_;
  }
  bool HasBoundaryWork() const override { return false; }
  void RunBoundaryWork() override { Add("boundary"); }
  absl::Status WriteOptimizerShard(const std::string&) override {
    return absl::OkStatus();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> entries_;
};

TEST(OwnerThreadTest, WorkPostedBeforeStartRunsAfterItInOrderWithBoundaryWork) {
  Log log;
  OwnerThread owner("test-owner", 0);
  ASSERT_TRUE(owner.Post([&] { log.Add("a"); }).ok());
  ASSERT_TRUE(owner.Post([&] { log.Add("b"); }).ok());
  EXPECT_TRUE(log.entries().empty()) << "nothing runs before Start";
  owner.Start(&log);
  owner.Start(&log);  // once: a second Start starts nothing
  owner.Stop();
  EXPECT_TRUE(absl::IsUnavailable(owner.Post([&] { log.Add("late"); })));
  EXPECT_TRUE(owner.Join());
  EXPECT_FALSE(owner.Join());
  EXPECT_EQ(log.entries(),
            (std::vector<std::string>{"a", "boundary", "b", "boundary", "boundary"}));
}

TEST(OwnerThreadTest, WithoutBoundaryWorkItRunsTheItemsOnly) {
  Log log;
  OwnerThread plans("test-plans", 0);
  plans.Start(nullptr);
  ASSERT_TRUE(plans.Post([&] { log.Add("plan"); }).ok());
  plans.Stop();
  plans.Join();
  EXPECT_EQ(log.entries(), std::vector<std::string>{"plan"});
}

}  // namespace
}  // namespace memprofd
