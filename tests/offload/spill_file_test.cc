#include "core/offload/internal/spill_file.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memprofd::offload::internal {
namespace {

TEST(SpillFileTest, WritesReadBackAndSpaceIsReused) {
  auto file = SpillFile::Open("/tmp");
  ASSERT_TRUE(file.ok()) << file.status();
  SpillFile& spill = **file;
  const std::string a(100, 'a');
  const std::string b(50, 'b');
  const int64_t off_a = spill.Allocate(100);
  const int64_t off_b = spill.Allocate(50);
  ASSERT_TRUE(spill.Write(off_a, a.data(), 100).ok());
  ASSERT_TRUE(spill.Write(off_b, b.data(), 50).ok());
  EXPECT_EQ(spill.bytes_held(), 150);
  EXPECT_EQ(spill.file_bytes(), 150);
  std::string back(100, '\0');
  ASSERT_TRUE(spill.Read(off_a, back.data(), 100).ok());
  EXPECT_EQ(back, a);

  spill.Free(off_a, 100);
  EXPECT_EQ(spill.bytes_held(), 50);
  // First fit: the freed head is reused, the file does not grow.
  const int64_t off_c = spill.Allocate(60);
  EXPECT_EQ(off_c, off_a);
  EXPECT_EQ(spill.file_bytes(), 150);
  std::string back_b(50, '\0');
  ASSERT_TRUE(spill.Read(off_b, back_b.data(), 50).ok());
  EXPECT_EQ(back_b, b);

  spill.Free(off_b, 50);
  spill.Free(off_c, 60);
  EXPECT_EQ(spill.bytes_held(), 0);
  EXPECT_EQ(spill.file_bytes(), 0);
}

TEST(SpillFileTest, FreedTailShrinksTheFile) {
  auto file = SpillFile::Open("/tmp");
  ASSERT_TRUE(file.ok());
  SpillFile& spill = **file;
  const int64_t a = spill.Allocate(10);
  const int64_t b = spill.Allocate(20);
  const int64_t c = spill.Allocate(30);
  spill.Free(b, 20);
  EXPECT_EQ(spill.file_bytes(), 60);
  spill.Free(c, 30);  // coalesces with b's hole: the tail goes
  EXPECT_EQ(spill.file_bytes(), 10);
  EXPECT_EQ(spill.Allocate(40), 10);
  spill.Free(a, 10);
}

TEST(SpillFileTest, UnwritableDirectoryIsAnError) {
  auto file = SpillFile::Open("/nonexistent/memprofd");
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("spill_dir"), std::string::npos);
}

TEST(SpillFileTest, ReadPastTheEndIsDataLoss) {
  auto file = SpillFile::Open("/tmp");
  ASSERT_TRUE(file.ok());
  std::vector<char> buf(16);
  EXPECT_EQ((*file)->Read(0, buf.data(), 16).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace memprofd::offload::internal
