// Statuses about an engine option carry the option's field name beside an
// unchanged code and message; OK statuses stay unmarked.
#include "core/common/option_status.h"

#include "gtest/gtest.h"

namespace memprofd {
namespace {

TEST(OptionStatusTest, MarksKeepCodeAndMessageAndNameTheOption) {
  const absl::Status s = OptionError(absl::StatusCode::kFailedPrecondition,
                                     "snapshot_root", "snapshots are off");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "snapshots are off");
  EXPECT_EQ(OptionOf(s), "snapshot_root");

  const absl::Status plain = absl::InvalidArgumentError("seq_len: must be at least 1");
  EXPECT_EQ(OptionOf(plain), std::nullopt);
  const absl::Status marked = AboutOption(plain, "peak_file");
  EXPECT_EQ(marked.message(), plain.message());
  EXPECT_EQ(OptionOf(marked), "peak_file");
  // A second mark replaces the first.
  EXPECT_EQ(OptionOf(AboutOption(marked, "report_dir")), "report_dir");
}

TEST(OptionStatusTest, OkIsNeverMarked) {
  const absl::Status ok = AboutOption(absl::OkStatus(), "device");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(OptionOf(ok), std::nullopt);
}

}  // namespace
}  // namespace memprofd
