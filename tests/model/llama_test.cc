#include "core/model/llama.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/command.h"
#include "tests/testing/llama.h"
#include "tests/testing/temp_dir.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;
using testing::MakeLlama;

// SmallLlamaConfig with what the equations must be checked on: a vocab that
// is not the byte range, head_dim 16, a non-default eps and rotary base, and
// an untied head.
LlamaConfig SmallGqaConfig() {
  LlamaConfig c = testing::SmallLlamaConfig();
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 500.0;
  c.tie_word_embeddings = false;
  return c;
}

std::vector<std::string> ParameterNames(const LlamaModel& m) {
  std::vector<std::string> names;
  for (const auto& [name, t] : m.NamedParameters()) names.push_back(name);
  return names;
}

TEST(LlamaModelTest, ParameterNamesMatchTransformers) {
  LlamaConfig c = SmallGqaConfig();
  c.num_hidden_layers = 1;
  std::unique_ptr<LlamaModel> m = MakeLlama(c, 1);
  EXPECT_THAT(
      ParameterNames(*m),
      ::testing::ElementsAre(
          "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
          "model.layers.0.self_attn.k_proj.weight",
          "model.layers.0.self_attn.v_proj.weight",
          "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
          "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
          "model.layers.0.input_layernorm.weight",
          "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
          "lm_head.weight"));
  auto params = m->NamedParameters();
  EXPECT_EQ(params[2].second.sizes(), (std::vector<int64_t>{32, 64}));  // 2 kv heads x 16
  EXPECT_EQ(params[7].second.sizes(), (std::vector<int64_t>{64, 96}));
  for (auto& [name, t] : params) EXPECT_TRUE(t.requires_grad()) << name;
}

TEST(LlamaModelTest, TiedHeadSharesTheEmbeddingStorage) {
  LlamaConfig tiny = testing::PresetConfig("tiny");
  std::unique_ptr<LlamaModel> m = MakeLlama(tiny, 3);
  auto params = m->NamedParameters();
  EXPECT_EQ(params.back().first, "lm_head.weight");
  EXPECT_TRUE(params.back().second.is_same(params.front().second));
  EXPECT_EQ(m->NumParameters(), 4000000);
  EXPECT_EQ(m->Parameters().size(), params.size() - 1);
  ASSERT_EQ(m->Buffers().size(), 2u);
  EXPECT_EQ(m->Buffers()[0].sizes(), (std::vector<int64_t>{512, 32}));

  LlamaConfig untied = SmallGqaConfig();
  std::unique_ptr<LlamaModel> u = MakeLlama(untied, 3);
  EXPECT_FALSE(
      u->NamedParameters().back().second.is_same(u->NamedParameters()[0].second));
  EXPECT_EQ(u->NumParameters(), untied.NumParameters());
}

TEST(LlamaModelTest, InitIsAFunctionOfTheSeed) {
  LlamaConfig c = SmallGqaConfig();
  auto a = MakeLlama(c, 7)->NamedParameters();
  auto b = MakeLlama(c, 7)->NamedParameters();
  auto other = MakeLlama(c, 8)->NamedParameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
  EXPECT_FALSE(torch::equal(a[1].second, other[1].second));
  EXPECT_NEAR(a[0].second.std().item<double>(), 0.02, 0.002);
  EXPECT_TRUE(torch::equal(a[8].second, torch::ones({64})));  // input_layernorm
}

TEST(LlamaModelTest, CreateRejectsInvalidConfig) {
  LlamaConfig c = SmallGqaConfig();
  c.num_key_value_heads = 3;
  absl::StatusOr<std::unique_ptr<LlamaModel>> m = LlamaModel::Create(c, 1);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaModelTest, SplitForwardEqualsForward) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallGqaConfig(), 5);
  torch::NoGradGuard no_grad;
  at::Tensor ids = torch::randint(0, 97, {2, 10}, torch::kInt64);
  at::Tensor logits = m->Forward(ids);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10, 97}));
  at::Tensor x = m->Embed(ids);
  for (int64_t i = 0; i < m->num_layers(); ++i) x = m->Layer(i, x);
  EXPECT_TRUE(torch::equal(m->Head(m->FinalNorm(x)), logits));
  EXPECT_TRUE(torch::equal(m->Head(m->ForwardHidden(ids)), logits));
}

TEST(LlamaModelTest, FutureTokensDoNotChangePastLogits) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallGqaConfig(), 5);
  torch::NoGradGuard no_grad;
  at::Tensor ids = torch::randint(0, 97, {1, 12}, torch::kInt64);
  at::Tensor changed = ids.clone();
  changed.index_put_({0, 8}, (ids[0][8].item<int64_t>() + 1) % 97);
  at::Tensor a = m->Forward(ids);
  at::Tensor b = m->Forward(changed);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 8), b.narrow(1, 0, 8), 0, 1e-6));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 8, 4), b.narrow(1, 8, 4), 0, 1e-4));
}

TEST(LlamaModelTest, RejectsSequencesLongerThanMaxPositions) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallGqaConfig(), 5);
  at::Tensor ids = torch::zeros({1, 65}, torch::kInt64);
  EXPECT_THROW(m->Forward(ids), c10::Error);
}

TEST(LlamaModelTest, LoadStateDictChecksNamesAndShapes) {
  LlamaConfig c = SmallGqaConfig();
  std::unique_ptr<LlamaModel> src = MakeLlama(c, 1);
  std::unique_ptr<LlamaModel> dst = MakeLlama(c, 2);
  auto state = src->NamedParameters();

  auto unknown = state;
  unknown.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({96, 64}));
  absl::Status s = dst->LoadStateDict(unknown);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.9.mlp.up_proj.weight"));

  auto misshaped = state;
  misshaped[1].second = torch::zeros({64, 63});
  s = dst->LoadStateDict(misshaped);
  EXPECT_THAT(s.message(),
              HasSubstr("has shape [64, 63] but the model expects [64, 64]"));

  auto missing = state;
  missing.erase(missing.begin() + 3);
  s = dst->LoadStateDict(missing);
  EXPECT_THAT(s.message(), HasSubstr("lacks model.layers.0.self_attn.v_proj.weight"));
  // Nothing was copied by the failed loads.
  EXPECT_FALSE(torch::equal(dst->NamedParameters()[1].second, state[1].second));

  ASSERT_TRUE(dst->LoadStateDict(state).ok());
  auto loaded = dst->NamedParameters();
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_TRUE(torch::equal(loaded[i].second, state[i].second)) << state[i].first;
    EXPECT_FALSE(loaded[i].second.is_same(state[i].second));
  }
}

TEST(LlamaModelTest, LoadStateDictSkipsRotaryBuffersAndNamesTheCauseOfOtherKeys) {
  LlamaConfig c = SmallGqaConfig();
  std::unique_ptr<LlamaModel> src = MakeLlama(c, 1);
  std::unique_ptr<LlamaModel> dst = MakeLlama(c, 2);
  auto state = src->NamedParameters();
  // What older transformers versions saved beside the weights.
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    state.emplace_back(absl::StrCat("model.layers.", i, ".self_attn.rotary_emb.inv_freq"),
                       torch::ones({c.head_dim() / 2}));
  }
  int64_t ignored = -1;
  ASSERT_TRUE(dst->LoadStateDict(state, &ignored).ok());
  EXPECT_EQ(ignored, c.num_hidden_layers);
  EXPECT_TRUE(torch::equal(dst->NamedParameters()[0].second, state[0].second));

  // A layer past num_hidden_layers: the weights are of a deeper model.
  auto deeper = src->NamedParameters();
  deeper.emplace_back("model.layers.9.mlp.up_proj.weight", torch::zeros({96, 64}));
  absl::Status s = dst->LoadStateDict(deeper);
  EXPECT_THAT(s.message(), HasSubstr("num_hidden_layers is 2"));
  // A bias the config's flags leave out: the flags are wrong.
  auto biased = src->NamedParameters();
  biased.emplace_back("model.layers.0.self_attn.q_proj.bias", torch::zeros({64}));
  s = dst->LoadStateDict(biased);
  EXPECT_THAT(s.message(), HasSubstr("attention_bias false"));
  // Anything else: not a tensor of this architecture at all.
  auto other = src->NamedParameters();
  other.emplace_back("transformer.wte.weight", torch::zeros({4}));
  s = dst->LoadStateDict(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("another architecture"));
}

TEST(LlamaModelTest, LoadStateDictWithTiedHeadNeedsNoLmHead) {
  LlamaConfig tiny = testing::PresetConfig("tiny");
  tiny.num_hidden_layers = 1;
  std::unique_ptr<LlamaModel> src = MakeLlama(tiny, 1);
  std::unique_ptr<LlamaModel> dst = MakeLlama(tiny, 2);
  auto state = src->NamedParameters();
  state.pop_back();  // lm_head.weight, as save_pretrained drops it
  // A bfloat16 checkpoint converts on load.
  for (auto& [name, t] : state) t = t.detach().to(torch::kBFloat16);
  ASSERT_TRUE(dst->LoadStateDict(state).ok());
  at::Tensor head = dst->NamedParameters().back().second;
  EXPECT_TRUE(torch::equal(head, state[0].second.to(torch::kFloat32)));
}

TEST(LlamaModelTest, LoadStateDictRefusesWeightsPlacedOnDisk) {
  LlamaConfig c = SmallGqaConfig();
  std::unique_ptr<LlamaModel> m = MakeLlama(c, 1);
  auto state = m->NamedParameters();
  std::vector<std::pair<std::string, at::Tensor>> layer0;
  for (auto& [name, t] : state) {
    if (name.rfind("model.layers.0.", 0) == 0)
      layer0.emplace_back(name, t.detach().clone());
  }
  ASSERT_TRUE(m->PlaceModule("model.layers.0", Placement::kDisk, layer0).ok());
  at::Tensor before = m->LayerParameters(0)[0].clone();
  for (auto& [name, t] : state) t = torch::zeros_like(t);
  absl::Status s = m->LoadStateDict(state);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("model.layers.0"));
  EXPECT_TRUE(torch::equal(m->LayerParameters(0)[0], before));
}

// Writes the model's weights, its config.json and token ids to a temporary
// directory, runs tests/model/llama_reference.py on them and returns the
// maximum absolute difference between the two sets of logits.
double MaxDiffAgainstPython(LlamaModel& model, const at::Tensor& ids) {
  namespace fs = std::filesystem;
  const testing::TempDir tmp;
  const fs::path dir = tmp.path();
  auto write = [&](const std::string& file, const at::Tensor& t) {
    at::Tensor c = t.detach().contiguous();
    std::ofstream out(dir / file, std::ios::binary);
    out.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
  };
  Json tensors = Json::array();
  int i = 0;
  for (auto& [name, t] : model.NamedParameters()) {
    std::string file = absl::StrCat("t", i++, ".bin");
    write(file, t);
    tensors.push_back({{"name", name}, {"shape", t.sizes().vec()}, {"file", file}});
  }
  write("ids.bin", ids);
  const Json manifest = {
      {"tensors", std::move(tensors)},
      {"input_ids", {{"shape", ids.sizes().vec()}, {"file", "ids.bin"}}}};
  std::ofstream(dir / "manifest.json") << DumpJson(manifest);
  std::ofstream(dir / "config.json") << model.config().ToJson();

  std::string out;
  EXPECT_EQ(
      testing::RunPython(
          {testing::SourcePath("tests/model/llama_reference.py"), dir.string()}, &out),
      0)
      << out;

  std::ifstream in(dir / "logits.bin", std::ios::binary);
  const int64_t vocab = model.config().vocab_size;
  at::Tensor ref = torch::empty({ids.size(0), ids.size(1), vocab}, torch::kFloat32);
  in.read(static_cast<char*>(ref.data_ptr()), ref.numel() * 4);
  EXPECT_TRUE(in.good()) << "short logits.bin";

  torch::NoGradGuard no_grad;
  at::Tensor logits = model.Forward(ids);
  double scale = logits.abs().max().item<double>();
  EXPECT_GT(scale, 0.5) << "logits too small for the comparison to mean anything";
  return (logits - ref).abs().max().item<double>();
}

// Replaces the init (std 0.02, which makes logits tiny) by weights that give
// logits of order 1, so that a wrong equation shows.
void Randomize(LlamaModel& model, uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<std::pair<std::string, at::Tensor>> state;
  for (auto& [name, t] : model.NamedParameters()) {
    if (t.dim() == 1) {
      state.emplace_back(name, 1.0 + 0.3 * torch::randn(t.sizes()));
    } else {
      state.emplace_back(name, torch::randn(t.sizes()) / std::sqrt(double(t.size(1))));
    }
  }
  ASSERT_TRUE(model.LoadStateDict(state).ok());
}

TEST(LlamaModelTest, MatchesPythonReferenceWithGroupedQueryAttention) {
  std::unique_ptr<LlamaModel> m = MakeLlama(SmallGqaConfig(), 11);
  Randomize(*m, 12);
  at::Tensor ids = torch::randint(0, 97, {2, 48}, torch::kInt64);
  for (AttentionImplementation a :
       {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
    m->set_attention_implementation(a);
    EXPECT_LT(MaxDiffAgainstPython(*m, ids), 1e-4) << AttentionImplementationName(a);
  }
}

// SmallGqaConfig as Qwen2 (q/k/v biases) with a sliding window of 8 keys on
// its second layer, and as Qwen3 (q/k norms, head_dim 32 instead of 16, all
// four attention biases), and as Mistral (a window on every layer).
LlamaConfig WindowedQwen2Config() { return testing::AsWindowedQwen2(SmallGqaConfig()); }
LlamaConfig Qwen3Config() {
  LlamaConfig c = SmallGqaConfig();
  c.architecture = "Qwen3ForCausalLM";
  c.model_type = "qwen3";
  c.explicit_head_dim = 32;
  c.attention_bias = true;
  c.layer_types.assign(2, "full_attention");
  return c;
}
LlamaConfig MistralConfig(int64_t window) {
  LlamaConfig c = SmallGqaConfig();
  c.architecture = "MistralForCausalLM";
  c.model_type = "mistral";
  c.sliding_window = window;
  return c;
}

TEST(LlamaModelTest, FamilyPartsAreNamedAndShapedAsInTransformers) {
  LlamaConfig c = Qwen3Config();
  c.num_hidden_layers = 1;
  c.layer_types.resize(1);
  std::unique_ptr<LlamaModel> m = MakeLlama(c, 1);
  EXPECT_THAT(
      ParameterNames(*m),
      ::testing::ElementsAre(
          "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
          "model.layers.0.self_attn.q_proj.bias",
          "model.layers.0.self_attn.k_proj.weight",
          "model.layers.0.self_attn.k_proj.bias",
          "model.layers.0.self_attn.v_proj.weight",
          "model.layers.0.self_attn.v_proj.bias",
          "model.layers.0.self_attn.o_proj.weight",
          "model.layers.0.self_attn.o_proj.bias",
          "model.layers.0.self_attn.q_norm.weight",
          "model.layers.0.self_attn.k_norm.weight", "model.layers.0.mlp.gate_proj.weight",
          "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
          "model.layers.0.input_layernorm.weight",
          "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
          "lm_head.weight"));
  auto params = m->NamedParameters();
  EXPECT_EQ(params[1].second.sizes(),
            (std::vector<int64_t>{4 * 32, 64}));  // 4 heads x 32
  EXPECT_EQ(params[2].second.sizes(), (std::vector<int64_t>{4 * 32}));
  EXPECT_EQ(params[9].second.sizes(), (std::vector<int64_t>{32}));  // q_norm: head_dim
  // transformers' init: biases zero, norms one.
  EXPECT_TRUE(params[2].second.eq(0).all().item<bool>());
  EXPECT_TRUE(params[9].second.eq(1).all().item<bool>());
  EXPECT_EQ(m->NumParameters(), c.NumParameters());

  LlamaConfig mlp = SmallGqaConfig();
  mlp.num_hidden_layers = 1;
  mlp.mlp_bias = true;
  const std::vector<std::string> names = ParameterNames(*MakeLlama(mlp, 1));
  EXPECT_THAT(names, ::testing::Contains("model.layers.0.mlp.gate_proj.bias"));
  EXPECT_THAT(names, ::testing::Contains("model.layers.0.mlp.down_proj.bias"));
  EXPECT_THAT(
      names, ::testing::Not(::testing::Contains("model.layers.0.self_attn.q_proj.bias")));
  // A model without the optional parts draws the same weights as before
  // they existed: biases take nothing from the generator.
  std::unique_ptr<LlamaModel> plain = MakeLlama(SmallGqaConfig(), 5);
  std::unique_ptr<LlamaModel> qwen2 = MakeLlama(WindowedQwen2Config(), 5);
  EXPECT_TRUE(torch::equal(plain->layer(1).down_proj, qwen2->layer(1).down_proj));
}

// A sliding window of W keys: in a one-layer model, the token at position 0
// reaches the logits of positions 0..W-1 and no further, in both attention
// implementations; without the window it reaches every position.
TEST(LlamaModelTest, SlidingWindowHidesKeysOutsideIt) {
  for (const int64_t window : {int64_t{4}, int64_t{0}}) {
    LlamaConfig c = MistralConfig(window);
    c.num_hidden_layers = 1;
    std::unique_ptr<LlamaModel> m = MakeLlama(c, 3);
    Randomize(*m, 4);
    at::Tensor ids = torch::randint(1, 97, {1, 12}, torch::kInt64);
    at::Tensor changed = ids.clone();
    changed[0][0] = 0;
    for (AttentionImplementation a :
         {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
      SCOPED_TRACE(absl::StrCat("window ", window, " ", AttentionImplementationName(a)));
      m->set_attention_implementation(a);
      torch::NoGradGuard no_grad;
      at::Tensor diff = (m->Forward(ids) - m->Forward(changed)).abs().amax(-1)[0];
      for (int64_t pos = 0; pos < 12; ++pos) {
        const bool reached = window == 0 || pos < window;
        EXPECT_EQ(diff[pos].item<double>() > 1e-6, reached) << "position " << pos;
      }
    }
  }
}

// SDPA and the eager equations agree within float rounding, in the loss and
// in every gradient, with grouped-query heads (the reference tests above
// check the forward against Python; this checks backward too), and in each
// family's parts: biases, q/k norms, sliding windows.
void ExpectSdpaMatchesEager(const LlamaConfig& config) {
  SCOPED_TRACE(config.architecture);
  std::unique_ptr<LlamaModel> m = MakeLlama(config, 21);
  Randomize(*m, 22);
  at::Tensor ids = torch::randint(0, 97, {2, 40}, torch::kInt64);
  auto loss_and_grads = [&](AttentionImplementation a) {
    m->set_attention_implementation(a);
    for (at::Tensor& p : m->Parameters()) p.mutable_grad() = at::Tensor();
    at::Tensor logits = m->Forward(ids);
    at::Tensor loss = torch::cross_entropy_loss(logits.reshape({-1, 97}).narrow(0, 0, 79),
                                                ids.reshape({-1}).narrow(0, 1, 79));
    loss.backward();
    std::vector<at::Tensor> grads;
    for (const at::Tensor& p : m->Parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(loss.item<double>(), grads);
  };
  auto [eager_loss, eager_grads] = loss_and_grads(AttentionImplementation::kEager);
  auto [sdpa_loss, sdpa_grads] = loss_and_grads(AttentionImplementation::kSdpa);
  EXPECT_NEAR(sdpa_loss, eager_loss, 1e-5 * std::abs(eager_loss));
  ASSERT_EQ(sdpa_grads.size(), eager_grads.size());
  for (size_t i = 0; i < eager_grads.size(); ++i) {
    const double scale = eager_grads[i].abs().max().item<double>();
    ASSERT_GT(scale, 0) << i;
    EXPECT_LT((sdpa_grads[i] - eager_grads[i]).abs().max().item<double>(), 1e-4 * scale)
        << "parameter " << i;
  }
}

TEST(LlamaModelTest, SdpaMatchesEagerInForwardAndGradients) {
  ExpectSdpaMatchesEager(SmallGqaConfig());
  ExpectSdpaMatchesEager(WindowedQwen2Config());
  ExpectSdpaMatchesEager(Qwen3Config());
  ExpectSdpaMatchesEager(MistralConfig(8));
  EXPECT_EQ(AttentionImplementationName(AttentionImplementation::kSdpa), "sdpa");
  EXPECT_EQ(*ParseAttentionImplementation("eager"), AttentionImplementation::kEager);
  EXPECT_EQ(ParseAttentionImplementation("flash").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LlamaModelTest, MatchesPythonReferenceTinyPreset) {
  LlamaConfig tiny = testing::PresetConfig("tiny");
  std::unique_ptr<LlamaModel> m = MakeLlama(tiny, 13);
  Randomize(*m, 14);
  at::Tensor ids = torch::randint(0, 256, {2, 64}, torch::kInt64);
  EXPECT_LT(MaxDiffAgainstPython(*m, ids), 1e-4);
}

}  // namespace
}  // namespace memprofd
