#include "core/model/config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat("config.json field \"", field, "\" ", problem));
}

// Reads integer `field` into *out; required fields must be present.
absl::Status ReadInt(const Json& root, absl::string_view field, bool required,
                     int64_t* out) {
  const Json* v = JsonFind(root, field);
  if (v == nullptr) {
    if (required) {
      return FieldError(field, "is missing; a Llama config needs it (an integer)");
    }
    return absl::OkStatus();
  }
  if (JsonToInt64(*v, out)) return absl::OkStatus();
  // 512.0 is an integer too, as Python would accept it.
  if (v->is_number_float() && v->get<double>() == std::floor(v->get<double>()) &&
      std::fabs(v->get<double>()) < 9e15) {
    *out = static_cast<int64_t>(v->get<double>());
    return absl::OkStatus();
  }
  return FieldError(field, absl::StrCat("must be an integer, got ", DumpJson(*v)));
}

absl::Status ReadDouble(const Json& root, absl::string_view field, double* out) {
  const Json* v = JsonFind(root, field);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) {
    return FieldError(field, absl::StrCat("must be a number, got ", DumpJson(*v)));
  }
  *out = v->get<double>();
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& root, absl::string_view field, bool* out) {
  const Json* v = JsonFind(root, field);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) {
    return FieldError(field, absl::StrCat("must be true or false, got ", DumpJson(*v)));
  }
  *out = v->get<bool>();
  return absl::OkStatus();
}

// A boolean option this implementation supports only as false.
absl::Status RequireFalse(const Json& root, absl::string_view field) {
  bool value = false;
  RETURN_IF_ERROR(ReadBool(root, field, &value));
  if (value) return FieldError(field, "is true, which is not supported; set it to false");
  return absl::OkStatus();
}

absl::Status Positive(absl::string_view field, int64_t value) {
  if (value <= 0) return FieldError(field, absl::StrCat("must be positive, got ", value));
  return absl::OkStatus();
}

// Reads the rotary settings as transformers 5.17's
// RotaryEmbeddingConfigMixin does: "rope_scaling" when set (older files),
// else "rope_parameters"; the type from "rope_type" or the older "type";
// rope_theta from the dict, else the top level; for llama3 and yarn,
// original_max_position_embeddings from the top level when given there
// (transformers gives that priority), else from the dict, else
// max_position_embeddings.
absl::Status ReadRope(const Json& root, LlamaConfig* c) {
  RETURN_IF_ERROR(ReadDouble(root, "rope_theta", &c->rope_theta));
  const char* field = "rope_scaling";
  const Json* rope = JsonFind(root, field);
  if (rope == nullptr || rope->is_null() || (rope->is_object() && rope->empty())) {
    field = "rope_parameters";
    rope = JsonFind(root, field);
  }
  if (rope == nullptr || rope->is_null()) return absl::OkStatus();
  if (!rope->is_object()) {
    return FieldError(field, absl::StrCat("must be an object, got ", DumpJson(*rope)));
  }
  auto sub = [&](absl::string_view key) { return absl::StrCat(field, ".", key); };
  RopeScaling& r = c->rope_scaling;
  const Json* type = JsonFind(*rope, "rope_type");
  if (type == nullptr) type = JsonFind(*rope, "type");
  if (type != nullptr && !type->is_null()) {
    if (!type->is_string()) {
      return FieldError(sub("rope_type"),
                        absl::StrCat("must be a string, got ", DumpJson(*type)));
    }
    r.rope_type = type->get<std::string>();
  }
  if (r.rope_type != "default" && r.rope_type != "linear" && r.rope_type != "llama3" &&
      r.rope_type != "yarn") {
    return FieldError(
        sub("rope_type"),
        absl::StrCat("is ", DumpJson(*type), "; supported: ", SupportedRopeTypes()));
  }
  RETURN_IF_ERROR(ReadDouble(*rope, "rope_theta", &c->rope_theta));
  double partial = 1.0;
  RETURN_IF_ERROR(ReadDouble(*rope, "partial_rotary_factor", &partial));
  if (partial != 1.0) {
    return FieldError(
        sub("partial_rotary_factor"),
        absl::StrCat("is ", partial, "; only 1 (the whole head) is supported"));
  }
  auto required = [&](absl::string_view key, double* out) -> absl::Status {
    if (JsonFind(*rope, key) == nullptr) {
      return FieldError(sub(key), absl::StrCat("is missing; rope_type \"", r.rope_type,
                                               "\" needs it (a number)"));
    }
    return ReadDouble(*rope, key, out);
  };
  auto optional = [&](absl::string_view key, std::optional<double>* out) -> absl::Status {
    const Json* v = JsonFind(*rope, key);
    if (v == nullptr || v->is_null()) return absl::OkStatus();
    double d = 0;
    RETURN_IF_ERROR(ReadDouble(*rope, key, &d));
    *out = d;
    return absl::OkStatus();
  };
  if (r.rope_type == "default") return absl::OkStatus();
  RETURN_IF_ERROR(required("factor", &r.factor));
  if (r.rope_type == "linear") return absl::OkStatus();
  if (r.rope_type == "llama3") {
    RETURN_IF_ERROR(required("low_freq_factor", &r.low_freq_factor));
    RETURN_IF_ERROR(required("high_freq_factor", &r.high_freq_factor));
  } else {
    RETURN_IF_ERROR(optional("attention_factor", &r.attention_factor));
    RETURN_IF_ERROR(optional("beta_fast", &r.beta_fast));
    RETURN_IF_ERROR(optional("beta_slow", &r.beta_slow));
    RETURN_IF_ERROR(optional("mscale", &r.mscale));
    RETURN_IF_ERROR(optional("mscale_all_dim", &r.mscale_all_dim));
    const Json* truncate = JsonFind(*rope, "truncate");
    if (truncate != nullptr && !truncate->is_null()) {
      bool t = true;
      RETURN_IF_ERROR(ReadBool(*rope, "truncate", &t));
      r.truncate = t;
    }
  }
  r.original_max_position_embeddings = c->max_position_embeddings;
  if (JsonFind(root, "original_max_position_embeddings") != nullptr) {
    RETURN_IF_ERROR(ReadInt(root, "original_max_position_embeddings", true,
                            &r.original_max_position_embeddings));
  } else {
    RETURN_IF_ERROR(ReadInt(*rope, "original_max_position_embeddings", false,
                            &r.original_max_position_embeddings));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfig::FromJson(absl::string_view json) {
  absl::StatusOr<Json> parsed = ParseJson(json);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json is not valid JSON: ", parsed.status().message()));
  }
  const Json& root = *parsed;
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config.json must hold a JSON object");
  }
  LlamaConfig c;

  const Json* model_type = JsonFind(root, "model_type");
  if (model_type != nullptr && *model_type != "llama") {
    return FieldError("model_type",
                      absl::StrCat("is ", DumpJson(*model_type),
                                   "; only \"llama\" (LlamaForCausalLM) is supported"));
  }
  const Json* archs = JsonFind(root, "architectures");
  if (archs != nullptr && !archs->is_null()) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
      return FieldError("architectures", absl::StrCat("must be [\"", kArchitecture,
                                                      "\"], got ", DumpJson(*archs)));
    }
    c.architecture = (*archs)[0].get<std::string>();
  } else if (model_type == nullptr) {
    return FieldError(
        "architectures",
        absl::StrCat("is missing (and there is no model_type); set it to [\"",
                     kArchitecture, "\"]"));
  }

  RETURN_IF_ERROR(ReadInt(root, "vocab_size", true, &c.vocab_size));
  RETURN_IF_ERROR(ReadInt(root, "hidden_size", true, &c.hidden_size));
  RETURN_IF_ERROR(ReadInt(root, "intermediate_size", true, &c.intermediate_size));
  RETURN_IF_ERROR(ReadInt(root, "num_hidden_layers", true, &c.num_hidden_layers));
  RETURN_IF_ERROR(ReadInt(root, "num_attention_heads", true, &c.num_attention_heads));
  // transformers: num_key_value_heads absent or null means plain multi-head.
  c.num_key_value_heads = c.num_attention_heads;
  const Json* kv = JsonFind(root, "num_key_value_heads");
  if (kv != nullptr && !kv->is_null()) {
    RETURN_IF_ERROR(ReadInt(root, "num_key_value_heads", true, &c.num_key_value_heads));
  }
  RETURN_IF_ERROR(
      ReadInt(root, "max_position_embeddings", false, &c.max_position_embeddings));
  RETURN_IF_ERROR(ReadDouble(root, "rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(ReadDouble(root, "rope_theta", &c.rope_theta));
  RETURN_IF_ERROR(ReadBool(root, "tie_word_embeddings", &c.tie_word_embeddings));

  // Newer transformers write "dtype" instead of "torch_dtype".
  const Json* dtype = JsonFind(root, "torch_dtype");
  if (dtype == nullptr) dtype = JsonFind(root, "dtype");
  if (dtype != nullptr && !dtype->is_null()) {
    if (!dtype->is_string()) {
      return FieldError("torch_dtype",
                        absl::StrCat("must be a string, got ", DumpJson(*dtype)));
    }
    c.torch_dtype = dtype->get<std::string>();
  }

  // Options that would change the math in ways this implementation does not
  // follow: refuse them rather than train a different model.
  const Json* act = JsonFind(root, "hidden_act");
  if (act != nullptr && *act != "silu") {
    return FieldError("hidden_act", absl::StrCat("is ", DumpJson(*act),
                                                 "; only \"silu\" is supported"));
  }
  RETURN_IF_ERROR(ReadRope(root, &c));
  RETURN_IF_ERROR(RequireFalse(root, "attention_bias"));
  RETURN_IF_ERROR(RequireFalse(root, "mlp_bias"));
  const Json* head_dim = JsonFind(root, "head_dim");
  if (head_dim != nullptr && !head_dim->is_null()) {
    RETURN_IF_ERROR(ReadInt(root, "head_dim", true, &c.explicit_head_dim));
    RETURN_IF_ERROR(Positive("head_dim", c.explicit_head_dim));
    // The same model either way; keeping 0 keeps the default's spelling.
    if (c.num_attention_heads > 0 &&
        c.explicit_head_dim * c.num_attention_heads == c.hidden_size) {
      c.explicit_head_dim = 0;
    }
  }

  RETURN_IF_ERROR(c.Validate());
  return c;
}

absl::string_view AttentionImplementationName(AttentionImplementation attention) {
  switch (attention) {
    case AttentionImplementation::kSdpa:
      return "sdpa";
    case AttentionImplementation::kEager:
      return "eager";
  }
  return "unknown";
}

absl::StatusOr<AttentionImplementation> ParseAttentionImplementation(
    absl::string_view name) {
  for (AttentionImplementation a :
       {AttentionImplementation::kSdpa, AttentionImplementation::kEager}) {
    if (name == AttentionImplementationName(a)) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "attn_implementation must be \"sdpa\" or \"eager\", not ", Echo(name)));
}

namespace {

// NumParameters' sum with every product checked: false when it overflows
// int64 (a config.json with hidden_size 2^32 passed every other check and
// made the plain sum signed overflow, found by fuzz/config_fuzz under UBSan).
bool CountParameters(const LlamaConfig& c, int64_t* out) {
  int64_t q_dim, kv_dim, hh, hkv, hi, per_layer, layers, embed, total;
  const bool overflow =
      __builtin_mul_overflow(c.head_dim(), c.num_attention_heads, &q_dim) ||
      __builtin_mul_overflow(c.head_dim(), c.num_key_value_heads, &kv_dim) ||
      __builtin_mul_overflow(c.hidden_size, q_dim, &hh) ||
      __builtin_mul_overflow(hh, int64_t{2}, &hh) ||  // q, o
      __builtin_mul_overflow(c.hidden_size, kv_dim, &hkv) ||
      __builtin_mul_overflow(hkv, int64_t{2}, &hkv) ||  // k, v
      __builtin_mul_overflow(c.hidden_size, c.intermediate_size, &hi) ||
      __builtin_mul_overflow(hi, int64_t{3}, &hi) ||  // gate, up, down
      __builtin_add_overflow(hh, hkv, &per_layer) ||
      __builtin_add_overflow(per_layer, hi, &per_layer) ||
      __builtin_add_overflow(per_layer, 2 * c.hidden_size, &per_layer) ||  // norms
      __builtin_mul_overflow(c.num_hidden_layers, per_layer, &layers) ||
      __builtin_mul_overflow(c.vocab_size, c.hidden_size, &embed) ||
      __builtin_mul_overflow(embed, int64_t{c.tie_word_embeddings ? 1 : 2}, &embed) ||
      __builtin_add_overflow(embed, layers, &total) ||
      __builtin_add_overflow(total, c.hidden_size, &total);
  if (overflow) return false;
  *out = total;
  return true;
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  if (architecture != kArchitecture) {
    return absl::InvalidArgumentError(absl::StrCat("unknown architecture \"",
                                                   architecture, "\"; only ",
                                                   kArchitecture, " is supported"));
  }
  RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  RETURN_IF_ERROR(Positive("num_hidden_layers", num_hidden_layers));
  RETURN_IF_ERROR(Positive("num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(Positive("num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  if (hidden_size % num_attention_heads != 0) {
    return FieldError(
        "hidden_size",
        absl::StrCat("(", hidden_size, ") must be a multiple of num_attention_heads (",
                     num_attention_heads, ")"));
  }
  if (explicit_head_dim < 0) {
    return FieldError("head_dim",
                      absl::StrCat("must be positive, got ", explicit_head_dim));
  }
  if (head_dim() % 2 != 0) {
    return FieldError(
        explicit_head_dim > 0 ? "head_dim" : "hidden_size",
        absl::StrCat(explicit_head_dim > 0 ? "" : "/ num_attention_heads ",
                     "must be even for the rotary embedding, got head_dim ", head_dim()));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return FieldError("num_attention_heads",
                      absl::StrCat("(", num_attention_heads,
                                   ") must be a multiple of num_key_value_heads (",
                                   num_key_value_heads, ")"));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return FieldError("rms_norm_eps",
                      absl::StrCat("must be positive, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return FieldError("rope_theta", absl::StrCat("must be positive, got ", rope_theta));
  }
  const RopeScaling& r = rope_scaling;
  if (r.rope_type != "default" && r.rope_type != "linear" && r.rope_type != "llama3" &&
      r.rope_type != "yarn") {
    return FieldError(
        "rope_parameters.rope_type",
        absl::StrCat("is \"", r.rope_type, "\"; supported: ", SupportedRopeTypes()));
  }
  if (r.rope_type != "default" && !(r.factor >= 1.0 && std::isfinite(r.factor))) {
    return FieldError("rope_parameters.factor",
                      absl::StrCat("must be a finite number >= 1, got ", r.factor));
  }
  if ((r.rope_type == "llama3" || r.rope_type == "yarn") &&
      r.original_max_position_embeddings <= 0) {
    return FieldError(
        "rope_parameters.original_max_position_embeddings",
        absl::StrCat("must be positive, got ", r.original_max_position_embeddings));
  }
  if (r.rope_type == "llama3" &&
      !(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor &&
        std::isfinite(r.high_freq_factor))) {
    return FieldError("rope_parameters.high_freq_factor",
                      absl::StrCat("(", r.high_freq_factor, ") must be finite and above ",
                                   "low_freq_factor (", r.low_freq_factor,
                                   "), which must be positive"));
  }
  if (torch_dtype != "float32" && torch_dtype != "bfloat16" && torch_dtype != "float16") {
    return FieldError(
        "torch_dtype",
        absl::StrCat("is \"", torch_dtype, "\"; use float32, bfloat16 or float16"));
  }
  if (int64_t n; !CountParameters(*this, &n)) {
    return FieldError("hidden_size",
                      absl::StrCat("(", hidden_size, ") with intermediate_size (",
                                   intermediate_size, "), vocab_size (", vocab_size,
                                   ") and num_hidden_layers (", num_hidden_layers,
                                   ") gives more than 2^63 parameters; check the sizes"));
  }
  return absl::OkStatus();
}

namespace {

// "rope_parameters" as transformers 5.17's save_pretrained writes it: the
// theta, the type and the fields the type reads (yarn's optional ones only
// when they were given).
Json RopeJson(const LlamaConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  Json j = {{"rope_theta", c.rope_theta}, {"rope_type", r.rope_type}};
  if (r.rope_type == "default") return j;
  j["factor"] = r.factor;
  if (r.rope_type == "linear") return j;
  j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if (r.rope_type == "llama3") {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
    return j;
  }
  auto put = [&](const char* key, const std::optional<double>& v) {
    if (v.has_value()) j[key] = *v;
  };
  put("attention_factor", r.attention_factor);
  put("beta_fast", r.beta_fast);
  put("beta_slow", r.beta_slow);
  put("mscale", r.mscale);
  put("mscale_all_dim", r.mscale_all_dim);
  if (r.truncate.has_value()) j["truncate"] = *r.truncate;
  return j;
}

}  // namespace

const char* SupportedRopeTypes() { return "default, linear, llama3, yarn"; }

bool operator==(const RopeScaling& a, const RopeScaling& b) {
  return a.rope_type == b.rope_type && a.factor == b.factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.attention_factor == b.attention_factor && a.beta_fast == b.beta_fast &&
         a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim && a.truncate == b.truncate;
}

std::string LlamaConfig::ToJson() const {
  // Json objects are written with sorted keys, as transformers writes them.
  const Json j = {
      {"architectures", Json::array({architecture})},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"head_dim", head_dim()},
      {"hidden_act", "silu"},
      {"hidden_size", hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", intermediate_size},
      {"max_position_embeddings", max_position_embeddings},
      {"mlp_bias", false},
      {"model_type", "llama"},
      {"num_attention_heads", num_attention_heads},
      {"num_hidden_layers", num_hidden_layers},
      {"num_key_value_heads", num_key_value_heads},
      {"pretraining_tp", 1},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_parameters", RopeJson(*this)},
      // transformers 4 reads it here (5.17 from rope_parameters, first).
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"torch_dtype", torch_dtype},
      {"use_cache", true},
      {"vocab_size", vocab_size},
  };
  return DumpJson(j, 2) + "\n";
}

int64_t LlamaConfig::NumParameters() const {
  int64_t n = 0;
  return CountParameters(*this, &n) ? n : -1;
}

std::vector<std::string> LlamaConfig::PresetNames() {
  return {"tiny", "small", "llama-3.2-1b", "llama-1b"};
}

absl::StatusOr<LlamaConfig> LlamaConfig::Preset(absl::string_view name) {
  LlamaConfig c;
  c.vocab_size = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  if (name == "tiny") {
    c.hidden_size = 256;
    c.intermediate_size = 1024;
    c.num_hidden_layers = 4;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 4;
    c.max_position_embeddings = 512;
    return c;
  }
  if (name == "small") {
    c.hidden_size = 512;
    c.intermediate_size = 1792;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 1024;
    return c;
  }
  if (name == "llama-3.2-1b" || name == "llama-1b") {
    // Llama-3.2-1B as its config.json gives it: 1,235,814,400 parameters,
    // 4.9 GB in float32, about 20 GB with gradients and AdamW state; meant
    // for a GPU. The daemon's byte-level data use ids < 256 of the 128256;
    // a token file can use them all. The rotary tables for all 131072
    // positions take 64 MiB on the device.
    c.vocab_size = 128256;
    c.hidden_size = 2048;
    c.intermediate_size = 8192;
    c.num_hidden_layers = 16;
    c.num_attention_heads = 32;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 131072;
    c.rope_theta = 500000.0;
    c.rope_scaling.rope_type = "llama3";
    c.rope_scaling.factor = 32.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 8192;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset ", Echo(name),
                   "; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

bool operator==(const LlamaConfig& a, const LlamaConfig& b) {
  return a.architecture == b.architecture && a.vocab_size == b.vocab_size &&
         a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling == b.rope_scaling && a.head_dim() == b.head_dim() &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.torch_dtype == b.torch_dtype;
}

}  // namespace memprofd
