// Megatron indexed datasets: the pair megatron-core's builder writes, read as
// megatron-core reads it (tests/train/indexed_reference.py), and every
// corruption of it refused with the file and the byte offset.

#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/train/data.h"
#include "core/train/indexed_dataset.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/command.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::memprofd::testing::TempDir;
using ::testing::HasSubstr;

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

DataSpec Indexed(const std::string& prefix,
                 DataSpec::Windows windows = DataSpec::Windows::kPacked) {
  DataSpec spec;
  spec.kind = DataSpec::Kind::kIndexedDataset;
  spec.path = prefix;
  spec.windows = windows;
  return spec;
}

// The pairs megatron-core writes and what it reads from them, made once.
class IndexedDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string out;
    ASSERT_EQ(testing::RunPython(
                  {testing::SourcePath("tests/train/indexed_reference.py"), dir_->path()},
                  &out),
              0)
        << out;
    reference_ =
        new nlohmann::json(nlohmann::json::parse(Slurp(dir_->Join("reference.json"))));
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete dir_;
  }

  // A copy of `name`'s pair as `copy` with its .idx (or .bin) replaced.
  static std::string Corrupt(const TempDir& tmp, const std::string& name, std::string idx,
                             std::string bin = "") {
    if (bin.empty()) bin = Slurp(dir_->Join(name + ".bin"));
    tmp.WriteFile("bad.idx", idx);
    tmp.WriteFile("bad.bin", bin);
    return tmp.Join("bad");
  }
  static std::string Idx(const std::string& name) {
    return Slurp(dir_->Join(name + ".idx"));
  }

  static TempDir* dir_;
  static nlohmann::json* reference_;
};
TempDir* IndexedDataTest::dir_ = nullptr;
nlohmann::json* IndexedDataTest::reference_ = nullptr;

void ExpectDataLoss(const DataSpec& spec, absl::string_view file, int64_t offset) {
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(spec, 100000);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss) << d.status();
  EXPECT_THAT(d.status().message(), HasSubstr(std::string(file)));
  EXPECT_THAT(d.status().message(), HasSubstr(absl::StrCat("at byte ", offset, ":")));
}

TEST_F(IndexedDataTest, TokensEqualWhatMegatronReadsForUint16AndInt32) {
  for (const std::string name : {"u16", "i32"}) {
    SCOPED_TRACE(name);
    const nlohmann::json& ref = (*reference_)[name];
    EXPECT_EQ(ref["dtype"], name == "u16" ? "uint16" : "int32");
    absl::StatusOr<std::unique_ptr<TokenDataset>> d =
        TokenDataset::Create(Indexed(dir_->Join(name)), name == "u16" ? 1000 : 70000);
    ASSERT_TRUE(d.ok()) << d.status();
    // Sequence i's ids at the running offset, as IndexedDataset[i] returns them.
    int64_t at = 0;
    std::vector<int64_t> sequence_starts;
    for (const auto& seq : ref["sequences"]) {
      sequence_starts.push_back(at);
      const std::vector<int64_t> ids = seq.get<std::vector<int64_t>>();
      EXPECT_TRUE(torch::equal((*d)->Window(at, static_cast<int64_t>(ids.size())).value(),
                               torch::tensor(ids, torch::kInt64)))
          << "sequence at " << at;
      at += static_cast<int64_t>(ids.size());
    }
    EXPECT_EQ((*d)->size(), at);
    for (const auto& span : ref["spans"]) {
      const int64_t seq = span[0], offset = span[1], length = span[2];
      EXPECT_TRUE(torch::equal(
          (*d)->Window(sequence_starts[seq] + offset, length).value(),
          torch::tensor(span[3].get<std::vector<int64_t>>(), torch::kInt64)));
    }
    // Document d begins at its first sequence; empty documents (a bound
    // equal to the one before) are not kept.
    const std::vector<int64_t> docs = ref["document_indices"].get<std::vector<int64_t>>();
    std::vector<int64_t> expected;
    for (const int64_t first : docs) {
      const int64_t bound = first < static_cast<int64_t>(sequence_starts.size())
                                ? sequence_starts[first]
                                : at;
      if (expected.empty() || bound > expected.back()) expected.push_back(bound);
    }
    EXPECT_EQ((*d)->document_bounds(), expected);
    EXPECT_EQ((*d)->document_bounds().back(), at);
  }
}

TEST_F(IndexedDataTest, PackedWindowsCrossDocumentsAndWithinDocumentWindowsNever) {
  const std::string prefix = dir_->Join("u16");
  absl::StatusOr<std::unique_ptr<TokenDataset>> packed =
      TokenDataset::Create(Indexed(prefix), 1000);
  absl::StatusOr<std::unique_ptr<TokenDataset>> within =
      TokenDataset::Create(Indexed(prefix, DataSpec::Windows::kWithinDocuments), 1000);
  ASSERT_TRUE(packed.ok() && within.ok()) << packed.status() << within.status();
  const std::vector<int64_t>& bounds = (*within)->document_bounds();
  const int64_t seq_len = 10;
  // The packed stream is every document in order: a window of the packed
  // data equals the same span of the concatenation, and some cross.
  at::Generator gen = at::detail::createCPUGenerator(7);
  absl::StatusOr<TokenBatch> batch = (*within)->NextBatch(256, seq_len, gen);
  ASSERT_TRUE(batch.ok()) << batch.status();
  // Each row (inputs and the last target) is one document's span.
  for (int64_t b = 0; b < 256; ++b) {
    at::Tensor row =
        torch::cat({batch->inputs[b], batch->targets[b].narrow(0, seq_len - 1, 1)});
    bool found = false;
    for (size_t d = 0; d + 1 < bounds.size() && !found; ++d) {
      for (int64_t s = bounds[d]; s + seq_len + 1 <= bounds[d + 1] && !found; ++s) {
        found = torch::equal(row, (*within)->Window(s, seq_len + 1).value());
      }
    }
    EXPECT_TRUE(found) << "row " << b << " is not inside one document";
  }
  // Longer than the longest document: within-document windows cannot be drawn.
  int64_t longest = 0;
  for (size_t d = 0; d + 1 < bounds.size(); ++d) {
    longest = std::max(longest, bounds[d + 1] - bounds[d]);
  }
  EXPECT_EQ((*within)->Validate(longest).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*within)->Validate(longest - 1).ok());
  EXPECT_TRUE((*packed)->Validate(longest + 5).ok());
  // Packed draws use the generator as a token file does: the same windows.
  at::Generator g1 = at::detail::createCPUGenerator(3);
  at::Generator g2 = at::detail::createCPUGenerator(3);
  DataSpec flat;
  flat.kind = DataSpec::Kind::kTokenFile;
  flat.path = prefix + ".bin";
  flat.bytes_per_token = 2;
  absl::StatusOr<std::unique_ptr<TokenDataset>> token_file =
      TokenDataset::Create(flat, 1000);
  ASSERT_TRUE(token_file.ok());
  absl::StatusOr<TokenBatch> a = (*packed)->NextBatch(8, seq_len, g1);
  absl::StatusOr<TokenBatch> c = (*token_file)->NextBatch(8, seq_len, g2);
  ASSERT_TRUE(a.ok() && c.ok());
  EXPECT_TRUE(torch::equal(a->inputs, c->inputs));
}

// A sparse index (a few kB on disk) claiming 2^24 documents, all empty but
// the last: valid, and its documents cost heap only for the bounds that
// hold tokens, not 8 bytes for each claimed document.
TEST_F(IndexedDataTest, EmptyDocumentsOfASparseIndexCostNoHeap) {
  const TempDir tmp;
  const std::string idx = Idx("u16");
  const int64_t s = 11;
  const int64_t documents_at = 34 + 12 * s;
  const int64_t d = int64_t{1} << 24;
  std::string head = idx.substr(0, static_cast<size_t>(documents_at));
  std::memcpy(head.data() + 26, &d, 8);  // the document count
  tmp.WriteFile("sparse.idx", head);
  tmp.WriteFile("sparse.bin", Slurp(dir_->Join("u16.bin")));
  const std::string idx_path = tmp.Join("sparse.idx");
  // Every document index 0 (a hole) but the last, which is S.
  ASSERT_EQ(::truncate(idx_path.c_str(), documents_at + 8 * d), 0);
  {
    std::fstream f(idx_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(documents_at + 8 * (d - 1));
    f.write(reinterpret_cast<const char*>(&s), 8);
  }
  struct stat st;
  ASSERT_EQ(::stat(idx_path.c_str(), &st), 0);
  ASSERT_LT(st.st_blocks * 512, st.st_size / 100) << "the file is not sparse here";
  absl::StatusOr<std::unique_ptr<TokenDataset>> t = TokenDataset::Create(
      Indexed(tmp.Join("sparse"), DataSpec::Windows::kWithinDocuments), 1000);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->document_bounds(), (std::vector<int64_t>{0, (*t)->size()}));
}

// The .idx is read as it is parsed, never mapped: truncated during the
// parse (here by the cancellation poll, which runs before the arrays are
// read), it fails with DATA_LOSS naming it. A mapping would raise SIGBUS,
// killing the process.
TEST_F(IndexedDataTest, AnIndexTruncatedWhileParsedIsDataLossNotASignal) {
  const TempDir tmp;
  const std::string prefix = Corrupt(tmp, "u16", Idx("u16"));
  const std::string idx_path = prefix + ".idx";
  DataAccess access;
  access.cancelled = [&idx_path] {
    EXPECT_EQ(::truncate(idx_path.c_str(), 40), 0);
    return false;
  };
  absl::StatusOr<std::unique_ptr<TokenDataset>> t =
      TokenDataset::Create(Indexed(prefix), 1000, access);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("bad.idx"));
}

TEST_F(IndexedDataTest, EveryCorruptionIsDataLossNamingTheFileAndOffset) {
  const TempDir tmp;
  const std::string idx = Idx("u16");
  const int64_t s = 11, d = 8;
  const int64_t pointers = 34 + 4 * s, documents = pointers + 8 * s;
  ASSERT_EQ(static_cast<int64_t>(idx.size()), documents + 8 * d);
  // Truncated at several offsets: inside the header, and inside each array.
  for (int64_t cut : {int64_t{5}, int64_t{20}, int64_t{33}}) {
    SCOPED_TRACE(cut);
    ExpectDataLoss(Indexed(Corrupt(tmp, "u16", idx.substr(0, cut))), "bad.idx", cut);
  }
  for (int64_t cut : {int64_t{40}, pointers + 4, documents + 8, documents + 8 * d - 1}) {
    SCOPED_TRACE(cut);
    absl::StatusOr<std::unique_ptr<TokenDataset>> t =
        TokenDataset::Create(Indexed(Corrupt(tmp, "u16", idx.substr(0, cut))), 1000);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
    EXPECT_THAT(t.status().message(), HasSubstr("bad.idx"));
  }
  auto patched = [&](int64_t at, const void* bytes, size_t n) {
    std::string copy = idx;
    std::memcpy(copy.data() + at, bytes, n);
    return Indexed(Corrupt(tmp, "u16", copy));
  };
  ExpectDataLoss(patched(0, "MMIDIDY", 7), "bad.idx", 0);
  const uint64_t version = 2;
  ExpectDataLoss(patched(9, &version, 8), "bad.idx", 9);
  const uint8_t code = 9;
  ExpectDataLoss(patched(17, &code, 1), "bad.idx", 17);
  const uint64_t huge = uint64_t{1} << 40;
  ExpectDataLoss(patched(18, &huge, 8), "bad.idx", 18);
  ExpectDataLoss(patched(26, &huge, 8), "bad.idx", 26);
  // A pointer past the end of the .bin, and a length that disagrees with
  // the next pointer.
  const int64_t past = int64_t{1} << 30;
  ExpectDataLoss(patched(pointers + 8 * 3, &past, 8), "bad.idx", pointers + 8 * 3);
  const int32_t longer = 1000;
  ExpectDataLoss(patched(34, &longer, 4), "bad.bin",
                 static_cast<int64_t>(
                     Slurp(dir_->Join("u16.bin")).size()));  // u16.bin: the first overrun
  const int32_t shorter = 1;
  ExpectDataLoss(patched(34, &shorter, 4), "bad.idx", pointers + 8);
  const int32_t negative = -4;
  ExpectDataLoss(patched(34, &negative, 4), "bad.idx", 34);
  // Document indices out of order, not starting at 0, not ending at S.
  const int64_t two = 5, one = 1, ten = 10;
  const int64_t zero = 0;
  ExpectDataLoss(patched(documents + 8 * 2, &zero, 8), "bad.idx", documents + 8 * 2);
  ExpectDataLoss(patched(documents + 8 * 3, &one, 8), "bad.idx", documents + 8 * 3);
  ExpectDataLoss(patched(documents, &two, 8), "bad.idx", documents);
  ExpectDataLoss(patched(documents + 8 * (d - 1), &ten, 8), "bad.idx",
                 documents + 8 * (d - 1));
  // Bytes after the documents; a truncated or padded .bin.
  ExpectDataLoss(Indexed(Corrupt(tmp, "u16", idx + "x")), "bad.idx", documents + 8 * d);
  const std::string bin = Slurp(dir_->Join("u16.bin"));
  absl::StatusOr<std::unique_ptr<TokenDataset>> t = TokenDataset::Create(
      Indexed(Corrupt(tmp, "u16", idx, bin.substr(0, bin.size() - 3))), 1000);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("bad.bin"));
  ExpectDataLoss(Indexed(Corrupt(tmp, "u16", idx, bin + "xx")), "bad.bin",
                 static_cast<int64_t>(bin.size()));
  // A known dtype that is not token ids.
  const uint8_t float32 = 7;
  EXPECT_EQ(TokenDataset::Create(patched(17, &float32, 1), 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(IndexedDataTest, IdsOutsideTheVocabularyAndPathsOutsideTheRoots) {
  // u16's ids are below 1000; a vocabulary of 10 refuses one, naming it.
  absl::StatusOr<std::unique_ptr<TokenDataset>> d =
      TokenDataset::Create(Indexed(dir_->Join("i32")), 1000);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("i32.bin"));
  EXPECT_THAT(d.status().message(), HasSubstr("token id "));
  EXPECT_THAT(d.status().message(), HasSubstr(" at position "));
  // A negative int32 id is reported as negative.
  const TempDir tmp;
  std::string bin = Slurp(dir_->Join("i32.bin"));
  const int32_t minus = -3;
  std::memcpy(bin.data() + 8, &minus, 4);
  d = TokenDataset::Create(Indexed(Corrupt(tmp, "i32", Idx("i32"), bin)), 70000);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("token id -3 at position 2"));
  // Outside the roots.
  const TempDir root;
  absl::StatusOr<PathRoots> roots = PathRoots::Create({root.path()}, "data_roots");
  ASSERT_TRUE(roots.ok());
  DataAccess access;
  access.roots = &*roots;
  d = TokenDataset::Create(Indexed(dir_->Join("u16")), 1000, access);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied) << d.status();
  // Over the size limit, and cancelled.
  access.roots = nullptr;
  access.max_file_bytes = 100;
  d = TokenDataset::Create(Indexed(dir_->Join("u16")), 1000, access);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  access.max_file_bytes = int64_t{1} << 40;
  access.cancelled = [] { return true; };
  d = TokenDataset::Create(Indexed(dir_->Join("u16")), 1000, access);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kCancelled) << d.status();
}

}  // namespace
}  // namespace memprofd
