#include "core/train/data.h"

#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/train/train_options.h"
#include "core/train/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::memprofd::testing::TempDir;
using ::testing::HasSubstr;

DataSpec File(DataSpec::Kind kind, const std::string& path, int bytes_per_token = 2) {
  DataSpec spec;
  spec.kind = kind;
  spec.path = path;
  spec.bytes_per_token = bytes_per_token;
  return spec;
}

TEST(TokenDatasetTest, EmbeddedCorpusIsEnglishProse) {
  absl::string_view corpus = EmbeddedCorpus();
  EXPECT_GT(corpus.size(), 20000u);
  EXPECT_THAT(std::string(corpus), HasSubstr("The Mill on the River"));
  for (char c : corpus) ASSERT_TRUE(c == '\n' || (c >= 32 && c < 127)) << int(c);
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(DataSpec{}, 256);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(), static_cast<int64_t>(corpus.size()));
  EXPECT_EQ((*d)->Window(0, 1).value()[0].item<int64_t>(), 'T');
}

TEST(TokenDatasetTest, AFileChangedUnderARunIsDataLossNotASignal) {
  // Mapped, a page past a truncation raised SIGBUS and killed the daemon;
  // read with pread, the batch that reaches past the end fails instead.
  const TempDir tmp;
  std::string ids;
  for (int i = 0; i < 4096; ++i) ids += std::string("\x07\x00", 2);
  const std::string path = tmp.WriteFile("tokens.bin", ids);
  absl::StatusOr<std::unique_ptr<TokenDataset>> d =
      TokenDataset::Create(File(DataSpec::Kind::kTokenFile, path, 2), 100);
  ASSERT_TRUE(d.ok()) << d.status();
  at::Generator generator = at::detail::createCPUGenerator(1);
  ASSERT_TRUE((*d)->NextBatch(8, 64, generator).ok());

  ASSERT_EQ(::truncate(path.c_str(), 16), 0);
  absl::StatusOr<TokenBatch> batch = (*d)->NextBatch(8, 64, generator);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss) << batch.status();
  EXPECT_THAT(batch.status().message(), HasSubstr("tokens.bin"));
  EXPECT_THAT(batch.status().message(), HasSubstr("shrank or was replaced"));
  EXPECT_EQ((*d)->Window(100, 10).status().code(), absl::StatusCode::kDataLoss);

  // Rewritten in place with ids the model has no embedding for: the batch
  // fails naming the file, not an index error deep inside the forward.
  std::string bad;
  for (int i = 0; i < 4096; ++i) bad += std::string("\xff\x7f", 2);
  tmp.WriteFile("tokens.bin", bad);
  batch = (*d)->NextBatch(8, 64, generator);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kDataLoss) << batch.status();
  EXPECT_THAT(batch.status().message(), HasSubstr("token id 32767"));
  EXPECT_THAT(batch.status().message(), HasSubstr("rewritten since"));
}

TEST(TokenDatasetTest, TextFileIsReadAsBytes) {
  const TempDir tmp;
  std::string path = tmp.WriteFile("bytes.txt", std::string("ab\xff\n", 4));
  absl::StatusOr<std::unique_ptr<TokenDataset>> d =
      TokenDataset::Create(File(DataSpec::Kind::kTextFile, path), 256);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(torch::equal((*d)->Window(0, (*d)->size()).value(),
                           torch::tensor({97, 98, 255, 10}, torch::kInt64)));
  // Byte 255 does not fit a vocabulary of 200.
  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, path), 200);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("token id 255 at position 2"));
}

TEST(TokenDatasetTest, TokenFilesAreLittleEndianUint16OrUint32) {
  const TempDir tmp;
  std::string u16 = tmp.WriteFile("u16.bin", std::string("\x01\x00\x34\x12\xff\x00", 6));
  absl::StatusOr<std::unique_ptr<TokenDataset>> d =
      TokenDataset::Create(File(DataSpec::Kind::kTokenFile, u16, 2), 0x10000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(torch::equal((*d)->Window(0, (*d)->size()).value(),
                           torch::tensor({1, 0x1234, 255}, torch::kInt64)));

  std::string u32 =
      tmp.WriteFile("u32.bin", std::string("\x01\x00\x01\x00\x02\x00\x00\x00", 8));
  d = TokenDataset::Create(File(DataSpec::Kind::kTokenFile, u32, 4), 70000);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(torch::equal((*d)->Window(0, (*d)->size()).value(),
                           torch::tensor({65537, 2}, torch::kInt64)));

  d = TokenDataset::Create(File(DataSpec::Kind::kTokenFile, u32, 4), 1000);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("token id 65537 at position 0"));
  EXPECT_THAT(d.status().message(), HasSubstr("[0, 1000)"));

  // 6 bytes are not whole uint32 tokens.
  d = TokenDataset::Create(File(DataSpec::Kind::kTokenFile, u16, 4), 1000);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("not a multiple of 4"));

  d = TokenDataset::Create(File(DataSpec::Kind::kTokenFile, u16, 3), 1000);
  EXPECT_THAT(d.status().message(), HasSubstr("bytes_per_token must be 2"));
}

TEST(TokenDatasetTest, MissingAndEmptyFilesAreInvalidArgument) {
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(
      File(DataSpec::Kind::kTextFile, "/nonexistent/corpus.txt"), 256);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("/nonexistent/corpus.txt"));
  EXPECT_THAT(d.status().message(), HasSubstr("does not exist"));

  const TempDir tmp;
  std::string empty = tmp.WriteFile("empty.txt", "");
  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, empty), 256);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("is empty"));

  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, ""), 256);
  EXPECT_THAT(d.status().message(), HasSubstr("no path"));
}

TEST(TokenDatasetTest, FilesThatWouldBlockOrAreNotRegularAreRefusedAtOnce) {
  const TempDir tmp;
  const std::string fifo = tmp.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO for reading would wait for a writer: this returns at once.
  for (const auto& [path, why] : std::vector<std::pair<std::string, std::string>>{
           {fifo, "is a FIFO"},
           {tmp.path(), "is a directory"},
           {"/dev/zero", "is a device"},
           {"/proc/self/status", "has no size"}}) {
    absl::StatusOr<std::unique_ptr<TokenDataset>> d =
        TokenDataset::Create(File(DataSpec::Kind::kTextFile, path), 256);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(d.status().message(), HasSubstr(why)) << path;
  }
  DataAccess small;
  small.max_file_bytes = 3;
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(
      File(DataSpec::Kind::kTextFile, tmp.WriteFile("four.txt", "abcd")), 256, small);
  EXPECT_THAT(d.status().message(),
              HasSubstr("has 4 bytes, over the daemon's limit of 3"));
}

TEST(TokenDatasetTest, ClientPathsStayInsideTheRootsAfterLinks) {
  const TempDir tmp;
  const std::string root = tmp.path() + "/root";
  ASSERT_TRUE(std::filesystem::create_directory(root));
  const std::string inside = tmp.WriteFile("root/in.txt", "hello world");
  const std::string outside = tmp.WriteFile("secret.txt", "secret");
  std::filesystem::create_symlink(outside, root + "/link.txt");
  absl::StatusOr<PathRoots> roots = PathRoots::Create({root}, "data_roots");
  ASSERT_TRUE(roots.ok()) << roots.status();
  DataAccess access;
  access.roots = &*roots;
  absl::StatusOr<std::unique_ptr<TokenDataset>> d =
      TokenDataset::Create(File(DataSpec::Kind::kTextFile, inside), 256, access);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(), 11);
  for (const std::string& path :
       {outside, root + "/link.txt", root + "/../secret.txt", std::string("/etc/passwd"),
        std::string("/nonexistent/x")}) {
    d = TokenDataset::Create(File(DataSpec::Kind::kTokenFile, path), 256, access);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied) << path;
    EXPECT_THAT(d.status().message(), HasSubstr(root)) << path;
    EXPECT_THAT(d.status().message(), ::testing::Not(HasSubstr("secret\""))) << path;
  }
  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, root + "/missing.txt"), 256,
                           access);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("does not exist"));
  d = TokenDataset::Create(
      File(DataSpec::Kind::kTextFile, inside + std::string("\0x", 2)), 256, access);
  EXPECT_THAT(d.status().message(), HasSubstr("NUL byte"));
  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, "in.txt"), 256, access);
  EXPECT_THAT(d.status().message(), HasSubstr("is relative"));
  const PathRoots none;
  access.roots = &none;
  d = TokenDataset::Create(File(DataSpec::Kind::kTextFile, inside), 256, access);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(d.status().message(), HasSubstr("no data_roots is set"));
}

TEST(TokenDatasetTest, AMappedFileDrawsTheBatchesTheSameTokensInMemoryWould) {
  const TempDir tmp;
  std::string bytes;
  DataSpec inline_spec;
  inline_spec.kind = DataSpec::Kind::kInlineTokens;
  for (int i = 0; i < 3000; ++i) {
    const int id = (i * 7919) % 50000;
    bytes.push_back(static_cast<char>(id & 0xff));
    bytes.push_back(static_cast<char>(id >> 8));
    inline_spec.tokens.push_back(id);
  }
  absl::StatusOr<std::unique_ptr<TokenDataset>> mapped = TokenDataset::Create(
      File(DataSpec::Kind::kTokenFile, tmp.WriteFile("t.bin", bytes), 2), 50000);
  absl::StatusOr<std::unique_ptr<TokenDataset>> held =
      TokenDataset::Create(inline_spec, 50000);
  ASSERT_TRUE(mapped.ok() && held.ok());
  at::Generator a = MakeDataGenerator(7);
  at::Generator b = MakeDataGenerator(7);
  for (int step = 0; step < 3; ++step) {
    absl::StatusOr<TokenBatch> x = (*mapped)->NextBatch(4, 32, a);
    absl::StatusOr<TokenBatch> y = (*held)->NextBatch(4, 32, b);
    ASSERT_TRUE(x.ok() && y.ok());
    EXPECT_TRUE(torch::equal(x->inputs, y->inputs));
    EXPECT_TRUE(torch::equal(x->targets, y->targets));
  }
  EXPECT_TRUE(
      torch::equal((*mapped)->Window(100, 50).value(), (*held)->Window(100, 50).value()));
  // A cancelled check stops.
  DataAccess access;
  access.cancelled = [] { return true; };
  EXPECT_EQ(TokenDataset::Create(
                File(DataSpec::Kind::kTokenFile, tmp.path() + "/t.bin", 2), 50000, access)
                .status()
                .code(),
            absl::StatusCode::kCancelled);
}

TEST(TokenDatasetTest, InlineTokensAreCheckedAgainstTheVocabulary) {
  DataSpec spec;
  spec.kind = DataSpec::Kind::kInlineTokens;
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(spec, 256);
  EXPECT_THAT(d.status().message(), HasSubstr("empty"));
  spec.tokens = {1, 2, 3, int64_t{1} << 40, 4};
  d = TokenDataset::Create(spec, 256);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("token id 1099511627776 at position 3"));
  spec.tokens = {1, -2};
  d = TokenDataset::Create(spec, 256);
  EXPECT_THAT(d.status().message(), HasSubstr("token id -2 at position 1"));
  spec.tokens = {1, 2, 255};
  d = TokenDataset::Create(spec, 256);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->size(), 3);
}

TEST(TokenDatasetTest, TooFewTokensForTheSequenceLength) {
  DataSpec spec;
  spec.kind = DataSpec::Kind::kInlineTokens;
  spec.tokens = {1, 2, 3, 4};
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(spec, 256);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE((*d)->Validate(3).ok());
  absl::Status s = (*d)->Validate(4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("holds 4 tokens, fewer than seq_len + 1 = 5"));
  at::Generator gen = MakeDataGenerator(1);
  EXPECT_EQ((*d)->NextBatch(2, 4, gen).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TokenDatasetTest, BatchesAreShiftedContiguousWindowsFromTheSeed) {
  DataSpec spec;
  spec.kind = DataSpec::Kind::kInlineTokens;
  for (int i = 0; i < 200; ++i) spec.tokens.push_back(i);
  absl::StatusOr<std::unique_ptr<TokenDataset>> d = TokenDataset::Create(spec, 256);
  ASSERT_TRUE(d.ok());
  at::Generator a = MakeDataGenerator(42);
  at::Generator b = MakeDataGenerator(42);
  absl::StatusOr<TokenBatch> x = (*d)->NextBatch(5, 16, a);
  absl::StatusOr<TokenBatch> y = (*d)->NextBatch(5, 16, b);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->inputs.sizes(), (std::vector<int64_t>{5, 16}));
  EXPECT_EQ(x->inputs.scalar_type(), torch::kInt64);
  EXPECT_TRUE(torch::equal(x->inputs, y->inputs));
  EXPECT_TRUE(torch::equal(x->targets, x->inputs + 1));  // ids == positions here
  EXPECT_TRUE(torch::equal(x->inputs.select(1, 15) - x->inputs.select(1, 0),
                           torch::full({5}, 15, torch::kInt64)));
  EXPECT_LE(x->targets.max().item<int64_t>(), 199);
  absl::StatusOr<TokenBatch> next = (*d)->NextBatch(5, 16, a);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(torch::equal(next->inputs, x->inputs));
}

TEST(TrainOptionsTest, ValidationNamesTheField) {
  struct Case {
    void (*mutate)(TrainOptions&);
    const char* message;
  } cases[] = {
      {[](TrainOptions& o) { o.steps = 0; }, "steps must be at least 1"},
      {[](TrainOptions& o) { o.batch_size = -1; }, "batch_size must be at least 1"},
      {[](TrainOptions& o) { o.seq_len = 0; }, "seq_len must be at least 1"},
      {[](TrainOptions& o) { o.seq_len = 513; },
       "exceeds the model's max_position_embeddings"},
      {[](TrainOptions& o) { o.grad_accumulation_steps = 0; }, "grad_accumulation_steps"},
      {[](TrainOptions& o) { o.learning_rate = 0; }, "learning_rate"},
      {[](TrainOptions& o) { o.beta2 = 1.0; }, "beta2 must be in [0, 1)"},
      {[](TrainOptions& o) { o.adam_eps = 0; }, "adam_eps must be a finite number > 0"},
      {[](TrainOptions& o) { o.weight_decay = -0.1; }, "weight_decay"},
      {[](TrainOptions& o) { o.max_grad_norm = -1; }, "max_grad_norm"},
      {[](TrainOptions& o) { o.data.kind = DataSpec::Kind::kTextFile; }, "no path"},
  };
  EXPECT_TRUE(ValidateTrainOptions(TrainOptions{}, 512).ok());
  for (const Case& c : cases) {
    TrainOptions o;
    c.mutate(o);
    absl::Status s = ValidateTrainOptions(o, 512);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(TrainOptionsTest, MergeFillsOnlyWhatTheRequestLeavesUnset) {
  TrainOverrides request;
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), request, 512).status().message(),
              HasSubstr("steps: required"));
  request.steps = 3;
  request.batch_size = 2;
  request.adam_eps = 1e-6;
  request.gradient_checkpointing = true;
  absl::StatusOr<TrainOptions> merged = MergeTrainOverrides(TrainOptions(), request, 512);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->steps, 3);
  EXPECT_EQ(merged->batch_size, 2);
  EXPECT_EQ(merged->adam_eps, 1e-6);
  EXPECT_TRUE(merged->gradient_checkpointing);
  // Unset: the defaults.
  const TrainOptions defaults;
  EXPECT_EQ(merged->seq_len, defaults.seq_len);
  EXPECT_EQ(merged->learning_rate, defaults.learning_rate);
  EXPECT_EQ(merged->beta1, defaults.beta1);
  EXPECT_EQ(merged->grad_accumulation_steps, defaults.grad_accumulation_steps);
  // A set zero is a value, validated as such.
  request.grad_accumulation_steps = 0;
  EXPECT_THAT(MergeTrainOverrides(TrainOptions(), request, 512).status().message(),
              HasSubstr("grad_accumulation_steps must be at least 1"));
}

}  // namespace
}  // namespace memprofd
