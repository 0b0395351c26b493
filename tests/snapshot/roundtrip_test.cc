// Save then load: identical tensors and names, single-file and sharded, every
// dtype option, tied and untied heads; checked also by an independent Python
// reader (check_snapshot.py).
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/files.h"
#include "core/common/json.h"
#include "core/common/phase.h"
#include "core/snapshot/carried_files.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/snapshot_store.h"
#include "core/snapshot/writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/snapshot/test_util.h"
#include "tests/testing/command.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace snapshot {
namespace {

using ::memprofd::testing::TempDir;
using testing::BitEqual;
using ::testing::HasSubstr;

const char kConfig[] =
    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "tie_word_embeddings": false,
  "torch_dtype": "float32"})";

at::ScalarType Out(at::ScalarType in, SnapshotDtype d) {
  if (!at::isFloatingType(in) || d == SnapshotDtype::kKeep) return in;
  return d == SnapshotDtype::kBFloat16  ? at::kBFloat16
         : d == SnapshotDtype::kFloat16 ? at::kHalf
                                        : at::kFloat;
}

// Writes expected.json and per-tensor float64 values for check_snapshot.py.
void WriteExpected(const std::string& dir, const TensorList& tensors, SnapshotDtype d,
                   const std::string& torch_dtype) {
  std::string json = "{\"tensors\": [";
  int i = 0;
  for (const auto& [name, t] : tensors) {
    const at::Tensor out = t.to(Out(t.scalar_type(), d));
    const std::string values = absl::StrCat(i, ".f64");
    const at::Tensor f64 = out.to(at::kDouble).contiguous();
    std::ofstream(dir + "/" + values, std::ios::binary)
        .write(static_cast<const char*>(f64.data_ptr()), f64.numel() * 8);
    std::string shape;
    for (const int64_t s : t.sizes())
      absl::StrAppend(&shape, shape.empty() ? "" : ",", s);
    absl::StrAppend(&json, i > 0 ? "," : "", "{\"name\": \"", name, "\", \"dtype\": \"",
                    *SafetensorsDtypeOf(out.scalar_type()), "\", \"shape\": [", shape,
                    "], \"values\": \"", values, "\"}");
    ++i;
  }
  json += "]";
  if (!torch_dtype.empty())
    absl::StrAppend(&json, ", \"torch_dtype\": \"", torch_dtype, "\"");
  json += "}";
  std::ofstream(dir + "/expected.json") << json;
}

void ExpectPythonAgrees(const std::string& snapshot_dir, const TensorList& written,
                        SnapshotDtype d, const std::string& torch_dtype = "") {
  TempDir expected;
  WriteExpected(expected.path(), written, d, torch_dtype);
  std::string output;
  EXPECT_EQ(::memprofd::testing::RunPython(
                {::memprofd::testing::SourcePath("tests/snapshot/check_snapshot.py"),
                 snapshot_dir, expected.path()},
                &output),
            0)
      << output;
  EXPECT_THAT(output, HasSubstr(absl::StrCat("OK ", written.size(), " tensors")));
}

void ExpectLoadedEqual(const std::string& dir, const TensorList& written,
                       SnapshotDtype d) {
  auto loaded = LoadSafetensorsDirectory(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->tensors.size(), written.size());
  std::map<std::string, at::Tensor> by_name(loaded->tensors.begin(),
                                            loaded->tensors.end());
  for (const auto& [name, t] : written) {
    ASSERT_EQ(by_name.count(name), 1u) << name;
    EXPECT_TRUE(BitEqual(t.to(Out(t.scalar_type(), d)), by_name.at(name))) << name;
  }
}

TEST(RoundTripTest, SingleFileKeepsEveryTensorBitForBit) {
  TempDir root;
  TensorList model = testing::MakeModel(1, 2, 16, 32);
  for (auto& [name, t] : model) t.requires_grad_(true);  // parameters
  SnapshotOptions options;
  std::vector<std::pair<int64_t, int64_t>> progress;
  auto m = SnapshotWriter(root.path())
               .Write("s1", model, kConfig, options, [&](int64_t done, int64_t total) {
                 progress.emplace_back(done, total);
                 EXPECT_EQ(CurrentPhase(), Phase::kSnapshot);
               });
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(testing::ListDir(root.path()), std::vector<std::string>{"s1"});
  EXPECT_EQ(testing::ListDir(root.Join("s1")),
            (std::vector<std::string>{"config.json", "memprofd_manifest.json",
                                      "model.safetensors"}));
  int64_t total = 0;
  for (const auto& [n, t] : model) total += t.numel() * 4;
  EXPECT_EQ(m->total_size, total);
  EXPECT_EQ(m->num_tensors, static_cast<int64_t>(model.size()));
  EXPECT_EQ(m->num_shards, 1);
  ASSERT_FALSE(progress.empty());
  EXPECT_EQ(progress.back(), std::make_pair(total, total));
  EXPECT_EQ(m->files[0].name, "model.safetensors");
  int64_t bytes = 0;
  for (const auto& f : m->files) bytes += f.bytes;
  EXPECT_EQ(m->bytes_written, bytes);
  EXPECT_GT(m->throughput_bytes_per_second, 0);
  ExpectLoadedEqual(root.Join("s1"), model, SnapshotDtype::kKeep);
  auto loaded = LoadSafetensorsDirectory(root.Join("s1"));
  EXPECT_EQ(loaded->config_json, kConfig);
  ExpectPythonAgrees(root.Join("s1"), model, SnapshotDtype::kKeep);
}

TEST(RoundTripTest, ShardedWritesIndexAndLoads) {
  TempDir root;
  const TensorList model = testing::MakeModel(2, 3, 16, 32);
  SnapshotOptions options;
  options.max_shard_size = 3000;  // each layer ~3 KB: several shards
  options.staging_bytes = 4096;   // and several chunks per tensor
  auto m = SnapshotWriter(root.path()).Write("sharded", model, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_GT(m->num_shards, 2);
  const auto files = testing::ListDir(root.Join("sharded"));
  EXPECT_THAT(files, ::testing::Contains("model.safetensors.index.json"));
  EXPECT_THAT(files, ::testing::Not(::testing::Contains("model.safetensors")));
  EXPECT_THAT(files,
              ::testing::Contains(ShardFileName(1, static_cast<int>(m->num_shards))));
  ExpectLoadedEqual(root.Join("sharded"), model, SnapshotDtype::kKeep);
  ExpectPythonAgrees(root.Join("sharded"), model, SnapshotDtype::kKeep);
}

class DtypeOptionTest : public ::testing::TestWithParam<SnapshotDtype> {};

TEST_P(DtypeOptionTest, ConvertsFloatsLikeTensorToAndKeepsTheRest) {
  TempDir root;
  TensorList tensors = testing::MakeAllDtypes(3);
  for (auto& t : testing::MakeModel(3, 1, 8, 16)) tensors.push_back(t);
  SnapshotOptions options;
  options.dtype = GetParam();
  options.staging_bytes = 4096;
  options.max_shard_size = 2000;
  auto m = SnapshotWriter(root.path()).Write("d", tensors, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->dtype, SnapshotDtypeName(GetParam()));
  ExpectLoadedEqual(root.Join("d"), tensors, GetParam());
  const char* torch_dtype = GetParam() == SnapshotDtype::kBFloat16  ? "bfloat16"
                            : GetParam() == SnapshotDtype::kFloat16 ? "float16"
                                                                    : "float32";
  ExpectPythonAgrees(root.Join("d"), tensors, GetParam(), torch_dtype);
}

INSTANTIATE_TEST_SUITE_P(AllOptions, DtypeOptionTest,
                         ::testing::Values(SnapshotDtype::kKeep, SnapshotDtype::kBFloat16,
                                           SnapshotDtype::kFloat16,
                                           SnapshotDtype::kFloat32),
                         [](const auto& info) {
                           return std::string(SnapshotDtypeName(info.param));
                         });

// The text of `dir`/`file`.
std::string ReadText(const std::string& dir, const std::string& file) {
  std::ifstream in(dir + "/" + file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

TEST(RoundTripTest, ConfigNamesTheDtypeOfTheTensorsWritten) {
  // A model loaded from a bfloat16 checkpoint trains in float32: kept as
  // it is, its config.json must say float32, or from_pretrained's default
  // rounds the trained weights to bfloat16.
  const std::string bf16_config =
      R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
          "dtype": "bfloat16", "eos_token_id": [1, 8, 9]})";
  TempDir root;
  const TensorList f32 = testing::MakeModel(2, 1, 8, 16);
  TensorList bf16;
  for (const auto& [name, t] : f32) bf16.emplace_back(name, t.to(at::kBFloat16));
  struct Case {
    const char* name;
    const TensorList* tensors;
    SnapshotDtype dtype;
    const char* label;
  };
  for (const Case& c : {Case{"keep-f32", &f32, SnapshotDtype::kKeep, "float32"},
                        Case{"keep-bf16", &bf16, SnapshotDtype::kKeep, "bfloat16"},
                        Case{"to-bf16", &f32, SnapshotDtype::kBFloat16, "bfloat16"},
                        Case{"to-f16", &bf16, SnapshotDtype::kFloat16, "float16"}}) {
    SnapshotOptions options;
    options.dtype = c.dtype;
    auto m = SnapshotWriter(root.path()).Write(c.name, *c.tensors, bf16_config, options);
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<Json> config = ParseJson(ReadText(root.Join(c.name), "config.json"));
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ((*config)["torch_dtype"], c.label) << c.name;
    EXPECT_EQ((*config)["dtype"], c.label) << c.name;
    EXPECT_EQ(DumpJson((*config)["eos_token_id"]), "[1,8,9]") << c.name;
  }
}

TEST(RoundTripTest, CarriedFilesAreWrittenAsTheyAreAndListedInTheManifest) {
  TempDir root;
  auto carried = std::make_shared<CarriedFiles>();
  carried->files.push_back({"tokenizer.json", std::string("{\"model\": 1}\0bytes", 18)});
  carried->files.push_back({"generation_config.json", "{\"eos_token_id\": 2}"});
  carried->skipped.push_back("vocab.json: a symbolic link");
  SnapshotOptions options;
  options.carried_files = carried;
  options.model_source = "/data/models/chat";
  const TensorList model = testing::MakeModel(1, 1, 8, 16);
  auto m = SnapshotWriter(root.path()).Write("carried", model, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const CarriedFile& f : carried->files) {
    EXPECT_EQ(ReadText(root.Join("carried"), f.name), f.bytes) << f.name;
  }
  EXPECT_THAT(m->carried_files,
              ::testing::ElementsAre("tokenizer.json", "generation_config.json"));
  EXPECT_THAT(m->carried_note, HasSubstr("copied from /data/models/chat"));
  EXPECT_THAT(m->carried_note, HasSubstr("vocab.json: a symbolic link"));
  // The manifest on disk says the same, and the store reads it back.
  absl::StatusOr<SnapshotManifest> stored = DescribeSnapshot(root.path(), "carried");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->carried_files, m->carried_files);
  EXPECT_EQ(stored->model_source, "/data/models/chat");
  EXPECT_EQ(stored->lora_base_fingerprint, "");  // not a LoRA model's

  // A LoRA model's snapshot records the base its adapters trained on.
  options.lora_base_fingerprint = "0123456789abcdef";
  m = SnapshotWriter(root.path()).Write("lora", model, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  stored = DescribeSnapshot(root.path(), "lora");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->lora_base_fingerprint, "0123456789abcdef");
  options.lora_base_fingerprint.clear();

  // A preset carries nothing and says why.
  options.carried_files = nullptr;
  options.model_source = "preset:tiny";
  m = SnapshotWriter(root.path()).Write("preset", model, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->carried_files.empty());
  EXPECT_THAT(m->carried_note, HasSubstr("preset"));

  // Only the names a snapshot carries: nothing else gets into the directory.
  auto bad = std::make_shared<CarriedFiles>();
  bad->files.push_back({"../escape.json", "{}"});
  options.carried_files = bad;
  m = SnapshotWriter(root.path()).Write("bad", model, kConfig, options);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_FALSE(std::filesystem::exists(root.Join("bad")));
  EXPECT_FALSE(std::filesystem::exists(root.path() + "/../escape.json"));
}

TEST(CarriedFilesTest, ReadsRegularFilesAndSaysWhyOthersWereLeft) {
  TempDir dir;
  TempDir outside;
  std::ofstream(dir.Join("tokenizer.json")) << "{\"version\": \"1.0\"}";
  std::ofstream(dir.Join("generation_config.json")) << "{}";
  std::ofstream(dir.Join("unrelated.txt")) << "not carried";
  // A link to a file outside the directory is never followed.
  std::ofstream(outside.Join("secret")) << "root:x:0:0";
  std::filesystem::create_symlink(outside.Join("secret"), dir.Join("vocab.json"));
  ASSERT_EQ(::mkfifo(dir.Join("merges.txt").c_str(), 0600), 0);
  const absl::StatusOr<CarriedFiles> read = ReadCarriedFiles(dir.path());
  ASSERT_TRUE(read.ok()) << read.status();
  const CarriedFiles& carried = *read;
  std::vector<std::string> names;
  for (const CarriedFile& f : carried.files) names.push_back(f.name);
  EXPECT_THAT(names, ::testing::ElementsAre("generation_config.json", "tokenizer.json"));
  EXPECT_EQ(carried.files[1].bytes, "{\"version\": \"1.0\"}");
  ASSERT_EQ(carried.skipped.size(), 2u);
  EXPECT_THAT(carried.skipped[0], ::testing::StartsWith("vocab.json: "));
  EXPECT_THAT(carried.skipped[1], ::testing::StartsWith("merges.txt: "));
  for (const std::string& why : carried.skipped) {
    EXPECT_THAT(why, ::testing::Not(HasSubstr("root:x")));
  }
}

TEST(RoundTripTest, TiedHeadWrittenOnceOnlyWhenTheFlagSaysSo) {
  TempDir root;
  TensorList model = testing::MakeModel(4, 1, 8, 16);
  // Tie: lm_head shares the embedding's storage.
  model.back().second = model.front().second;
  SnapshotOptions tied;
  tied.tie_word_embeddings = true;
  auto m = SnapshotWriter(root.path()).Write("tied", model, "", tied);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE(m->dropped_tied_lm_head);
  TensorList without_head(model.begin(), model.end() - 1);
  ExpectLoadedEqual(root.Join("tied"), without_head, SnapshotDtype::kKeep);
  ExpectPythonAgrees(root.Join("tied"), without_head, SnapshotDtype::kKeep);
  EXPECT_EQ(testing::ListDir(root.Join("tied")),
            (std::vector<std::string>{"memprofd_manifest.json", "model.safetensors"}));

  // Untied (the flag decides, not pointers): both written, as copies.
  auto u = SnapshotWriter(root.path()).Write("untied", model, "", SnapshotOptions());
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_FALSE(u->dropped_tied_lm_head);
  ExpectLoadedEqual(root.Join("untied"), model, SnapshotDtype::kKeep);
}

TEST(RoundTripTest, SnapshotOfMappedWeightsIsIdentical) {
  // "disk" placement: tensors that view a mapped snapshot are a valid source.
  TempDir root;
  const TensorList model = testing::MakeModel(5, 2, 16, 32);
  ASSERT_TRUE(SnapshotWriter(root.path()).Write("a", model, kConfig, {}).ok());
  auto mapped = LoadSafetensorsDirectory(root.Join("a"));
  ASSERT_TRUE(mapped.ok());
  SnapshotOptions options;
  options.staging_bytes = 4096;
  ASSERT_TRUE(SnapshotWriter(root.path())
                  .Write("b", mapped->tensors, mapped->config_json, options)
                  .ok());
  ExpectLoadedEqual(root.Join("b"), model, SnapshotDtype::kKeep);
}

TEST(AsyncSnapshotTest, HostCopiesAreIndependentOfTrainingAndReported) {
  TempDir root;
  TensorList model = testing::MakeModel(8, 2, 16, 32);
  TensorList before;
  for (const auto& [name, t] : model) before.emplace_back(name, t.clone());
  SnapshotOptions o;
  o.dtype = SnapshotDtype::kBFloat16;
  o.tie_word_embeddings = true;
  auto source = CopyForAsyncSnapshot(model, o);
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_EQ(source->tensors.size(), model.size() - 1);  // lm_head dropped
  int64_t bf16_bytes = 0;
  for (const auto& [name, t] : source->tensors) {
    EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    bf16_bytes += t.numel() * 2;
  }
  EXPECT_EQ(source->host_bytes, bf16_bytes);
  o.held_host_bytes = source->host_bytes;
  o.enter_snapshot_phase = false;  // the phase belongs to the owner thread
  absl::StatusOr<SnapshotManifest> m;
  std::atomic<bool> saw_snapshot_phase{false};
  std::thread writer([&] {
    m = SnapshotWriter(root.path())
            .Write("async", source->tensors, "", o, [&](int64_t, int64_t) {
              if (CurrentPhase() == Phase::kSnapshot) saw_snapshot_phase = true;
            });
  });
  for (auto& [name, t] : model) t.add_(1);  // training goes on
  writer.join();
  EXPECT_FALSE(saw_snapshot_phase);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->peak_extra_host_bytes, bf16_bytes);  // the copies, no staging
  before.pop_back();
  ExpectLoadedEqual(root.Join("async"), before, SnapshotDtype::kBFloat16);
}

TEST(LoaderTest, ResolvesSingleFileFirstAndChecksTheIndex) {
  TempDir root;
  const TensorList model = testing::MakeModel(6, 2, 8, 16);
  SnapshotOptions options;
  options.max_shard_size = 600;
  auto m = SnapshotWriter(root.path()).Write("s", model, kConfig, options);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GE(m->num_shards, 2);
  const std::string dir = root.Join("s");

  // A stale single file wins over the index, as in transformers.
  ASSERT_TRUE(
      WriteSafetensorsFile(dir + "/model.safetensors", {{"stale", at::ones({1})}}).ok());
  auto stale = LoadSafetensorsDirectory(dir);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_EQ(stale->tensors.size(), 1u);
  EXPECT_EQ(stale->tensors[0].first, "stale");
  std::filesystem::remove(dir + "/model.safetensors");
  ASSERT_TRUE(LoadSafetensorsDirectory(dir).ok());

  // Two indexes.
  std::filesystem::copy_file(dir + "/model.safetensors.index.json",
                             dir + "/other.safetensors.index.json");
  EXPECT_EQ(LoadSafetensorsDirectory(dir).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove(dir + "/other.safetensors.index.json");

  // A corrupt (truncated) shard: DATA_LOSS naming it.
  const std::string shard = dir + "/" + ShardFileName(2, static_cast<int>(m->num_shards));
  ASSERT_TRUE(std::filesystem::exists(shard));
  const auto size = std::filesystem::file_size(shard);
  std::filesystem::resize_file(shard, size - 1);
  auto s = LoadSafetensorsDirectory(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr(shard));

  // A missing shard.
  std::filesystem::remove(shard);
  s = LoadSafetensorsDirectory(dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("missing"));

  EXPECT_EQ(LoadSafetensorsDirectory(root.Join("none")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadSafetensorsDirectory(root.path()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(LoaderTest, IndexMustMatchTheShards) {
  TempDir root;
  const std::string dir = root.path();
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/a.safetensors", {{"x", at::ones({2})}}).ok());
  ASSERT_TRUE(WriteSafetensorsFile(dir + "/b.safetensors", {{"y", at::ones({2})}}).ok());
  auto write_index = [&](const std::string& map) {
    std::ofstream(dir + "/model.safetensors.index.json")
        << "{\"metadata\": {\"total_size\": 16}, \"weight_map\": {" << map << "}}";
  };
  write_index(R"("x": "a.safetensors", "y": "b.safetensors")");
  auto ok = LoadSafetensorsDirectory(dir);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->tensors.size(), 2u);
  EXPECT_EQ(ok->files, (std::vector<std::string>{"a.safetensors", "b.safetensors"}));
  write_index(R"("x": "a.safetensors", "y": "a.safetensors")");
  EXPECT_EQ(LoadSafetensorsDirectory(dir).status().code(), absl::StatusCode::kDataLoss);
  write_index(R"("x": "a.safetensors")");  // b not indexed: y unknown, fine; a ok
  EXPECT_TRUE(LoadSafetensorsDirectory(dir).ok());
  write_index(R"("x": "../a.safetensors")");
  EXPECT_EQ(LoadSafetensorsDirectory(dir).status().code(), absl::StatusCode::kDataLoss);
  write_index(R"("x": "a.safetensors", "x": "b.safetensors")");
  EXPECT_EQ(LoadSafetensorsDirectory(dir).status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(dir + "/model.safetensors.index.json") << "{not json";
  EXPECT_EQ(LoadSafetensorsDirectory(dir).status().code(), absl::StatusCode::kDataLoss);
}

// The model directory's one rule, with roots: a link that resolves inside
// them is followed (the Hugging Face cache's snapshots/<revision>/ files
// link into ../../blobs/), one that leads outside is PERMISSION_DENIED for
// every kind of file, and nothing of the outside file is read or sized.
TEST(LoaderTest, LinksAreFollowedInsideTheRootsOnly) {
  namespace fs = std::filesystem;
  TempDir root;
  TempDir outside;
  const TensorList model = testing::MakeModel(4, 1, 8, 16);
  SnapshotOptions options;
  ASSERT_TRUE(SnapshotWriter(outside.path()).Write("s", model, kConfig, options).ok());
  options.max_shard_size = 1000;
  ASSERT_TRUE(
      SnapshotWriter(outside.path()).Write("sharded", model, kConfig, options).ok());
  const std::string secret = outside.Join("secret");
  std::ofstream(secret) << "root:*:20000:0:99999:7:::\n";
  absl::StatusOr<PathRoots> roots = PathRoots::Create({root.path()}, "data_roots");
  ASSERT_TRUE(roots.ok()) << roots.status();

  // The Hugging Face cache layout, all inside the root.
  const std::string repo = root.Join("hub/models--org--tiny");
  fs::create_directories(repo + "/blobs");
  fs::create_directories(repo + "/snapshots/rev1");
  fs::copy_file(outside.Join("s/model.safetensors"), repo + "/blobs/aaa");
  fs::copy_file(outside.Join("s/config.json"), repo + "/blobs/bbb");
  std::ofstream(repo + "/blobs/ccc") << R"({"version": "1.0"})";
  fs::create_symlink("../../blobs/aaa", repo + "/snapshots/rev1/model.safetensors");
  fs::create_symlink("../../blobs/bbb", repo + "/snapshots/rev1/config.json");
  fs::create_symlink("../../blobs/ccc", repo + "/snapshots/rev1/tokenizer.json");
  absl::StatusOr<LoadedWeights> cached =
      LoadSafetensorsDirectory(repo + "/snapshots/rev1", &*roots);
  ASSERT_TRUE(cached.ok()) << cached.status();
  EXPECT_EQ(cached->tensors.size(), model.size());
  EXPECT_THAT(cached->config_json, HasSubstr("LlamaForCausalLM"));
  absl::StatusOr<CarriedFiles> carried =
      ReadCarriedFiles(repo + "/snapshots/rev1", &*roots);
  ASSERT_TRUE(carried.ok()) << carried.status();
  ASSERT_EQ(carried->files.size(), 1u);
  EXPECT_EQ(carried->files[0].bytes, R"({"version": "1.0"})");

  // Each kind of file linked outside: refused, and no byte or size of the
  // outside file in the message.
  const std::string secret_size = std::to_string(fs::file_size(secret));
  auto expect_denied = [&](const std::string& dir, const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied)
        << dir << ": " << status;
    EXPECT_THAT(status.message(), HasSubstr("outside"));
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("length prefix")));
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr("root:")));
    EXPECT_THAT(status.message(), ::testing::Not(HasSubstr(" " + secret_size + " ")));
  };
  auto make_dir = [&](const std::string& name) {
    const std::string dir = root.Join(name);
    fs::create_directories(dir);
    return dir;
  };
  const std::string weights_out = make_dir("weights-out");
  fs::copy_file(outside.Join("s/config.json"), weights_out + "/config.json");
  fs::create_symlink(outside.Join("s/model.safetensors"),
                     weights_out + "/model.safetensors");
  expect_denied(weights_out, LoadSafetensorsDirectory(weights_out, &*roots).status());
  // Without roots (the operator's own directory) the same link is followed.
  EXPECT_TRUE(LoadSafetensorsDirectory(weights_out).ok());

  const std::string shadow = make_dir("shadow");
  fs::create_symlink(secret, shadow + "/model.safetensors");
  expect_denied(shadow, LoadSafetensorsDirectory(shadow, &*roots).status());

  const std::string config_out = make_dir("config-out");
  fs::copy_file(outside.Join("s/model.safetensors"), config_out + "/model.safetensors");
  fs::create_symlink(outside.Join("s/config.json"), config_out + "/config.json");
  expect_denied(config_out, LoadSafetensorsDirectory(config_out, &*roots).status());

  const std::string index_out = make_dir("index-out");
  fs::create_symlink(secret, index_out + "/model.safetensors.index.json");
  expect_denied(index_out, LoadSafetensorsDirectory(index_out, &*roots).status());

  const std::string shard_out = make_dir("shard-out");
  for (const auto& entry : fs::directory_iterator(outside.Join("sharded"))) {
    const std::string name = entry.path().filename().string();
    if (absl::EndsWith(name, ".safetensors")) {
      fs::create_symlink(entry.path(), shard_out + "/" + name);
    } else {
      fs::copy_file(entry.path(), shard_out + "/" + name);
    }
  }
  expect_denied(shard_out, LoadSafetensorsDirectory(shard_out, &*roots).status());

  // A link that leads outside to nothing says no more than one that leads
  // to a file.
  const std::string dangling = make_dir("dangling");
  fs::create_symlink(outside.Join("no-such-file"), dangling + "/model.safetensors");
  expect_denied(dangling, LoadSafetensorsDirectory(dangling, &*roots).status());

  const std::string tokenizer_out = make_dir("tokenizer-out");
  fs::create_symlink(secret, tokenizer_out + "/tokenizer.json");
  expect_denied(tokenizer_out, ReadCarriedFiles(tokenizer_out, &*roots).status());
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
