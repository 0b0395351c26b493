// Symbolic links someone else planted in or as the snapshot root: memprofd
// never follows them to read, write or delete outside the root.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

namespace fs = std::filesystem;
using ::memprofd::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SnapshotSymlinkTest, ALinkUnderASnapshotNameIsNeverFollowed) {
  TempDir root;
  TempDir outside;
  const TensorList model = testing::MakeModel(1, 1, 8, 16);
  ASSERT_TRUE(SnapshotWriter(outside.path()).Write("victim", model, "{}", {}).ok());
  ASSERT_TRUE(SnapshotWriter(root.path()).Write("real", model, "{}", {}).ok());
  const std::vector<std::string> victim_files = testing::ListDir(outside.Join("victim"));
  fs::create_directory_symlink(outside.Join("victim"), root.Join("evil"));
  fs::create_directory_symlink(outside.Join("victim"), root.Join(".tmp-planted"));

  auto list = ListSnapshots(root.path());
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "real");
  auto described = DescribeSnapshot(root.path(), "evil");
  EXPECT_EQ(described.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(described.status().message(), HasSubstr("symbolic link"));
  EXPECT_EQ(DeleteSnapshot(root.path(), "evil").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SnapshotWriter(root.path()).Write("evil", model, "{}", {}).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto deleted = ApplyRetention(root.path(), 1);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(deleted->empty());
  // Leftover cleaning removes the planted link itself, not what it points to.
  EXPECT_EQ(*CleanLeftovers(root.path()), 1);

  EXPECT_EQ(testing::ListDir(outside.Join("victim")), victim_files);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(root.Join("evil"))));
  EXPECT_FALSE(fs::exists(fs::symlink_status(root.Join(".tmp-planted"))));
  EXPECT_TRUE(DescribeSnapshot(outside.path(), "victim").ok());
}

TEST(SnapshotSymlinkTest, ARootLinkOwnedByAnotherUserIsRefused) {
  TempDir dir;
  fs::create_directory(dir.Join("target"));
  fs::create_directory_symlink(dir.Join("target"), dir.Join("own"));
  EXPECT_TRUE(CheckSnapshotRoot(dir.Join("own")).ok());
  EXPECT_TRUE(CheckSnapshotRoot(dir.Join("target")).ok());
  EXPECT_TRUE(CheckSnapshotRoot(dir.Join("missing")).ok());
  fs::create_directory_symlink(dir.Join("target"), dir.Join("planted"));
  if (::lchown(dir.Join("planted").c_str(), 65534, 65534) != 0) {
    GTEST_SKIP() << "cannot give a link to another user (not root): "
                 << std::strerror(errno);
  }
  const absl::Status planted = CheckSnapshotRoot(dir.Join("planted"));
  EXPECT_EQ(planted.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(planted.message(), HasSubstr("owned by uid 65534"));
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
