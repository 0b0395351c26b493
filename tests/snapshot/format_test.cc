// The safetensors format: layout, and the strict reader's rejection of every
// kind of corruption (the JSON reader itself is tested in
// tests/common/json_test.cc).
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/snapshot/safetensors.h"
#include "core/snapshot/safetensors_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;

using ::testing::HasSubstr;

TEST(LayoutTest, OrdersByDtypeAlignmentThenNameAndPadsTo8) {
  auto layout = LayoutSafetensors({{"b", "F32", {2}},
                                   {"a", "BF16", {3}},
                                   {"c", "I64", {1}},
                                   {"a2", "F32", {}},
                                   {"z", "BOOL", {0}}},
                                  PtMetadata());
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<std::string> names;
  for (const auto& e : layout->entries) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"c", "a2", "b", "a", "z"}));
  EXPECT_EQ(layout->entries[0].begin, 0u);
  EXPECT_EQ(layout->entries[1].begin, 8u);
  EXPECT_EQ(layout->entries[2].begin, 12u);
  EXPECT_EQ(layout->entries[3].begin, 20u);
  EXPECT_EQ(layout->entries[4].begin, 26u);
  EXPECT_EQ(layout->entries[4].end, 26u);
  EXPECT_EQ(layout->data_bytes, 26u);
  EXPECT_EQ(layout->header_bytes.size() % 8, 0u);
  const std::string json = layout->header_bytes.substr(8);
  EXPECT_THAT(json,
              ::testing::StartsWith(
                  R"({"__metadata__":{"format":"pt"},"c":{"dtype":"I64","shape":[1],)"
                  R"("data_offsets":[0,8]},"a2":{"dtype":"F32","shape":[],)"));
  EXPECT_EQ(json.back() == ' ' || json.back() == '}', true);
}

TEST(LayoutTest, RejectsBadSpecs) {
  EXPECT_FALSE(LayoutSafetensors({{"a", "F32", {1}}, {"a", "F32", {1}}}, {}).ok());
  EXPECT_FALSE(LayoutSafetensors({{"a", "F33", {1}}}, {}).ok());
  EXPECT_FALSE(LayoutSafetensors({{"a", "F32", {-1}}}, {}).ok());
  EXPECT_FALSE(LayoutSafetensors({{"__metadata__", "F32", {1}}}, {}).ok());
  EXPECT_FALSE(LayoutSafetensors({{"a", "F32", {INT64_MAX, 4}}}, {}).ok());
  // The header is UTF-8 text.
  EXPECT_FALSE(LayoutSafetensors({{"a\xff", "F32", {1}}}, {}).ok());
  EXPECT_FALSE(LayoutSafetensors({{"a", "F32", {1}}}, {{"format", "p\xc0"}}).ok());
}

// A file from a raw header text (padded to 8 with spaces unless `pad` is
// false) and `data_bytes` bytes of data.
std::string RawFile(const std::string& json, size_t data_bytes, bool pad = true,
                    int64_t length_override = -1) {
  std::string header = json;
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  const uint64_t n = length_override >= 0 ? length_override : header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + std::string(data_bytes, '\x01');
}

class CorruptFileTest : public ::testing::Test {
 protected:
  absl::Status Open(const std::string& bytes) {
    const std::string path = dir_.Join("x.safetensors");
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    auto file = SafetensorsFile::Open(path);
    if (file.ok()) return absl::OkStatus();
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
    return file.status();
  }
  void ExpectDataLoss(const std::string& bytes, const std::string& what) {
    const absl::Status s = Open(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(what));
  }
  TempDir dir_;
};

const char kGood[] =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("b":{"dtype":"I8","shape":[4],"data_offsets":[8,12]}})";

TEST_F(CorruptFileTest, AcceptsAWellFormedFile) {
  EXPECT_TRUE(Open(RawFile(kGood, 12)).ok());
  // Key order is free and the metadata optional.
  EXPECT_TRUE(Open(RawFile(R"({"b":{"data_offsets":[8,12],"shape":[4],"dtype":"I8"},)"
                           R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                           12))
                  .ok());
}

// The reference implementation writes and reads a tensor named "" (bytes from
// `safetensors.torch.save_file({"": torch.zeros(2)}, ...)`), so the reader
// accepts it and the writer lays it out to the same bytes.
TEST(LayoutTest, TheEmptyNameIsAValidTensorNameBothWays) {
  const std::string reference =
      RawFile(R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  auto header = ParseSafetensors(reference, "empty.safetensors");
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_EQ(header->tensors.size(), 1u);
  EXPECT_EQ(header->tensors[0].name, "");
  auto layout = LayoutSafetensors({{"", "F32", {2}}}, {});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->header_bytes, reference.substr(0, header->data_start()));
}

TEST_F(CorruptFileTest, RejectsTruncatedFile) {
  ExpectDataLoss(RawFile(kGood, 11), "truncated");
}

TEST_F(CorruptFileTest, RejectsTrailingBytes) {
  ExpectDataLoss(RawFile(kGood, 13), "trailing bytes");
}

TEST_F(CorruptFileTest, RejectsGap) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                         12),
                 "gap");
}

TEST_F(CorruptFileTest, RejectsOverlap) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         12),
                 "overlap");
}

TEST_F(CorruptFileTest, RejectsFirstOffsetOtherThanZero) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                 "invalid offset");
}

TEST_F(CorruptFileTest, RejectsSizeNotNumelTimesElementSize) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 "need 12");
}

TEST_F(CorruptFileTest, AShapeWhoseSizeOverflowsSaysSo) {
  ExpectDataLoss(
      RawFile(
          R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})",
          8),
      "need more bytes than a file can hold (over 2^63)");
}

TEST_F(CorruptFileTest, RejectsUnknownDtype) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F33","shape":[1],"data_offsets":[0,4]}})", 4),
                 "unknown dtype");
}

TEST_F(CorruptFileTest, RejectsDtypeLibTorchCannotHoldAsInvalidArgument) {
  const absl::Status s =
      Open(RawFile(R"({"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_F(CorruptFileTest, RejectsBadJson) {
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32",)", 0), "invalid JSON");
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},})", 4),
                 "invalid JSON");
}

TEST_F(CorruptFileTest, RejectsHeaderTooLarge) {
  ExpectDataLoss(RawFile("{}", 0, true, 100'000'001), "too large");
}

TEST_F(CorruptFileTest, RejectsLengthTooSmallOrPastTheEnd) {
  ExpectDataLoss(std::string(5, '\0'), "too small");
  ExpectDataLoss(RawFile("{}", 0, true, 1000), "invalid header length");
  ExpectDataLoss(RawFile("{}", 0, true, 0), "does not start with '{'");
}

TEST_F(CorruptFileTest, RejectsInvalidUtf8AndBadStart) {
  ExpectDataLoss(RawFile("{\"\xff\":1}", 0), "UTF-8");
  ExpectDataLoss(RawFile(" {}", 0), "does not start with '{'");
}

TEST_F(CorruptFileTest, RejectsNonStringMetadataAndBadEntries) {
  ExpectDataLoss(RawFile(R"({"__metadata__":{"format":1}})", 0), "not a string");
  ExpectDataLoss(
      RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
      "unexpected field");
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "needs");
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                 "non-negative");
  ExpectDataLoss(RawFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         8),
                 "duplicate key");
}

TEST(SafetensorsFileTest, WritesReferenceLayoutAndReadsBackMapped) {
  TempDir dir;
  const TensorList tensors = testing::MakeAllDtypes(1);
  const std::string path = dir.Join("all.safetensors");
  ASSERT_TRUE(WriteSafetensorsFile(path, tensors, 4096).ok());
  EXPECT_EQ(WriteSafetensorsFile(path, tensors).code(), absl::StatusCode::kAlreadyExists);
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->header().metadata.at("format"), "pt");
  auto read = (*file)->Tensors();
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), tensors.size());
  file->reset();  // tensors keep the mapping alive
  std::map<std::string, at::Tensor> by_name(read->begin(), read->end());
  for (const auto& [name, t] : tensors) {
    EXPECT_TRUE(testing::BitEqual(t, by_name.at(name))) << name;
  }
  // Copy-on-write: writing to a mapped tensor leaves the file alone.
  by_name.at("f32").fill_(7);
  auto again = SafetensorsFile::Open(path);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(testing::BitEqual(tensors[1].second, *(*again)->Tensor("f32")));
  EXPECT_EQ((*again)->Tensor("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(SafetensorsFile::Open(dir.Join("missing")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsFileTest, RejectsTensorsItCannotStore) {
  TempDir dir;
  EXPECT_EQ(
      WriteSafetensorsFile(dir.Join("c"), {{"c", at::zeros({2}, at::kComplexFloat)}})
          .code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensorsFile(dir.Join("u"), {{"u", at::Tensor()}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      WriteSafetensorsFile(dir.Join("m"), {{"m", at::zeros({2}, at::kMeta)}}).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(testing::ListDir(dir.path()).empty());
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
