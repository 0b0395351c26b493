// The planner's process group (ProcessGroup::ForPlan): what each collective
// does to this rank's tensors, with no peers, and that its collectives read
// as in flight until waited for, as a real rank's may be.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "core/dist/process_group.h"

namespace memprofd {
namespace {

TEST(PlanProcessGroupTest, CollectivesActAsIfEveryRankHeldThisRanksTensors) {
  std::unique_ptr<ProcessGroup> group = ProcessGroup::ForPlan(1, 4);
  EXPECT_STREQ(group->backend_name(), "plan");
  EXPECT_EQ(group->rank(), 1);
  EXPECT_EQ(group->world_size(), 4);

  at::Tensor t = at::arange(8, at::kFloat);
  ASSERT_TRUE(group->AllReduceSum(t).ok());
  EXPECT_TRUE(at::equal(t, at::arange(8, at::kFloat)));

  absl::StatusOr<std::vector<at::Tensor>> all = group->AllGather(t);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 4u);
  for (const at::Tensor& x : *all) EXPECT_TRUE(at::equal(x, t));

  at::Tensor whole = at::zeros({32});
  absl::StatusOr<PendingCollective> gathered = group->StartAllGatherInto(whole, t);
  ASSERT_TRUE(gathered.ok());
  EXPECT_TRUE(at::equal(whole.view({4, 8})[3], t));

  at::Tensor mine = at::zeros({8});
  absl::StatusOr<PendingCollective> scattered =
      group->StartReduceScatterSum(mine, at::arange(32, at::kFloat));
  ASSERT_TRUE(scattered.ok());
  EXPECT_TRUE(at::equal(mine, at::arange(8, 16, at::kFloat)));

  // In flight until waited for; then done.
  EXPECT_FALSE(scattered->Done());
  EXPECT_TRUE(scattered->Wait().ok());
  EXPECT_TRUE(scattered->Done());
}

TEST(PlanProcessGroupTest, BadRootsAndChunksAreRefusedAndThereIsNoStore) {
  std::unique_ptr<ProcessGroup> group = ProcessGroup::ForPlan(0, 2);
  at::Tensor t = at::ones({4});
  EXPECT_TRUE(absl::IsInvalidArgument(group->StartBroadcast(t, 2).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(group->StartReduceSum(t, -1).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(group->StartAllGatherInto(at::zeros({7}), t).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(group->SetKey("k", "v")));
  EXPECT_TRUE(absl::IsFailedPrecondition(group->WaitKey("k", absl::Seconds(1)).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(group->OpenChannel().status()));
}

}  // namespace
}  // namespace memprofd
