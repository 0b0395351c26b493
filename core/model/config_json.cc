// LlamaConfig::FromJson and ToJson: config.json as transformers 5.17 reads
// and writes it for the Llama-family classes.

#include <cmath>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"
#include "core/model/config.h"
#include "core/model/internal/config_checks.h"

namespace memprofd {
namespace {

using config_internal::FamilyOfArchitecture;
using config_internal::FieldError;
using config_internal::IsSupportedRopeType;
using config_internal::LayerCountWithinLimit;
using config_internal::Positive;

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
  if (!IsSupportedRopeType(r.rope_type)) {
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
  if (r.rope_type == "linear" || r.rope_type == "dynamic") return absl::OkStatus();
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

const ModelFamily* FamilyOfModelType(absl::string_view model_type) {
  for (const ModelFamily& f : ModelFamilies()) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

// The family config.json names: by model_type and "architectures", which
// must agree when both are given (AutoModelForCausalLM picks the class by
// model_type; the daemon refuses a file whose two fields disagree rather
// than guess).
absl::StatusOr<const ModelFamily*> ReadFamily(const Json& root) {
  const ModelFamily* by_type = nullptr;
  const Json* model_type = JsonFind(root, "model_type");
  if (model_type != nullptr && !model_type->is_null()) {
    if (model_type->is_string())
      by_type = FamilyOfModelType(model_type->get<std::string>());
    if (by_type == nullptr) {
      const std::string types = absl::StrJoin(
          ModelFamilies(), ", ",
          [](std::string* out, const ModelFamily& f) { out->append(f.model_type); });
      return FieldError("model_type",
                        absl::StrCat("is ", DumpJson(*model_type), "; supported: ", types,
                                     " (", SupportedArchitectures(), ")"));
    }
  }
  const Json* archs = JsonFind(root, "architectures");
  if (archs == nullptr || archs->is_null()) {
    if (by_type != nullptr) return by_type;
    return FieldError(
        "architectures",
        absl::StrCat("is missing (and there is no model_type); name one of ",
                     SupportedArchitectures(), ", as [\"LlamaForCausalLM\"]"));
  }
  const ModelFamily* by_arch = nullptr;
  if (archs->is_array() && archs->size() == 1 && (*archs)[0].is_string()) {
    by_arch = FamilyOfArchitecture((*archs)[0].get<std::string>());
  }
  if (by_arch == nullptr) {
    return FieldError(
        "architectures",
        absl::StrCat("is ", DumpJson(*archs), "; it must name one of ",
                     SupportedArchitectures(), ", as [\"LlamaForCausalLM\"]"));
  }
  if (by_type != nullptr && by_type != by_arch) {
    return FieldError("architectures",
                      absl::StrCat("names ", by_arch->architecture,
                                   " but model_type is \"", by_type->model_type, "\" (",
                                   by_type->architecture, "); make them agree"));
  }
  return by_arch;
}

// sliding_window as transformers reads it: absent -> `absent`, null -> 0
// (none), else a positive integer.
absl::Status ReadWindow(const Json& root, int64_t absent, int64_t* out) {
  const Json* v = JsonFind(root, "sliding_window");
  if (v == nullptr) {
    *out = absent;
    return absl::OkStatus();
  }
  if (v->is_null()) {
    *out = 0;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ReadInt(root, "sliding_window", true, out));
  return Positive("sliding_window", *out);
}

// The config.json keys LlamaConfig models: FromJson reads them (or refuses

// ("rope_scaling" and "dtype" as "rope_parameters" and "torch_dtype").
// Every other key is carried through unchanged (LlamaConfig::carried_json).
constexpr absl::string_view kModeledKeys[] = {
    "architectures",
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
    "hidden_act",
    "attention_dropout",
    "head_dim",
    "attention_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
};

bool IsModeledKey(absl::string_view key) {
  return absl::c_linear_search(kModeledKeys, key);
}

// The keys of `root` (an object) that kModeledKeys does not name, as an
// object's text; empty when there are none.
std::string CarriedKeys(const Json& root) {
  Json carried = Json::object();
  for (const auto& [key, value] : root.items()) {
    if (!IsModeledKey(key)) carried[key] = value;
  }
  return carried.empty() ? std::string() : DumpJson(carried);
}

// The fields only some families read, as each transformers config class
// reads them (a field another family would read is ignored, as transformers
// ignores it).
absl::Status ReadFamilyFields(const Json& root, LlamaConfig* c) {
  constexpr int64_t kDefaultWindow = 4096;  // MistralConfig, Qwen2Config, Qwen3Config
  if (c->model_type == "llama") {
    RETURN_IF_ERROR(ReadBool(root, "attention_bias", &c->attention_bias));
    RETURN_IF_ERROR(ReadBool(root, "mlp_bias", &c->mlp_bias));
    return absl::OkStatus();
  }
  if (c->model_type == "mistral") {
    return ReadWindow(root, kDefaultWindow, &c->sliding_window);
  }
  // qwen2, qwen3
  if (c->model_type == "qwen3") {
    RETURN_IF_ERROR(ReadBool(root, "attention_bias", &c->attention_bias));
  }
  bool use_sliding_window = false;
  RETURN_IF_ERROR(ReadBool(root, "use_sliding_window", &use_sliding_window));
  int64_t window = 0;
  RETURN_IF_ERROR(ReadWindow(root, kDefaultWindow, &window));
  c->sliding_window = use_sliding_window ? window : 0;
  RETURN_IF_ERROR(ReadInt(root, "max_window_layers", false, &c->max_window_layers));
  if (c->max_window_layers < 0) {
    return FieldError("max_window_layers",
                      absl::StrCat("must be >= 0, got ", c->max_window_layers));
  }
  const Json* types = JsonFind(root, "layer_types");
  if (types != nullptr && !types->is_null()) {
    if (!types->is_array()) {
      return FieldError("layer_types", absl::StrCat("must be a list of strings, got ",
                                                    DumpJson(*types)));
    }
    for (const Json& t : *types) {
      if (!t.is_string()) {
        return FieldError("layer_types", absl::StrCat("must be a list of strings, got ",
                                                      DumpJson(*types)));
      }
      c->layer_types.push_back(t.get<std::string>());
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(LayerCountWithinLimit(c->num_hidden_layers));
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
    c->layer_types.push_back(c->sliding_window > 0 && i >= c->max_window_layers
                                 ? "sliding_attention"
                                 : "full_attention");
  }
  return absl::OkStatus();
}

// "rope_parameters" as transformers 5.17's save_pretrained writes it: the
// theta, the type and the fields the type reads (yarn's optional ones only
// when they were given).
Json RopeJson(const LlamaConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  Json j = {{"rope_theta", c.rope_theta}, {"rope_type", r.rope_type}};
  if (r.rope_type == "default") return j;
  j["factor"] = r.factor;
  if (r.rope_type == "linear" || r.rope_type == "dynamic") return j;
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

  ASSIGN_OR_RETURN(const ModelFamily* family, ReadFamily(root));
  c.architecture = family->architecture;
  c.model_type = family->model_type;
  c.max_position_embeddings = family->default_max_position_embeddings;
  c.explicit_head_dim = family->default_head_dim;

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
  double attention_dropout = 0.0;
  RETURN_IF_ERROR(ReadDouble(root, "attention_dropout", &attention_dropout));
  if (attention_dropout != 0.0) {
    return FieldError("attention_dropout",
                      absl::StrCat("is ", attention_dropout,
                                   "; the daemon trains without dropout, set it to 0"));
  }
  RETURN_IF_ERROR(ReadRope(root, &c));
  RETURN_IF_ERROR(ReadFamilyFields(root, &c));
  const Json* head_dim = JsonFind(root, "head_dim");
  if (head_dim != nullptr && head_dim->is_null()) {
    c.explicit_head_dim = 0;  // null: hidden_size / num_attention_heads
  } else if (head_dim != nullptr) {
    RETURN_IF_ERROR(ReadInt(root, "head_dim", true, &c.explicit_head_dim));
    RETURN_IF_ERROR(Positive("head_dim", c.explicit_head_dim));
  }
  // The same model either way; keeping 0 keeps the default's spelling.
  if (c.num_attention_heads > 0 &&
      c.explicit_head_dim * c.num_attention_heads == c.hidden_size) {
    c.explicit_head_dim = 0;
  }

  RETURN_IF_ERROR(c.Validate());
  c.carried_json = CarriedKeys(root);
  return c;
}

std::string LlamaConfig::ToJson() const {
  // Json objects are written with sorted keys, as transformers writes them.
  Json j = {
      {"architectures", Json::array({architecture})},
      {"attention_dropout", 0.0},
      {"head_dim", head_dim()},
      {"hidden_act", "silu"},
      {"hidden_size", hidden_size},
      {"initializer_range", 0.02},
      {"intermediate_size", intermediate_size},
      {"max_position_embeddings", max_position_embeddings},
      {"model_type", model_type},
      {"num_attention_heads", num_attention_heads},
      {"num_hidden_layers", num_hidden_layers},
      {"num_key_value_heads", num_key_value_heads},
      {"rms_norm_eps", rms_norm_eps},
      {"rope_parameters", RopeJson(*this)},
      // transformers 4 reads it here (5.17 from rope_parameters, first).
      {"rope_theta", rope_theta},
      {"tie_word_embeddings", tie_word_embeddings},
      {"torch_dtype", torch_dtype},
      {"use_cache", true},
      {"vocab_size", vocab_size},
  };
  // Each family's own fields, as its config class writes them.
  const Json window = sliding_window > 0 ? Json(sliding_window) : Json(nullptr);
  if (model_type == "llama") {
    j["attention_bias"] = attention_bias;
    j["mlp_bias"] = mlp_bias;
    j["pretraining_tp"] = 1;
  } else if (model_type == "mistral") {
    j["sliding_window"] = window;
  } else {  // qwen2, qwen3
    if (model_type == "qwen3") j["attention_bias"] = attention_bias;
    // Qwen2Config has no head_dim field; transformers writes one only when
    // it was given.
    if (model_type == "qwen2" && explicit_head_dim == 0) j.erase("head_dim");
    j["use_sliding_window"] = sliding_window > 0;
    j["sliding_window"] = window;
    j["max_window_layers"] = max_window_layers;
    j["layer_types"] = layer_types;
  }
  if (!carried_json.empty()) {
    // Parsed by FromJson from an object already; a hand-made config whose
    // text is not one is written without it rather than not at all.
    absl::StatusOr<Json> carried = ParseJson(carried_json);
    if (carried.ok() && carried->is_object()) {
      for (const auto& [key, value] : carried->items()) {
        if (!IsModeledKey(key)) j[key] = value;
      }
    }
  }
  return DumpJson(j, 2) + "\n";
}

}  // namespace memprofd
