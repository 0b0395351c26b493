#include "core/offload/offload_options.h"

#include <gtest/gtest.h>

#include <string>

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

TEST(OffloadOptionsTest, RequestReplacesOnlyTheFieldsItSets) {
  OffloadOptions daemon;
  daemon.enabled = false;
  daemon.target = Target::kHost;
  daemon.offload_head = true;  // --offload_head
  daemon.min_offload_bytes = 4096;
  daemon.spill_dir = "/var/tmp";
  OffloadOverrides request;
  request.enabled = true;
  absl::StatusOr<OffloadOptions> merged = MergeOffloadOverrides(daemon, request);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_TRUE(merged->enabled);
  EXPECT_TRUE(merged->offload_head);  // not given: the daemon's
  EXPECT_EQ(merged->target, Target::kHost);
  EXPECT_EQ(merged->min_offload_bytes, 4096);
  EXPECT_EQ(merged->spill_dir, "/var/tmp");

  request.offload_head = false;
  request.target = Target::kDisk;
  request.min_offload_bytes = 0;  // given as 0: every tensor, not "the default"
  request.max_copies_in_flight = 2;
  request.prefetch_depth = 3;
  merged = MergeOffloadOverrides(daemon, request);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_FALSE(merged->offload_head);
  EXPECT_EQ(merged->target, Target::kDisk);
  EXPECT_EQ(merged->min_offload_bytes, 0);
  EXPECT_EQ(merged->max_copies_in_flight, 2);
  EXPECT_EQ(merged->prefetch_depth, 3);
}

TEST(OffloadOptionsTest, ValidationNamesTheFieldWithItsPrefix) {
  const OffloadOptions good;
  EXPECT_TRUE(ValidateOffloadOptions(good).ok());
  struct Case {
    void (*spoil)(OffloadOptions&);
    const char* field;
  };
  const Case cases[] = {
      {[](OffloadOptions& o) { o.min_offload_bytes = -1; }, "min_offload_bytes"},
      {[](OffloadOptions& o) { o.max_copies_in_flight = 0; }, "max_copies_in_flight"},
      {[](OffloadOptions& o) { o.prefetch_depth = -2; }, "prefetch_depth"},
      {[](OffloadOptions& o) { o.host_limit_bytes = -1; }, "host_limit_bytes"},
      {[](OffloadOptions& o) { o.spill_dir.clear(); }, "spill_dir"},
  };
  for (const Case& c : cases) {
    OffloadOptions bad = good;
    c.spoil(bad);
    const absl::Status request = ValidateOffloadOptions(bad);
    EXPECT_EQ(request.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(request.message().rfind(std::string("offload.") + c.field, 0), 0u)
        << request;
    const absl::Status flag = ValidateOffloadOptions(bad, "--");
    EXPECT_EQ(flag.message().rfind(std::string("--") + c.field, 0), 0u) << flag;
  }
  OffloadOverrides request;
  request.max_copies_in_flight = 0;
  EXPECT_EQ(MergeOffloadOverrides(good, request).status().code(),
            absl::StatusCode::kInvalidArgument);
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
  b.skipped_of(SkipReason::kSmall) = 1;
  b.skipped_of(SkipReason::kExempt) = 2;
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
