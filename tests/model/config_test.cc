#include "core/model/config.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_replace.h"
#include "core/common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

// TinyLlama-1.1B's config.json as published on the Hugging Face hub.
constexpr char kTinyLlamaConfig[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 2048,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.35.0",
  "use_cache": true,
  "vocab_size": 32000
})";

absl::StatusOr<LlamaConfig> ParseWith(absl::string_view from, absl::string_view to) {
  return LlamaConfig::FromJson(absl::StrReplaceAll(kTinyLlamaConfig, {{from, to}}));
}

TEST(LlamaConfigTest, ReadsHuggingFaceConfig) {
  absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(kTinyLlamaConfig);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 5632);
  EXPECT_EQ(c->num_hidden_layers, 22);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->head_dim(), 64);
  // TinyLlama-1.1B has 1,100,048,384 parameters.
  EXPECT_EQ(c->NumParameters(), 1100048384);
}

TEST(LlamaConfigTest, MissingKeyValueHeadsMeansMultiHead) {
  absl::StatusOr<LlamaConfig> c = ParseWith("\"num_key_value_heads\": 4,", "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
}

TEST(LlamaConfigTest, RejectsOtherArchitectures) {
  // The class and model_type disagree.
  absl::StatusOr<LlamaConfig> c = ParseWith("LlamaForCausalLM", "MistralForCausalLM");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("MistralForCausalLM"));
  EXPECT_THAT(c.status().message(), HasSubstr("make them agree"));
  c = ParseWith("\"model_type\": \"llama\"", "\"model_type\": \"gpt2\"");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("model_type"));
  // A family the daemon does not implement: refused, naming what it does.
  c = LlamaConfig::FromJson(absl::StrReplaceAll(
      kTinyLlamaConfig,
      {{"LlamaForCausalLM", "GemmaForCausalLM"}, {"\"llama\"", "\"gemma\""}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                        "Qwen3ForCausalLM"));
}

// Qwen2.5-0.5B's config.json as published on the Hugging Face hub.
constexpr char kQwen25Config[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

TEST(ModelFamilyTest, ReadsQwen2WithItsBiasesAndAnInactiveWindow) {
  absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(kQwen25Config);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_FALSE(c->o_bias());
  EXPECT_FALSE(c->qk_norm());
  // use_sliding_window false: transformers drops the window.
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->LayerWindow(23), 0);
  EXPECT_EQ(c->layer_types, std::vector<std::string>(24, "full_attention"));
  // Qwen2.5-0.5B has 494,032,768 parameters (q/k/v biases included).
  EXPECT_EQ(c->NumParameters(), 494032768);
  // The preset is this file's model (stored in float32).
  LlamaConfig as_float32 = *c;
  as_float32.torch_dtype = "float32";
  EXPECT_TRUE(as_float32 == *LlamaConfig::Preset("qwen2.5-0.5b"));

  // With the window on, the layers from max_window_layers on use it.
  absl::StatusOr<LlamaConfig> windowed = LlamaConfig::FromJson(absl::StrReplaceAll(
      kQwen25Config, {{"\"use_sliding_window\": false", "\"use_sliding_window\": true"},
                      {"\"max_window_layers\": 24", "\"max_window_layers\": 20"},
                      {"\"sliding_window\": 32768", "\"sliding_window\": 64"}}));
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  EXPECT_EQ(windowed->LayerWindow(19), 0);
  EXPECT_EQ(windowed->LayerWindow(20), 64);
  EXPECT_EQ(windowed->LayerWindow(23), 64);
  absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(windowed->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *windowed) << windowed->ToJson();
  // layer_types, when given, decide; it must have one entry per layer.
  absl::StatusOr<LlamaConfig> short_types = LlamaConfig::FromJson(absl::StrReplaceAll(
      kQwen25Config,
      {{"\"use_mrope\": false", "\"layer_types\": [\"full_attention\"]"}}));
  EXPECT_THAT(short_types.status().message(), HasSubstr("layer_types"));
  // Qwen's default layer_types is one entry per layer: the count is bounded
  // before the list is built (a config.json must not make it allocate 2^40).
  absl::StatusOr<LlamaConfig> deep = LlamaConfig::FromJson(absl::StrReplaceAll(
      kQwen25Config,
      {{"\"num_hidden_layers\": 24", "\"num_hidden_layers\": 1099511627776"},
       {"\"hidden_size\": 896", "\"hidden_size\": 14"},
       {"\"intermediate_size\": 4864", "\"intermediate_size\": 1"}}));
  EXPECT_THAT(deep.status().message(), HasSubstr("at most 1048576"));
  absl::StatusOr<LlamaConfig> odd_type = LlamaConfig::FromJson(absl::StrReplaceAll(
      kQwen25Config, {{"\"use_mrope\": false", "\"layer_types\": 7"}}));
  EXPECT_THAT(odd_type.status().message(), HasSubstr("layer_types"));
}

TEST(ModelFamilyTest, Qwen3DefaultsHeadDimTo128AndHasQkNorms) {
  absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(R"({
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 1000,
    "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 8})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim(), 128);  // Qwen3Config's default, not 1024 / 16
  EXPECT_TRUE(c->qk_norm());
  EXPECT_FALSE(c->qkv_bias());
  EXPECT_EQ(c->max_position_embeddings, 32768);
  EXPECT_FALSE(c->tie_word_embeddings);
  // Per layer: q, o [2048 x 1024]; k, v [1024 x 1024]; MLP; two norms; q/k norms.
  const int64_t layer =
      2 * 2048 * 1024 + 2 * 1024 * 1024 + 3 * 1024 * 3072 + 2 * 1024 + 2 * 128;
  EXPECT_EQ(c->NumParameters(), 2 * 1000 * 1024 + 2 * layer + 1024);
  absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
}

TEST(ModelFamilyTest, MistralWindowDefaultsTo4096AndNullTurnsItOff) {
  const std::string mistral = absl::StrReplaceAll(
      kTinyLlamaConfig, {{"LlamaForCausalLM", "MistralForCausalLM"},
                         {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\""}});
  absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(mistral);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->LayerWindow(0), 4096);  // every layer
  EXPECT_EQ(c->LayerWindow(21), 4096);
  EXPECT_EQ(c->NumParameters(), 1100048384);  // no biases: Llama's count
  absl::StatusOr<LlamaConfig> off = LlamaConfig::FromJson(absl::StrReplaceAll(
      mistral, {{"\"use_cache\"", "\"sliding_window\": null, \"use_cache\""}}));
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->LayerWindow(0), 0);
  for (const LlamaConfig& m : {*c, *off}) {
    absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(m.ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(*back == m) << m.ToJson();
  }
  EXPECT_THAT(
      LlamaConfig::FromJson(
          absl::StrReplaceAll(
              mistral, {{"\"use_cache\"", "\"sliding_window\": 0, \"use_cache\""}}))
          .status()
          .message(),
      HasSubstr("sliding_window"));
}

TEST(ModelFamilyTest, LlamaBiasesCountAndRoundTrip) {
  absl::StatusOr<LlamaConfig> c = ParseWith(
      "\"attention_bias\": false", "\"attention_bias\": true, \"mlp_bias\": true");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias());
  EXPECT_TRUE(c->o_bias());
  EXPECT_TRUE(c->mlp_bias);
  // q 2048, k and v 256 each, o 2048, gate and up 5632, down 2048, per layer.
  EXPECT_EQ(c->NumParameters(),
            1100048384 + 22 * (2048 + 2 * 256 + 2048 + 2 * 5632 + 2048));
  absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
}

TEST(LlamaConfigTest, RejectsMissingAndMistypedFields) {
  for (const char* field :
       {"\"hidden_size\": 2048,", ",\n  \"vocab_size\": 32000",
        "\"num_hidden_layers\": 22,", "\"intermediate_size\": 5632,"}) {
    std::string text = absl::StrReplaceAll(kTinyLlamaConfig, {{field, ""}});
    absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(c.status().message(), HasSubstr("is missing")) << field;
  }
  absl::StatusOr<LlamaConfig> c =
      ParseWith("\"hidden_size\": 2048", "\"hidden_size\": \"2048\"");
  EXPECT_THAT(c.status().message(), HasSubstr("\"hidden_size\" must be an integer"));
  c = ParseWith("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0");
  EXPECT_THAT(c.status().message(), HasSubstr("tie_word_embeddings"));
  c = LlamaConfig::FromJson("{\"hidden_size\": ");
  EXPECT_THAT(c.status().message(), HasSubstr("not valid JSON"));
  c = LlamaConfig::FromJson("[]");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaConfigTest, RejectsInconsistentShapes) {
  absl::StatusOr<LlamaConfig> c =
      ParseWith("\"num_attention_heads\": 32", "\"num_attention_heads\": 30");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("multiple of num_attention_heads"));
  c = ParseWith("\"num_key_value_heads\": 4", "\"num_key_value_heads\": 5");
  EXPECT_THAT(c.status().message(), HasSubstr("multiple of num_key_value_heads"));
  c = ParseWith("\"hidden_size\": 2048", "\"hidden_size\": 0");
  EXPECT_THAT(c.status().message(), HasSubstr("must be positive"));
  c = ParseWith("\"vocab_size\": 32000", "\"vocab_size\": -1");
  EXPECT_THAT(c.status().message(), HasSubstr("vocab_size"));
  c = ParseWith("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0");
  EXPECT_THAT(c.status().message(), HasSubstr("rms_norm_eps"));
  c = ParseWith("\"bfloat16\"", "\"int8\"");
  EXPECT_THAT(c.status().message(), HasSubstr("torch_dtype"));
}

// Found by fuzz/config_fuzz under UBSan: sizes that pass every other check
// overflowed NumParameters() (signed overflow, undefined behaviour).
TEST(LlamaConfigTest, RejectsSizesWhoseParameterCountOverflows) {
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"hidden_size\": 2048", "\"hidden_size\": 4294967296"},
           {"\"intermediate_size\": 5632", "\"intermediate_size\": 4611686018427387904"},
           {"\"vocab_size\": 32000", "\"vocab_size\": 9223372036854775807"},
           {"\"num_hidden_layers\": 22", "\"num_hidden_layers\": 1099511627776"}}) {
    absl::StatusOr<LlamaConfig> c = ParseWith(from, to);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << to;
    EXPECT_THAT(c.status().message(), HasSubstr("more than 2^63 parameters")) << to;
  }
  absl::StatusOr<LlamaConfig> fits =
      ParseWith("\"num_hidden_layers\": 22", "\"num_hidden_layers\": 1000000");
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_GT(fits->NumParameters(), 0);
}

TEST(LlamaConfigTest, RejectsUnsupportedOptions) {
  EXPECT_THAT(
      ParseWith("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"su\"}")
          .status()
          .message(),
      HasSubstr("rope_scaling"));
  EXPECT_THAT(ParseWith("\"attention_bias\": false", "\"attention_dropout\": 0.1")
                  .status()
                  .message(),
              HasSubstr("attention_dropout"));
  EXPECT_THAT(ParseWith("\"silu\"", "\"gelu\"").status().message(),
              HasSubstr("hidden_act"));
  EXPECT_THAT(ParseWith("\"pretraining_tp\"", "\"head_dim\": 63, \"pretraining_tp\"")
                  .status()
                  .message(),
              HasSubstr("head_dim"));
  absl::StatusOr<LlamaConfig> longrope =
      ParseWith("\"rope_scaling\": null",
                "\"rope_scaling\": {\"type\": \"longrope\", \"factor\": 2.0}");
  EXPECT_EQ(longrope.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      longrope.status().message(),
      HasSubstr("rope_scaling.rope_type\" is \"longrope\"; supported: default, linear, "
                "dynamic, llama3, yarn"));
  EXPECT_THAT(ParseWith("\"rope_scaling\": null",
                        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}")
                  .status()
                  .message(),
              HasSubstr("rope_scaling.low_freq_factor\" is missing"));
  EXPECT_THAT(ParseWith("\"rope_scaling\": null",
                        "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}")
                  .status()
                  .message(),
              HasSubstr("factor"));
  EXPECT_THAT(ParseWith("\"rope_scaling\": null",
                        "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2, "
                        "\"partial_rotary_factor\": 0.5}")
                  .status()
                  .message(),
              HasSubstr("partial_rotary_factor"));
}

TEST(LlamaConfigTest, RejectsRotarySettingsThatWouldNotBeFinite) {
  // Each loaded and evaluated to a NaN loss before; the field is named now.
  const std::pair<std::string, const char*> cases[] = {
      {"\"rope_theta\": 1e-300", "rope_theta\" must be a finite number >= 1"},
      {"\"rope_theta\": 0.5", "rope_theta"},
  };
  for (const auto& [theta, message] : cases) {
    absl::StatusOr<LlamaConfig> c = ParseWith("\"rope_theta\": 10000.0", theta);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << theta;
    EXPECT_THAT(c.status().message(), HasSubstr(message)) << theta;
  }
  auto yarn = [](absl::string_view extra) {
    return ParseWith(
        "\"rope_scaling\": null",
        absl::StrCat("\"rope_scaling\": {\"rope_type\": \"yarn\", "
                     "\"factor\": 4.0, \"original_max_position_embeddings\": "
                     "512",
                     extra, "}"));
  };
  const std::pair<std::string, const char*> yarn_cases[] = {
      {", \"beta_fast\": -1", "rope_parameters.beta_fast"},
      {", \"beta_slow\": -1", "rope_parameters.beta_slow"},
      {", \"attention_factor\": 1e300",
       "rope_parameters.attention_factor\" gives an attention factor of 1e+300"},
      {", \"attention_factor\": -1e300", "rope_parameters.attention_factor"},
      {", \"mscale\": -1e300, \"mscale_all_dim\": 1",
       "rope_parameters.mscale\" gives an attention factor"},
  };
  for (const auto& [extra, message] : yarn_cases) {
    absl::StatusOr<LlamaConfig> c = yarn(extra);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(c.status().message(), HasSubstr(message)) << extra;
  }
  // A yarn model as published (DeepSeek-style mscales, the default betas)
  // still loads, with the attention factor transformers computes.
  absl::StatusOr<LlamaConfig> ok = yarn(
      ", \"mscale\": 0.707, \"mscale_all_dim\": 0.707, \"beta_fast\": 32, \"beta_slow\": "
      "1");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_DOUBLE_EQ(RopeAttentionFactor(ok->rope_scaling), 1.0);
}

TEST(LlamaConfigTest, ReadsExplicitHeadDim) {
  absl::StatusOr<LlamaConfig> c =
      ParseWith("\"pretraining_tp\"", "\"head_dim\": 128, \"pretraining_tp\"");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim(), 128);
  // q and o are [32 * 128, 2048] and its transpose instead of 2048 x 2048.
  EXPECT_EQ(c->NumParameters(),
            1100048384 + 22 * 2 * 2048 * (4096 - 2048) + 22 * 2 * 2048 * 4 * 64);
  absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *c);
  absl::StatusOr<LlamaConfig> same =
      ParseWith("\"pretraining_tp\"", "\"head_dim\": 64, \"pretraining_tp\"");
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(*same == *LlamaConfig::FromJson(kTinyLlamaConfig));
}

TEST(LlamaConfigTest, ReadsEveryRopeTypeFromBothFormsAndWritesRopeParameters) {
  // Llama 3.1's settings in the older form, with the theta at the top level.
  absl::StatusOr<LlamaConfig> llama3 =
      ParseWith("\"rope_scaling\": null",
                "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                "\"low_freq_factor\": 1.0, "
                "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 512}");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(llama3->rope_scaling.factor, 8.0);
  EXPECT_EQ(llama3->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(llama3->rope_scaling.original_max_position_embeddings, 512);
  EXPECT_EQ(llama3->rope_theta, 10000.0);
  // yarn in transformers 5's form, original_max defaulting to max_position_embeddings.
  absl::StatusOr<LlamaConfig> yarn =
      ParseWith("\"rope_theta\": 10000.0,",
                "\"rope_parameters\": {\"rope_theta\": 20000.0, \"rope_type\": \"yarn\", "
                "\"factor\": 4.0, \"beta_fast\": 16, \"truncate\": false},");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope_theta, 20000.0);
  EXPECT_EQ(yarn->rope_scaling.original_max_position_embeddings, 2048);
  EXPECT_EQ(yarn->rope_scaling.beta_fast, 16.0);
  EXPECT_FALSE(yarn->rope_scaling.beta_slow.has_value());
  EXPECT_EQ(yarn->rope_scaling.truncate, false);
  absl::StatusOr<LlamaConfig> linear =
      ParseWith("\"rope_scaling\": null",
                "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_scaling.rope_type, "linear");
  absl::StatusOr<LlamaConfig> dynamic =
      ParseWith("\"rope_scaling\": null",
                "\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  EXPECT_EQ(dynamic->rope_scaling.factor, 2.0);
  for (const LlamaConfig& c : {*llama3, *yarn, *linear, *dynamic}) {
    std::string text = c.ToJson();
    absl::StatusOr<Json> json = ParseJson(text);
    ASSERT_TRUE(json.ok());
    EXPECT_EQ((*json)["rope_parameters"]["rope_type"], c.rope_scaling.rope_type);
    EXPECT_EQ((*json)["rope_parameters"]["rope_theta"].get<double>(), c.rope_theta);
    absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(text);
    ASSERT_TRUE(back.ok()) << back.status() << text;
    EXPECT_TRUE(*back == c) << text;
  }
}

TEST(LlamaConfigTest, ReadsTransformers5RopeParameters) {
  // transformers 5's save_pretrained writes no top-level rope_theta.
  absl::StatusOr<LlamaConfig> c = ParseWith(
      "\"rope_theta\": 10000.0,",
      "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"default\"},");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_theta, 500000.0);
  // A rope type this implementation does not compute: refused.
  absl::StatusOr<LlamaConfig> scaled = ParseWith(
      "\"rope_theta\": 10000.0,",
      "\"rope_parameters\": {\"rope_theta\": 500000.0, \"rope_type\": \"longrope\"},");
  EXPECT_EQ(scaled.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(scaled.status().message(), HasSubstr("rope_parameters.rope_type"));
  EXPECT_EQ(
      ParseWith("\"rope_theta\": 10000.0,", "\"rope_parameters\": 3,").status().code(),
      absl::StatusCode::kInvalidArgument);
}

TEST(LlamaConfigTest, ToJsonRoundTripsAndLooksLikeTransformers) {
  for (const std::string& name : LlamaConfig::PresetNames()) {
    absl::StatusOr<LlamaConfig> preset = LlamaConfig::Preset(name);
    ASSERT_TRUE(preset.ok()) << preset.status();
    std::string text = preset->ToJson();
    absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(text);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    EXPECT_TRUE(*back == *preset) << text;

    absl::StatusOr<Json> json = ParseJson(text);
    ASSERT_TRUE(json.ok()) << json.status();
    EXPECT_EQ((*json)["model_type"], preset->model_type);
    EXPECT_EQ((*json)["hidden_act"], "silu");
    EXPECT_EQ(DumpJson((*json)["architectures"]),
              absl::StrCat("[\"", preset->architecture, "\"]"));
    EXPECT_EQ((*json)["torch_dtype"], "float32");
  }
}

TEST(LlamaConfigTest, CarriesTheKeysItDoesNotModelThroughToJson) {
  // Token ids (an eos list, as Llama 3.1's), a value other than ToJson's
  // default (initializer_range) and keys transformers keeps come back as
  // they were; keys the config models are written canonically instead.
  absl::StatusOr<LlamaConfig> c = LlamaConfig::FromJson(absl::StrReplaceAll(
      kTinyLlamaConfig,
      {{"\"eos_token_id\": 2,",
        "\"eos_token_id\": [1, 8, 9], \"pad_token_id\": null, "
        "\"custom\": {\"a\": [1, \"b\"]}, \"dtype\": \"bfloat16\","},
       {"\"initializer_range\": 0.02,", "\"initializer_range\": 0.041,"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<Json> written = ParseJson(c->ToJson());
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(DumpJson((*written)["eos_token_id"]), "[1,8,9]");
  EXPECT_EQ((*written)["bos_token_id"], 1);
  EXPECT_TRUE((*written)["pad_token_id"].is_null());
  EXPECT_EQ((*written)["initializer_range"], 0.041);
  EXPECT_EQ(DumpJson((*written)["custom"]), R"({"a":[1,"b"]})");
  EXPECT_EQ((*written)["transformers_version"], "4.35.0");
  // Modeled: rope_scaling becomes rope_parameters, "dtype" is torch_dtype.
  EXPECT_FALSE(written->contains("rope_scaling"));
  EXPECT_FALSE(written->contains("dtype"));
  EXPECT_EQ((*written)["torch_dtype"], "bfloat16");
  EXPECT_TRUE(written->contains("rope_parameters"));
  // The carried keys never make another model.
  absl::StatusOr<LlamaConfig> plain = LlamaConfig::FromJson(kTinyLlamaConfig);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(*c == *plain);
  EXPECT_NE(c->carried_json, plain->carried_json);
  // Read back, the carried keys are the same.
  absl::StatusOr<LlamaConfig> back = LlamaConfig::FromJson(c->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), c->ToJson());
}

TEST(LlamaConfigTest, PresetsHaveTheAdvertisedSizes) {
  absl::StatusOr<LlamaConfig> tiny = LlamaConfig::Preset("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->vocab_size, 256);
  EXPECT_EQ(tiny->hidden_size, 256);
  EXPECT_EQ(tiny->num_hidden_layers, 4);
  EXPECT_EQ(tiny->num_attention_heads, 8);
  EXPECT_TRUE(tiny->tie_word_embeddings);
  EXPECT_TRUE(tiny->Validate().ok());
  EXPECT_EQ(tiny->NumParameters(), 4000000);
  absl::StatusOr<LlamaConfig> small = LlamaConfig::Preset("small");
  ASSERT_TRUE(small.ok());
  EXPECT_TRUE(small->Validate().ok());
  EXPECT_GT(small->NumParameters(), 25000000);
  EXPECT_LT(small->NumParameters(), 35000000);
  // Llama-3.2-1B, and its parameter count as transformers reports it.
  absl::StatusOr<LlamaConfig> llama1b = LlamaConfig::Preset("llama-3.2-1b");
  ASSERT_TRUE(llama1b.ok());
  EXPECT_TRUE(llama1b->Validate().ok());
  EXPECT_EQ(llama1b->vocab_size, 128256);
  EXPECT_EQ(llama1b->head_dim(), 64);
  EXPECT_EQ(llama1b->num_key_value_heads, 8);
  EXPECT_EQ(llama1b->rope_theta, 500000.0);
  EXPECT_TRUE(llama1b->tie_word_embeddings);
  EXPECT_EQ(llama1b->NumParameters(), 1235814400);
  EXPECT_EQ(llama1b->rope_scaling.rope_type, "llama3");
  EXPECT_EQ(llama1b->rope_scaling.factor, 32.0);
  EXPECT_EQ(llama1b->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(*LlamaConfig::Preset("llama-1b") == *llama1b);
  // Qwen2.5-0.5B and SmolLM2-135M, with the counts transformers reports.
  absl::StatusOr<LlamaConfig> qwen = LlamaConfig::Preset("qwen2.5-0.5b");
  ASSERT_TRUE(qwen.ok());
  EXPECT_EQ(qwen->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(qwen->NumParameters(), 494032768);
  absl::StatusOr<LlamaConfig> smol = LlamaConfig::Preset("smollm2-135m");
  ASSERT_TRUE(smol.ok());
  EXPECT_EQ(smol->architecture, "LlamaForCausalLM");
  EXPECT_EQ(smol->NumParameters(), 134515008);
  absl::StatusOr<LlamaConfig> none = LlamaConfig::Preset("huge");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      none.status().message(),
      HasSubstr("tiny, small, llama-3.2-1b, llama-1b, qwen2.5-0.5b, smollm2-135m"));
}

}  // namespace
}  // namespace memprofd
