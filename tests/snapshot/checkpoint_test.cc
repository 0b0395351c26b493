// Checkpoints: the weights plus the optimizer files and trainer_state.json,
// written by the same atomic writer and read back by LoadCheckpointFiles
// bit for bit, sharded like the model; what a weights-only directory or a
// damaged file gives.

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/flat_shard.h"
#include "core/snapshot/checkpoint_files.h"
#include "core/snapshot/loader.h"
#include "core/snapshot/shard_plan.h"
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
using testing::BitEqual;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const char kConfig[] =
    R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 16, "tie_word_embeddings": false,
  "torch_dtype": "float32"})";

// Moments shaped as the weights and a float32 step each, as the trainer
// names them.
CheckpointPayload MakePayload(const TensorList& weights) {
  CheckpointPayload p;
  at::manual_seed(4);
  for (const auto& [name, w] : weights) {
    p.optimizer_tensors.emplace_back(name + ".exp_avg", at::randn(w.sizes()));
    p.optimizer_tensors.emplace_back(name + ".exp_avg_sq", at::rand(w.sizes()));
    p.optimizer_tensors.emplace_back(name + ".step", at::full({}, 7.0f));
  }
  p.optimizer_metadata = {{"optimizer", "AdamW"}, {"group.decay.lr", "0.001"}};
  p.trainer_state_json = "{\"global_step\": 7}\n";
  return p;
}

TEST(CheckpointFilesTest,
     WritesOptimizerAndTrainerStateBesideTheWeightsAndReadsThemBack) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 2, 16, 64);
  const CheckpointPayload payload = MakePayload(model);
  SnapshotOptions options;
  options.global_step = 7;
  absl::StatusOr<SnapshotManifest> m =
      SnapshotWriter(root.path()).WriteCheckpoint("ck", model, kConfig, payload, options);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kind, "checkpoint");
  EXPECT_TRUE(m->is_checkpoint());
  std::vector<std::string> files;
  for (const SnapshotFile& f : m->files) files.push_back(f.name);
  EXPECT_THAT(files, ElementsAre("model.safetensors", "config.json",
                                 "optimizer.safetensors", "trainer_state.json"));
  int64_t opt_bytes = 0;
  for (const auto& [n, t] : payload.optimizer_tensors) opt_bytes += t.nbytes();
  EXPECT_EQ(m->optimizer_bytes, opt_bytes);
  EXPECT_EQ(m->num_tensors,
            static_cast<int64_t>(model.size() + payload.optimizer_tensors.size()));

  // The store reads the kind back; the weights load as before.
  absl::StatusOr<SnapshotManifest> described = DescribeSnapshot(root.path(), "ck");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->kind, "checkpoint");
  EXPECT_EQ(described->optimizer_bytes, opt_bytes);
  absl::StatusOr<LoadedWeights> weights = LoadSafetensorsDirectory(m->directory);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensors.size(), model.size());

  absl::StatusOr<LoadedCheckpoint> back = LoadCheckpointFiles(m->directory);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->trainer_state_json, payload.trainer_state_json);
  EXPECT_EQ(back->optimizer_metadata.at("optimizer"), "AdamW");
  EXPECT_EQ(back->optimizer_metadata.at("group.decay.lr"), "0.001");
  EXPECT_EQ(back->optimizer_metadata.count("format"), 0u);
  std::map<std::string, at::Tensor> read(back->optimizer_tensors.begin(),
                                         back->optimizer_tensors.end());
  ASSERT_EQ(read.size(), payload.optimizer_tensors.size());
  for (const auto& [name, t] : payload.optimizer_tensors) {
    ASSERT_EQ(read.count(name), 1u) << name;
    EXPECT_TRUE(BitEqual(t, read.at(name))) << name;
  }
}

TEST(CheckpointFilesTest, OptimizerShardsLikeTheModelWithItsOwnIndex) {
  TempDir root;
  const TensorList model = testing::MakeModel(2, 3, 32, 128);
  SnapshotOptions options;
  options.max_shard_size = 20000;
  const CheckpointPayload payload = MakePayload(model);
  absl::StatusOr<SnapshotManifest> m =
      SnapshotWriter(root.path()).WriteCheckpoint("ck", model, kConfig, payload, options);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<std::string> listing = testing::ListDir(m->directory);
  int optimizer_shards = 0, indexes = 0;
  for (const std::string& f : listing) {
    optimizer_shards += f.rfind("optimizer-0000", 0) == 0;
    indexes += f.size() > 23 && f.substr(f.size() - 23) == ".safetensors.index.json";
  }
  EXPECT_GT(optimizer_shards, 1);
  EXPECT_EQ(indexes, 1);  // only the model's: transformers and accelerate want one
  EXPECT_THAT(listing, ::testing::Contains("optimizer.index.json"));
  EXPECT_THAT(listing, ::testing::Not(::testing::Contains("optimizer.safetensors")));
  absl::StatusOr<LoadedCheckpoint> back = LoadCheckpointFiles(m->directory);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->optimizer_tensors.size(), payload.optimizer_tensors.size());
  ASSERT_TRUE(LoadSafetensorsDirectory(m->directory).ok());

  // A shard gone: DATA_LOSS naming it.
  std::filesystem::remove(m->directory + "/" +
                          ShardFileName(1, optimizer_shards, kOptimizerFilePrefix));
  back = LoadCheckpointFiles(m->directory);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << back.status();
  EXPECT_THAT(back.status().message(), HasSubstr("optimizer-00001-of-"));
}

TEST(CheckpointFilesTest, WeightsOnlyDirectoriesAndDamagedFilesAreRefused) {
  TempDir root;
  const TensorList model = testing::MakeModel(3, 1, 16, 64);
  SnapshotWriter writer(root.path());
  absl::StatusOr<SnapshotManifest> w =
      writer.Write("w", model, kConfig, SnapshotOptions());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->kind, "weights");
  absl::StatusOr<LoadedCheckpoint> r = LoadCheckpointFiles(w->directory);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("trainer_state.json and optimizer.safetensors"));

  const CheckpointPayload payload = MakePayload(model);
  absl::StatusOr<SnapshotManifest> c =
      writer.WriteCheckpoint("c", model, kConfig, payload, SnapshotOptions());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string opt = c->directory + "/optimizer.safetensors";
  std::filesystem::resize_file(opt, std::filesystem::file_size(opt) - 3);
  r = LoadCheckpointFiles(c->directory);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("optimizer.safetensors"));

  // A converting dtype, and an optimizer name that is a weight's.
  SnapshotOptions bf16;
  bf16.dtype = SnapshotDtype::kBFloat16;
  absl::StatusOr<SnapshotManifest> bad =
      writer.WriteCheckpoint("bf16", model, kConfig, payload, bf16);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("dtype keep"));
  bf16.kind = SnapshotKind::kCheckpoint;
  EXPECT_EQ(CheckCheckpointDtype(bf16).code(), absl::StatusCode::kInvalidArgument);
  bf16.dtype = SnapshotDtype::kFloat32;
  EXPECT_TRUE(CheckCheckpointDtype(bf16).ok());
  CheckpointPayload clash = payload;
  clash.optimizer_tensors.emplace_back(model[0].first, model[0].second);
  bad = writer.WriteCheckpoint("clash", model, kConfig, clash, SnapshotOptions());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  // Neither left anything behind.
  EXPECT_EQ(testing::ListDir(root.path()), (std::vector<std::string>{"c", "w"}));
}

// `whole`'s optimizer tensors cut into the flat pieces of `world` ranks
// (core/common/flat_shard.h), as each rank of a sharded run holds them: each
// moment's piece 1-D, the step on every rank with a piece.
std::vector<TensorList> Pieces(const TensorList& whole, int world) {
  std::vector<TensorList> ranks(static_cast<size_t>(world));
  for (const auto& [name, t] : whole) {
    const std::string param = name.substr(0, name.rfind('.'));
    int64_t numel = 0;
    for (const auto& [n, m] : whole) {
      if (n == param + ".exp_avg") numel = m.numel();
    }
    for (int r = 0; r < world; ++r) {
      const FlatChunk piece = ChunkOf(numel, r, world);
      if (piece.length == 0) continue;
      ranks[r].emplace_back(
          name, absl::EndsWith(name, ".step")
                    ? t
                    : t.reshape({-1}).narrow(0, piece.begin, piece.length).clone());
    }
  }
  return ranks;
}

OptimizerShardingDescription Describe(const TensorList& model, int world) {
  OptimizerShardingDescription sharding;
  sharding.world_size = world;
  sharding.level = "optimizer";
  for (const auto& [name, t] : model)
    sharding.parameters.emplace_back(name, t.sizes().vec());
  return sharding;
}

// A sharded run's checkpoint (3 ranks, so that pieces differ in size): ranks
// 1 and 2 write their files beside the checkpoint, rank 0's writer moves
// them in with its own and the description, and the reader assembles the
// whole state from the three, each tensor bit for bit.
// The checkpoint "ck" in `root` of a run of `world` ranks with its
// optimizer state sharded: ranks 1.. write their files beside it
// (`root`/.tmp-ck-ranks), rank 0's writer moves them in with its own.
absl::StatusOr<SnapshotManifest> WriteShardedCheckpoint(const std::string& root,
                                                        const TensorList& model,
                                                        const CheckpointPayload& whole,
                                                        int world) {
  const std::vector<TensorList> pieces = Pieces(whole.optimizer_tensors, world);
  CheckpointPayload rank0 = whole;
  rank0.optimizer_tensors = pieces[0];
  const std::string side = root + "/.tmp-ck-ranks";
  std::filesystem::create_directories(side);
  for (int r = 1; r < world; ++r) {
    absl::StatusOr<int64_t> written = WriteRankOptimizerFile(
        side, r, world, pieces[r], whole.optimizer_metadata, 1 << 20);
    if (!written.ok()) return written.status();
  }
  rank0.sharding = Describe(model, world);
  rank0.other_ranks_dir = side;
  return SnapshotWriter(root).WriteCheckpoint("ck", model, kConfig, rank0, {});
}

TEST(CheckpointFilesTest, ShardedOptimizerStateIsOneFilePerRankAssembledOnRead) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 2, 16, 64);
  const CheckpointPayload whole = MakePayload(model);
  const OptimizerShardingDescription sharding = Describe(model, 3);
  for (const TensorList& piece : Pieces(whole.optimizer_tensors, 3))
    ASSERT_FALSE(piece.empty());
  absl::StatusOr<SnapshotManifest> m =
      WriteShardedCheckpoint(root.path(), model, whole, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string side = root.path() + "/.tmp-ck-ranks";
  std::vector<std::string> files;
  for (const SnapshotFile& f : m->files) files.push_back(f.name);
  EXPECT_THAT(files, ElementsAre("model.safetensors", "config.json",
                                 "optimizer-rank-00000-of-00003.safetensors",
                                 "optimizer-rank-00001-of-00003.safetensors",
                                 "optimizer-rank-00002-of-00003.safetensors",
                                 "optimizer_sharding.json", "trainer_state.json"));
  EXPECT_TRUE(std::filesystem::is_empty(side));
  // The model part loads as a Hugging Face directory, as before.
  absl::StatusOr<LoadedWeights> weights = LoadSafetensorsDirectory(m->directory);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_EQ(weights->tensors.size(), model.size());

  absl::StatusOr<LoadedCheckpoint> back = LoadCheckpointFiles(m->directory);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->sharding.has_value());
  EXPECT_EQ(back->sharding->world_size, 3);
  EXPECT_EQ(back->sharding->level, "optimizer");
  EXPECT_EQ(back->sharding->parameters, sharding.parameters);
  EXPECT_EQ(back->optimizer_metadata.at("optimizer"), "AdamW");
  std::map<std::string, at::Tensor> read(back->optimizer_tensors.begin(),
                                         back->optimizer_tensors.end());
  ASSERT_EQ(read.size(), whole.optimizer_tensors.size());
  for (const auto& [name, t] : whole.optimizer_tensors) {
    ASSERT_EQ(read.count(name), 1u) << name;
    EXPECT_TRUE(BitEqual(t, read.at(name))) << name;
  }

  // A rank file gone is DATA_LOSS naming the rank.
  std::filesystem::remove(m->directory + "/optimizer-rank-00001-of-00003.safetensors");
  absl::StatusOr<LoadedCheckpoint> partial = LoadCheckpointFiles(m->directory);
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(partial.status().message(), HasSubstr("rank 1's optimizer file"));
}

// A rank of a run at another world size reads a sharded checkpoint into its
// own flat piece alone: each moment 1-D, the piece's length, equal to the
// whole state's elements there, cut from the old ranks' pieces that overlap
// it (3 ranks written; read at 1 to 5 ranks, pieces that straddle the old
// ones' bounds included); the step counts stay whole.
TEST(CheckpointFilesTest, ShardedOptimizerStateIsReadIntoAnyRanksPieceAlone) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 2, 16, 64);
  const CheckpointPayload whole = MakePayload(model);
  absl::StatusOr<SnapshotManifest> m =
      WriteShardedCheckpoint(root.path(), model, whole, 3);
  ASSERT_TRUE(m.ok()) << m.status();
  for (int world = 1; world <= 5; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", world));
      const FlatShardSpec spec{rank, world};
      absl::StatusOr<LoadedCheckpoint> back =
          LoadCheckpointFiles(m->directory, nullptr, &spec);
      ASSERT_TRUE(back.ok()) << back.status();
      ASSERT_TRUE(back->pieces_of.has_value());
      EXPECT_EQ(back->pieces_of->rank, rank);
      EXPECT_EQ(back->pieces_of->world_size, world);
      std::map<std::string, at::Tensor> read(back->optimizer_tensors.begin(),
                                             back->optimizer_tensors.end());
      ASSERT_EQ(read.size(), whole.optimizer_tensors.size());
      for (const auto& [name, t] : whole.optimizer_tensors) {
        ASSERT_EQ(read.count(name), 1u) << name;
        if (absl::EndsWith(name, ".step")) {
          EXPECT_TRUE(BitEqual(t, read.at(name))) << name;
          continue;
        }
        const FlatChunk piece = ChunkOf(t.numel(), rank, world);
        EXPECT_TRUE(
            BitEqual(t.reshape({-1}).narrow(0, piece.begin, piece.length), read.at(name)))
            << name;
      }
    }
  }
}

// Rank 0 never publishes a checkpoint without every rank's file; pieces that
// do not fit the description, or a piece missing, are refused; and a
// description of an earlier layout is refused as such.
TEST(CheckpointFilesTest, ShardedCheckpointNeedsEveryRanksFileAndMatchingPieces) {
  TempDir root;
  const TensorList model = testing::MakeModel(1, 2, 16, 64);
  CheckpointPayload rank0 = MakePayload(model);  // whole tensors: not pieces
  const OptimizerShardingDescription sharding = Describe(model, 3);
  rank0.sharding = sharding;
  rank0.other_ranks_dir = root.path() + "/.tmp-ck-ranks";
  std::filesystem::create_directories(rank0.other_ranks_dir);
  ASSERT_TRUE(WriteRankOptimizerFile(rank0.other_ranks_dir, 1, 3, {}, {}, 1 << 20).ok());
  absl::StatusOr<SnapshotManifest> m =
      SnapshotWriter(root.path()).WriteCheckpoint("ck", model, kConfig, rank0, {});
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("rank 2's optimizer file"));
  EXPECT_FALSE(std::filesystem::exists(root.path() + "/ck"));

  // Every file there, but rank 0's holds whole tensors.
  ASSERT_TRUE(WriteRankOptimizerFile(rank0.other_ranks_dir, 1, 3, {}, {}, 1 << 20).ok());
  ASSERT_TRUE(WriteRankOptimizerFile(rank0.other_ranks_dir, 2, 3, {}, {}, 1 << 20).ok());
  m = SnapshotWriter(root.path()).WriteCheckpoint("ck", model, kConfig, rank0, {});
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<LoadedCheckpoint> back = LoadCheckpointFiles(m->directory);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(back.status().message(), HasSubstr("has a piece of"));

  // Rank 0's pieces right, the others' missing.
  rank0.optimizer_tensors = Pieces(rank0.optimizer_tensors, 3)[0];
  ASSERT_TRUE(WriteRankOptimizerFile(rank0.other_ranks_dir, 1, 3, {}, {}, 1 << 20).ok());
  ASSERT_TRUE(WriteRankOptimizerFile(rank0.other_ranks_dir, 2, 3, {}, {}, 1 << 20).ok());
  m = SnapshotWriter(root.path()).WriteCheckpoint("ck2", model, kConfig, rank0, {});
  ASSERT_TRUE(m.ok()) << m.status();
  back = LoadCheckpointFiles(m->directory);
  EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(back.status().message(), HasSubstr("lacks rank 1's piece"));

  // The description's reader names what is wrong.
  EXPECT_EQ(OptimizerShardingFromJson("{}", "x").status().code(),
            absl::StatusCode::kDataLoss);
  const absl::StatusOr<OptimizerShardingDescription> old = OptimizerShardingFromJson(
      R"({"format": "memprofd-optimizer-sharding", "world_size": 2, "level": "optimizer",
          "owners": [{"parameter": "w", "rank": 1}]})",
      "x");
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(old.status().message(), HasSubstr("whole parameters per rank"));
  absl::StatusOr<OptimizerShardingDescription> parsed =
      OptimizerShardingFromJson(OptimizerShardingToJson(sharding), "x");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->parameters, sharding.parameters);
  EXPECT_EQ(RankOptimizerFileName(1, 3), "optimizer-rank-00001-of-00003.safetensors");
}

}  // namespace
}  // namespace snapshot
}  // namespace memprofd
