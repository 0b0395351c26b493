// Names, roots, listing, deletion, retention and leftovers.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/common/option_status.h"
#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SnapshotNameTest, RejectsUnsafeNames) {
  for (const std::string& bad : std::vector<std::string>{
           std::string(""), std::string(201, 'a'), std::string("a/b"),
           std::string("a\\b"), std::string(".hidden"), std::string(".."),
           std::string("a..b"), std::string("a\nb"), std::string("a\0b", 3),
           std::string("a\x7f"), std::string("\xff\xfe"), std::string("-rf"),
           std::string("a b"), std::string("*"), std::string("~root"),
           std::string("a\xe2\x80\xae"
                       "b"),
           std::string("\xc3\xa9t\xc3\xa9")}) {
    EXPECT_EQ(ValidateSnapshotName(bad).code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  for (const std::string& good : std::vector<std::string>{
           "step-100", "run_1.final", std::string(200, 'x'), "_private", "v1.2-rc3"}) {
    EXPECT_TRUE(ValidateSnapshotName(good).ok()) << good;
  }
}

TEST(SnapshotWriterTest, BadInputGivesClearStatusesAndWritesNothing) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 1, 8, 16);
  const SnapshotWriter writer(root.path());
  EXPECT_EQ(writer.Write("../escape", model, "", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Write(".tmp-x", model, "", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  SnapshotOptions bad_shard;
  bad_shard.max_shard_size = 0;
  EXPECT_EQ(writer.Write("a", model, "", bad_shard).status().code(),
            absl::StatusCode::kInvalidArgument);
  SnapshotOptions bad_staging;
  bad_staging.staging_bytes = 100;
  EXPECT_EQ(writer.Write("a", model, "", bad_staging).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(writer.Write("a", model, "{not json", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  TensorList dup = model;
  dup.push_back(model[0]);
  EXPECT_EQ(writer.Write("a", dup, "", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::ListDir(root.path()).empty());

  ASSERT_TRUE(writer.Write("a", model, "", {}).ok());
  auto again = writer.Write("a", model, "", {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(testing::ListDir(root.path()), std::vector<std::string>{"a"});
}

TEST(SnapshotWriterTest, UnwritableRootIsAPreconditionOrPermissionError) {
  TempDir tmp;
  const TensorList model = testing::MakeModel(1, 1, 8, 16);
  std::ofstream(tmp.Join("file")) << "x";
  auto s = SnapshotWriter(tmp.Join("file")).Write("a", model, "", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("snapshot_root"));
  EXPECT_EQ(OptionOf(s.status()), "snapshot_root");  // the daemon names its flag
  s = SnapshotWriter(tmp.Join("file/sub")).Write("a", model, "", {});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  // A missing root is created.
  EXPECT_TRUE(SnapshotWriter(tmp.Join("new/root")).Write("a", model, "", {}).ok());
  if (::geteuid() != 0) {  // root ignores permission bits
    ASSERT_EQ(::mkdir(tmp.Join("ro").c_str(), 0555), 0);
    s = SnapshotWriter(tmp.Join("ro")).Write("a", model, "", {});
    EXPECT_EQ(s.status().code(), absl::StatusCode::kPermissionDenied) << s.status();
  }
}

TEST(SnapshotStoreTest, ListDescribeDeleteAndRetention) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 1, 8, 16);
  const SnapshotWriter writer(root.path());
  for (const char* name : {"s1", "s2", "s3", "s4"}) {
    SnapshotOptions o;
    o.global_step = name[1] - '0';
    ASSERT_TRUE(writer.Write(name, model, "{}", o).ok());
  }
  // Not snapshots: a hidden dir and a directory without a manifest.
  std::filesystem::create_directory(root.Join(".tmp-zz-123456"));
  std::filesystem::create_directory(root.Join("plain"));
  auto list = ListSnapshots(root.path());
  ASSERT_TRUE(list.ok()) << list.status();
  std::vector<std::string> names;
  for (const auto& m : *list) names.push_back(m.name);
  EXPECT_THAT(names, ElementsAre("s1", "s2", "s3", "s4"));

  auto d = DescribeSnapshot(root.path(), "s3");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->global_step, 3);
  EXPECT_EQ(d->directory, root.Join("s3"));
  EXPECT_EQ(d->num_tensors, static_cast<int64_t>(model.size()));
  EXPECT_EQ(d->files.size(), 2u);  // model.safetensors, config.json
  EXPECT_EQ(DescribeSnapshot(root.path(), "nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(DescribeSnapshot(root.path(), "plain").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DescribeSnapshot(root.path(), "../x").status().code(),
            absl::StatusCode::kInvalidArgument);
  std::ofstream(root.Join("s4/memprofd_manifest.json"), std::ios::trunc) << "{\"x\":1}";
  EXPECT_EQ(DescribeSnapshot(root.path(), "s4").status().code(),
            absl::StatusCode::kDataLoss);

  EXPECT_EQ(DeleteSnapshot(root.path(), "nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(DeleteSnapshot(root.path(), "s2").ok());
  auto deleted = ApplyRetention(root.path(), 1);  // s4 is damaged: not listed
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_THAT(*deleted, ElementsAre("s1"));
  EXPECT_EQ(ApplyRetention(root.path(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ApplyRetention(root.path(), 0)->empty());
  EXPECT_EQ(testing::ListDir(root.path()),
            (std::vector<std::string>{".tmp-zz-123456", "plain", "s3", "s4"}));
  EXPECT_EQ(*CleanLeftovers(root.path()), 1);
  EXPECT_EQ(testing::ListDir(root.path()),
            (std::vector<std::string>{"plain", "s3", "s4"}));
  EXPECT_EQ(*CleanLeftovers(root.Join("missing")), 0);
  EXPECT_TRUE(ListSnapshots(root.Join("missing"))->empty());
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
