// The CUDA caching allocator model against sequences whose outcome the
// allocator's rules fix (caching_allocator_model.h lists them).

#include "core/plan/caching_allocator_model.h"

#include <gtest/gtest.h>

namespace memprofd::plan {
namespace {

constexpr int64_t kKiB = 1 << 10;
constexpr int64_t kMiB = 1 << 20;

TEST(CachingAllocatorModelTest, SmallRequestsShareTwoMiBSegments) {
  CachingAllocatorModel m;
  // 4096 blocks of 512 bytes fill one 2 MiB segment exactly; one more opens
  // a second. A 1-byte request takes a 512-byte block.
  for (uint64_t id = 0; id < 4096; ++id) m.Allocate(id, id == 0 ? 1 : 512);
  EXPECT_EQ(m.reserved_bytes(), 2 * kMiB);
  EXPECT_EQ(m.allocated_bytes(), 2 * kMiB);
  m.Allocate(9999, 100);
  EXPECT_EQ(m.reserved_bytes(), 4 * kMiB);
  EXPECT_EQ(m.segments(), 2);
  m.Allocate(10000, 0);  // no block
  EXPECT_EQ(m.allocated_bytes(), 2 * kMiB + 512);
}

TEST(CachingAllocatorModelTest, MidSizedRequestsShareTwentyMiBSegments) {
  CachingAllocatorModel m;
  for (uint64_t id = 0; id < 4; ++id) m.Allocate(id, 5 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 20 * kMiB);  // four fit one 20 MiB segment
  m.Allocate(4, 5 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 40 * kMiB);
  // An 11 MiB request fits the 15 MiB left in the second segment (best
  // fit); a 16 MiB one gets a segment of its own, rounded up to 2 MiB.
  m.Allocate(5, 11 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 40 * kMiB);
  m.Allocate(6, 15 * kMiB + 1);
  EXPECT_EQ(m.reserved_bytes(), 56 * kMiB);
}

TEST(CachingAllocatorModelTest,
     FreedBlocksAreReusedBestFitAndNotSplitForSmallRemainders) {
  CachingAllocatorModel m;
  m.Allocate(1, 12 * kMiB);  // a 12 MiB segment
  m.Free(1);
  // 11.5 MiB leaves 0.5 MiB, not more than 1 MiB: the whole block is handed
  // out and counted whole, and nothing new is reserved.
  EXPECT_EQ(m.Allocate(2, 11 * kMiB + 512 * kKiB), 12 * kMiB);  // the block's size
  EXPECT_EQ(m.reserved_bytes(), 12 * kMiB);
  EXPECT_EQ(m.allocated_bytes(), 12 * kMiB);
  m.Free(2);
  // 10 MiB leaves 2 MiB: split; the 2 MiB rest serves a 1.5 MiB request,
  // whole again (0.5 MiB would be left).
  EXPECT_EQ(m.Allocate(3, 10 * kMiB), 10 * kMiB);
  EXPECT_EQ(m.allocated_bytes(), 10 * kMiB);
  EXPECT_EQ(m.Allocate(4, 1536 * kKiB), 2 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 12 * kMiB);
  EXPECT_EQ(m.allocated_bytes(), 12 * kMiB);
}

TEST(CachingAllocatorModelTest, FragmentationReservesMoreAndMergingUndoesIt) {
  CachingAllocatorModel m;
  // A (6 MiB) and B (6 MiB) in one 20 MiB segment, 8 MiB free after them.
  m.Allocate(1, 6 * kMiB);
  m.Allocate(2, 6 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 20 * kMiB);
  m.Free(1);                // a 6 MiB hole before B
  m.Allocate(3, 7 * kMiB);  // the 8 MiB after B (whole), not the hole
  EXPECT_EQ(m.reserved_bytes(), 20 * kMiB);
  m.Allocate(4, 7 * kMiB);  // fits neither: a new segment
  EXPECT_EQ(m.reserved_bytes(), 40 * kMiB);
  // Freeing B and C merges the first segment back into one free 20 MiB
  // block, which then serves 19 MiB without a third segment.
  m.Free(2);
  m.Free(3);
  m.Free(4);
  m.Allocate(5, 19 * kMiB);
  m.Allocate(6, 19 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 40 * kMiB);
  m.Allocate(7, 19 * kMiB);
  EXPECT_EQ(m.reserved_bytes(), 60 * kMiB);
  // Each 19 MiB request took a whole 20 MiB block (1 MiB is no remainder
  // worth splitting), and counts so.
  EXPECT_EQ(m.peak_allocated_bytes(), 60 * kMiB);
}

TEST(CachingAllocatorModelTest, SmallAndLargePoolsDoNotShare) {
  CachingAllocatorModel m;
  m.Allocate(1, 6 * kMiB);  // a 20 MiB large segment with 14 MiB free
  m.Allocate(2, 4 * kKiB);  // small: a 2 MiB segment of its own
  EXPECT_EQ(m.reserved_bytes(), 22 * kMiB);
  m.Free(99);  // unknown: ignored
  m.Free(2);
  m.Free(2);                // twice: the second is unknown
  m.Allocate(3, 2 * kMiB);  // large: from the 14 MiB left
  EXPECT_EQ(m.reserved_bytes(), 22 * kMiB);
}

}  // namespace
}  // namespace memprofd::plan
