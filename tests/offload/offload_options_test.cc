#include "core/offload/offload_options.h"

#include <gtest/gtest.h>

namespace memprofd::offload {
namespace {

TEST(OffloadOptionsTest, TargetNamesRoundTrip) {
  for (const Target t : {Target::kHost, Target::kDisk}) {
    auto parsed = ParseTarget(TargetName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(ParseTarget("gpu").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OffloadOptionsTest, AddSumsCountersKeepsPeakTakesGauges) {
  OffloadStats a;
  a.tensors_seen = 3;
  a.bytes_out = 100;
  a.peak_resident_saved_bytes = 50;
  a.disk_bytes_held = 7;
  OffloadStats b;
  b.tensors_seen = 2;
  b.bytes_out = 10;
  b.skipped_small = 1;
  b.skipped_exempt = 2;
  b.peak_resident_saved_bytes = 20;
  b.disk_bytes_held = 0;
  a.Add(b);
  EXPECT_EQ(a.tensors_seen, 5);
  EXPECT_EQ(a.bytes_out, 110);
  EXPECT_EQ(a.peak_resident_saved_bytes, 50);
  EXPECT_EQ(a.disk_bytes_held, 0);
  EXPECT_EQ(a.skipped_total(), 3);
}

}  // namespace
}  // namespace memprofd::offload
