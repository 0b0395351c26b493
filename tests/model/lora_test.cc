// LoRA adapters on the model (core/model/lora.h): initialised as peft does,
// named as peft names them, a fresh adapter changing nothing, the base frozen.
// That the forward and backward equal peft's is tests/snapshot/
// lora_peft_test.cc's, with peft itself.

#include "core/model/lora.h"

#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/model/llama.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/llama.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;
using testing::MakeLlama;

LoraOptions Lora(int64_t r, std::vector<std::string> targets) {
  LoraOptions o;
  o.r = r;
  o.alpha = 16;
  o.target_modules = std::move(targets);
  return o;
}

TEST(LoraTest, AFreshAdapterChangesNothingAndIsInitialisedAsPeftDoes) {
  const LlamaConfig config = testing::SmallLlamaConfig();
  std::unique_ptr<LlamaModel> m = MakeLlama(config, 3);
  const at::Tensor ids = torch::randint(0, config.vocab_size, {2, 16});
  const at::Tensor before = m->Forward(ids).detach();
  const std::vector<std::pair<std::string, at::Tensor>> base = m->NamedParameters();

  ASSERT_TRUE(m->AddLora(Lora(4, {"q_proj", "v_proj", "down_proj"}), 7).ok());
  ASSERT_TRUE(m->lora().has_value());
  // B starts at zero: the model computes what it did, bit for bit.
  EXPECT_TRUE(torch::equal(m->Forward(ids).detach(), before));

  const auto adapters = m->NamedAdapters();
  ASSERT_EQ(adapters.size(), 2u * 3 * static_cast<size_t>(config.num_hidden_layers));
  EXPECT_EQ(adapters[0].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(adapters[1].first, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(adapters[4].first, "model.layers.0.mlp.down_proj.lora_A.weight");
  for (const auto& [name, t] : adapters) {
    EXPECT_TRUE(t.requires_grad()) << name;
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0) << name;
      continue;
    }
    // kaiming_uniform_(a=sqrt(5)) on [r, in]: U(-1/sqrt(in), 1/sqrt(in)).
    const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
    EXPECT_EQ(t.size(0), 4) << name;
    EXPECT_LE(t.abs().max().item<double>(), bound) << name;
    EXPECT_GT(t.abs().max().item<double>(), 0.5 * bound) << name;
    EXPECT_NEAR(t.mean().item<double>(), 0.0, 0.2 * bound) << name;
  }
  // down_proj's A reads the intermediate size; its B writes the hidden size.
  EXPECT_EQ(adapters[4].second.sizes(), (at::IntArrayRef{4, config.intermediate_size}));
  EXPECT_EQ(adapters[5].second.sizes(), (at::IntArrayRef{config.hidden_size, 4}));

  // The base is frozen and keeps transformers' names; the adapters follow
  // each layer's parameters, the head stays last.
  const auto now_base = m->NamedBaseParameters();
  ASSERT_EQ(now_base.size(), base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_EQ(now_base[i].first, base[i].first);
    EXPECT_FALSE(now_base[i].second.requires_grad()) << now_base[i].first;
  }
  const auto all = m->NamedParameters();
  EXPECT_EQ(all.size(), base.size() + adapters.size());
  EXPECT_EQ(all.back().first, "lm_head.weight");
  EXPECT_EQ(m->LayerParameters(0).size(), m->layer_parameters().size() + 6);
}

TEST(LoraTest, TheSeedDecidesTheAdaptersAndAllLinearTargetsEveryProjection) {
  const LlamaConfig config = testing::SmallLlamaConfig();
  std::unique_ptr<LlamaModel> a = MakeLlama(config, 3);
  std::unique_ptr<LlamaModel> b = MakeLlama(config, 3);
  std::unique_ptr<LlamaModel> c = MakeLlama(config, 3);
  ASSERT_TRUE(a->AddLora(Lora(2, {"all-linear"}), 1).ok());
  ASSERT_TRUE(b->AddLora(Lora(2, {"all-linear"}), 1).ok());
  ASSERT_TRUE(c->AddLora(Lora(2, {"all-linear"}), 2).ok());
  const auto na = a->NamedAdapters();
  const auto nb = b->NamedAdapters();
  const auto nc = c->NamedAdapters();
  ASSERT_EQ(na.size(), 2u * 7 * static_cast<size_t>(config.num_hidden_layers));
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_TRUE(torch::equal(na[i].second, nb[i].second)) << na[i].first;
  }
  EXPECT_FALSE(torch::equal(na[0].second, nc[0].second));
}

TEST(LoraTest, OptionsAreEqualForTheSameTargetsHoweverSpelled) {
  EXPECT_EQ(Lora(2, {"all-linear"}), Lora(2, {"down_proj", "up_proj", "gate_proj",
                                              "o_proj", "v_proj", "k_proj", "q_proj"}));
  EXPECT_EQ(Lora(2, {"q_proj", "v_proj"}), Lora(2, {"v_proj", "q_proj"}));
  EXPECT_NE(Lora(2, {"q_proj", "v_proj"}), Lora(2, {"q_proj"}));
  EXPECT_NE(Lora(2, {"q_proj"}), Lora(4, {"q_proj"}));
}

TEST(LoraTest, DropoutZeroesAboutPAndScalesTheRestAsPeftDoes) {
  const at::Tensor x = at::ones({200, 500});
  const at::Tensor y = LoraDropout(x, 0.25, 7);
  const double zeroed = y.eq(0).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(zeroed, 0.25, 0.01);  // 100,000 draws: sigma 0.0014
  EXPECT_TRUE(at::all(y.eq(0).logical_or(y.eq(1 / 0.75))).item<bool>());
  EXPECT_TRUE(at::equal(LoraDropout(x, 0.25, 7), y));   // the seed decides
  EXPECT_FALSE(at::equal(LoraDropout(x, 0.25, 8), y));  // and another differs
  EXPECT_NE(MixSeed(1, 2), MixSeed(2, 1));
  // On the meta device: the shape and dtype, nothing drawn.
  const at::Tensor meta = LoraDropout(at::empty({3, 4}, at::device(at::kMeta)), 0.5, 1);
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.sizes(), (std::vector<int64_t>{3, 4}));
  // Outside [0, 1) is refused by name.
  LoraOptions o = Lora(2, {"q_proj"});
  o.dropout = 1.0;
  EXPECT_THAT(ValidateLoraOptions(o).message(),
              HasSubstr("lora_dropout must be in [0, 1)"));
}

TEST(LoraTest, TheBaseFingerprintIsTheBasesAlone) {
  const LlamaConfig config = testing::SmallLlamaConfig();
  std::unique_ptr<LlamaModel> a = MakeLlama(config, 3);
  std::unique_ptr<LlamaModel> b = MakeLlama(config, 3);
  const std::string fingerprint = a->BaseFingerprint();
  EXPECT_EQ(fingerprint.size(), 16u);
  EXPECT_EQ(b->BaseFingerprint(), fingerprint);
  // Adapters are not the base; another seed's weights are another base, and
  // so is one changed value (the first, always sampled).
  ASSERT_TRUE(b->AddLora(Lora(2, {"all-linear"}), 1).ok());
  EXPECT_EQ(b->BaseFingerprint(), fingerprint);
  EXPECT_NE(MakeLlama(config, 4)->BaseFingerprint(), fingerprint);
  {
    torch::NoGradGuard no_grad;
    b->NamedBaseParameters()[1].second.view({-1})[0].add_(1e-3);
  }
  EXPECT_NE(b->BaseFingerprint(), fingerprint);
}

TEST(LoraTest, BadOptionsNameTheFieldAndAdaptersAreAddedOnce) {
  std::unique_ptr<LlamaModel> m = MakeLlama(testing::SmallLlamaConfig(), 3);
  struct Case {
    LoraOptions options;
    const char* says;
  };
  LoraOptions bad_alpha = Lora(4, {"q_proj"});
  bad_alpha.alpha = std::nan("");
  const Case cases[] = {
      {Lora(0, {"q_proj"}), "lora_r must be in [1, 4096]"},
      {Lora(kMaxLoraRank + 1, {"q_proj"}), "lora_r must be in"},
      {bad_alpha, "lora_alpha must be a finite number > 0"},
      {Lora(4, {}), "lora_targets is empty"},
      {Lora(4, {"q_proj", "lm_head"}), "no projection \"lm_head\""},
      {Lora(4, {"q_proj", "q_proj"}), "names \"q_proj\" twice"},
      {Lora(4, {"all-linear", "q_proj"}), "give it alone"},
  };
  for (const Case& c : cases) {
    absl::Status s = m->AddLora(c.options, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_THAT(s.message(), HasSubstr(c.says));
  }
  EXPECT_FALSE(m->lora().has_value());
  ASSERT_TRUE(m->AddLora(Lora(4, {"q_proj"}), 1).ok());
  EXPECT_EQ(m->AddLora(Lora(4, {"q_proj"}), 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

// A frozen base kept in bf16: every base weight cast (a tied head staying
// the embedding), the adapters float32, and what cannot be cast refused
// before anything changes.
TEST(LoraTest, ABaseIsKeptInBf16UnderAdaptersAlone) {
  std::unique_ptr<LlamaModel> m = MakeLlama(testing::SmallLlamaConfig(), 3);
  EXPECT_EQ(m->base_dtype(), at::kFloat);
  absl::Status s = m->SetBaseDtype(at::kBFloat16);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("only a frozen base"));
  EXPECT_EQ(m->SetBaseDtype(at::kHalf).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(m->AddLora(Lora(4, {"q_proj", "down_proj"}), 1).ok());

  // A module on disk is a read-only float32 mapping: refused, nothing cast.
  std::vector<std::pair<std::string, at::Tensor>> norm;
  for (const auto& [name, t] : m->NamedBaseParameters()) {
    if (name == "model.norm.weight") norm.emplace_back(name, t);
  }
  ASSERT_TRUE(m->PlaceModule("model.norm", Placement::kDisk, norm).ok());
  s = m->SetBaseDtype(at::kBFloat16);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("model.norm is placed on disk"));
  EXPECT_EQ(m->base_dtype(), at::kFloat);
  for (const auto& [name, t] : m->NamedParameters()) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  }
  ASSERT_TRUE(m->PlaceModule("model.norm", Placement::kDevice, norm).ok());

  const std::string fingerprint = m->BaseFingerprint();
  bool changed = false;
  ASSERT_TRUE(m->SetBaseDtype(at::kBFloat16, &changed).ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(m->base_dtype(), at::kBFloat16);
  for (const auto& [name, t] : m->NamedBaseParameters()) {
    EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
    EXPECT_FALSE(t.requires_grad()) << name;
  }
  for (const auto& [name, t] : m->NamedAdapters()) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  }
  const auto named = m->NamedParameters();
  EXPECT_TRUE(named.front().second.is_same(named.back().second));  // tied head
  // The same base, rounded: the fingerprint a checkpoint recorded still holds.
  EXPECT_EQ(m->BaseFingerprint(), fingerprint);
  // Again: nothing to do. Back to float32: refused, the rounding is done.
  ASSERT_TRUE(m->SetBaseDtype(at::kBFloat16, &changed).ok());
  EXPECT_FALSE(changed);
  s = m->SetBaseDtype(at::kFloat);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("cannot be undone"));
}

// A model made in bf16 holds what the float32 model of its seed holds,
// rounded, frozen from the start, without ever holding the float32 base.
TEST(LoraTest, AModelMadeInBf16IsTheFloat32OneRoundedAndFrozen) {
  const LlamaConfig config = testing::SmallLlamaConfig();
  std::unique_ptr<LlamaModel> f32 = MakeLlama(config, 3);
  absl::StatusOr<std::unique_ptr<LlamaModel>> made =
      LlamaModel::Create(config, 3, c10::Device(c10::DeviceType::CPU), at::kBFloat16);
  ASSERT_TRUE(made.ok()) << made.status();
  LlamaModel& bf16 = **made;
  EXPECT_EQ(bf16.base_dtype(), at::kBFloat16);
  const auto a = f32->NamedBaseParameters();
  const auto b = bf16.NamedBaseParameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i].second.scalar_type(), at::kBFloat16) << b[i].first;
    EXPECT_FALSE(b[i].second.requires_grad()) << b[i].first;
    EXPECT_TRUE(torch::equal(b[i].second, a[i].second.to(at::kBFloat16))) << b[i].first;
  }
  EXPECT_EQ(bf16.BaseFingerprint(), f32->BaseFingerprint());
  EXPECT_EQ(LlamaModel::Create(config, 3, c10::Device(c10::DeviceType::CPU), at::kHalf)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // No disk placement for it; adapters go on in float32.
  std::vector<std::pair<std::string, at::Tensor>> norm;
  for (const auto& [name, t] : b) {
    if (name == "model.norm.weight") norm.emplace_back(name, t);
  }
  EXPECT_EQ(bf16.PlaceModule("model.norm", Placement::kDisk, norm).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(bf16.PlaceModule("model.norm", Placement::kCpu, norm).ok());
  ASSERT_TRUE(bf16.AddLora(Lora(4, {"q_proj"}), 1).ok());
  for (const auto& [name, t] : bf16.NamedAdapters()) {
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
  }
  bool changed = true;
  ASSERT_TRUE(bf16.SetBaseDtype(at::kBFloat16, &changed).ok());
  EXPECT_FALSE(changed);
}

TEST(LoraTest, TargetsParseFromTheRequestsSpelling) {
  absl::StatusOr<std::vector<std::string>> t = ParseLoraTargets("q_proj, v_proj");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(LoraTargetsName(*t), "q_proj,v_proj");
  EXPECT_FALSE(ParseLoraTargets("q_proj,,v_proj").ok());
  std::string many = "q_proj";
  for (int i = 0; i < 40; ++i) many += ",q_proj";
  EXPECT_THAT(ParseLoraTargets(many).status().message(), HasSubstr("more than 32"));
  LoraOptions all = Lora(4, {"all-linear"});
  EXPECT_EQ(all.Targets().size(), 7u);
  EXPECT_DOUBLE_EQ(all.Scaling(), 4.0);
  all.use_rslora = true;
  EXPECT_DOUBLE_EQ(all.Scaling(), 8.0);
}

TEST(LoraTest, PeftAdapterConfigsReadAsPeftMeantThemOrNameWhatIsNotComputed) {
  std::vector<std::string> notes;
  absl::StatusOr<LoraOptions> read = LoraOptionsFromAdapterConfig(
      R"({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "lora_dropout": 0.05,
          "target_modules": ["v_proj", "q_proj"], "bias": "none", "use_dora": false,
          "modules_to_save": null, "rank_pattern": {}, "task_type": "CAUSAL_LM"})",
      &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->r, 8);
  EXPECT_EQ(read->alpha, 16);
  EXPECT_EQ(read->Targets(), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(read->dropout, 0.05);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("train with lora_dropout 0.05"));
  read = LoraOptionsFromAdapterConfig(
      R"({"peft_type": "LORA", "r": 4, "target_modules": "all-linear"})", &notes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->alpha, 8);  // peft's defaults
  EXPECT_EQ(read->dropout, 0);
  EXPECT_EQ(read->Targets().size(), 7u);
  for (const auto& [json, says] : std::vector<std::pair<std::string, std::string>>{
           {R"({"peft_type": "IA3", "r": 4, "target_modules": ["q_proj"]})", "peft_type"},
           {R"({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"],
                "use_dora": true})",
            "use_dora"},
           {R"({"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"],
                "bias": "all"})",
            "bias"},
           {R"({"peft_type": "LORA", "r": 4, "target_modules": ["lm_head"]})",
            "no projection \"lm_head\""},
           {R"({"peft_type": "LORA", "target_modules": ["q_proj"]})", "r is missing"},
           {"[1]", "not a JSON object"}}) {
    absl::Status s = LoraOptionsFromAdapterConfig(json, &notes).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(s.message(), HasSubstr(says));
  }
}

TEST(LoraTest, LoadAdaptersChecksEveryNameAndShapeBeforeCopying) {
  std::unique_ptr<LlamaModel> m = MakeLlama(testing::SmallLlamaConfig(), 3);
  EXPECT_EQ(m->LoadAdapters({}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m->AddLora(Lora(2, {"q_proj"}), 1).ok());
  std::vector<std::pair<std::string, at::Tensor>> given;
  for (const auto& [name, t] : m->NamedAdapters()) {
    given.emplace_back(name, torch::full(t.sizes(), 0.5));
  }
  auto missing = given;
  missing.pop_back();
  EXPECT_THAT(m->LoadAdapters(missing).message(), HasSubstr("lacks"));
  auto wrong = given;
  wrong[0].second = torch::zeros({3, 3});
  EXPECT_THAT(m->LoadAdapters(wrong).message(), HasSubstr("must be a floating-point"));
  auto unknown = given;
  unknown[0].first = "model.layers.0.self_attn.k_proj.lora_A.weight";
  EXPECT_THAT(m->LoadAdapters(unknown).message(), HasSubstr("is not an adapter"));
  EXPECT_EQ(m->NamedAdapters()[1].second.abs().max().item<double>(), 0.0);
  ASSERT_TRUE(m->LoadAdapters(given).ok());
  for (const auto& [name, t] : m->NamedAdapters()) {
    EXPECT_EQ(t.min().item<double>(), 0.5) << name;
    EXPECT_TRUE(t.requires_grad()) << name;
  }
}

}  // namespace
}  // namespace memprofd
