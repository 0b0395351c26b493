#include "core/model/config.h"

#include <cmath>

#include "absl/algorithm/container.h"
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

// The rope types RotaryInverseFrequencies computes: the one list, for the
// checks and for SupportedRopeTypes()'s message.
constexpr absl::string_view kRopeTypes[] = {"default", "linear", "dynamic", "llama3",
                                            "yarn"};

bool IsSupportedRopeType(absl::string_view type) {
  return absl::c_linear_search(kRopeTypes, type);
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

const ModelFamily* FamilyOfArchitecture(absl::string_view architecture) {
  for (const ModelFamily& f : ModelFamilies()) {
    if (architecture == f.architecture) return &f;
  }
  return nullptr;
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
// them) and ToJson writes each that applies from the fields, canonically
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

// The keys of `root` (an object) that kModeledKeys does not name, as an
// object's text; empty when there are none.
std::string CarriedKeys(const Json& root) {
  Json carried = Json::object();
  for (const auto& [key, value] : root.items()) {
    if (absl::c_find(kModeledKeys, key) == std::end(kModeledKeys)) carried[key] = value;
  }
  return carried.empty() ? std::string() : DumpJson(carried);
}

// More decoder layers than any real model has by far; it bounds the
// per-layer lists (layer_types) a config.json can make the daemon build.
constexpr int64_t kMaxHiddenLayers = int64_t{1} << 20;

absl::Status LayerCountWithinLimit(int64_t layers) {
  if (layers > kMaxHiddenLayers) {
    return FieldError(
        "num_hidden_layers",
        absl::StrCat("is ", layers, "; at most ", kMaxHiddenLayers, " are supported"));
  }
  return absl::OkStatus();
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

}  // namespace

const std::vector<ModelFamily>& ModelFamilies() {
  static const std::vector<ModelFamily> families = {
      {"llama", "LlamaForCausalLM", 2048, 0},
      {"mistral", "MistralForCausalLM", 131072, 0},
      {"qwen2", "Qwen2ForCausalLM", 32768, 0},
      {"qwen3", "Qwen3ForCausalLM", 32768, 128},
  };
  return families;
}

std::string SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ModelFamily& f : ModelFamilies()) names.push_back(f.architecture);
  return absl::StrJoin(names, ", ");
}

int64_t LlamaConfig::head_dim() const {
  if (explicit_head_dim > 0) return explicit_head_dim;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

int64_t LlamaConfig::LayerWindow(int64_t index) const {
  if (sliding_window <= 0) return 0;
  if (model_type == "mistral") return sliding_window;
  if (index >= 0 && index < static_cast<int64_t>(layer_types.size()) &&
      layer_types[static_cast<size_t>(index)] == "sliding_attention") {
    return sliding_window;
  }
  return 0;
}

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
  int64_t q_dim, kv_dim, hh, hkv, hi, per_layer, layers, embed, total, biases;
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
      // q/k/v, o, MLP biases and the q/k norms: sums of sizes already checked
      __builtin_add_overflow(
          (c.qkv_bias() ? q_dim + 2 * kv_dim : 0) + (c.o_bias() ? c.hidden_size : 0) +
              (c.qk_norm() ? 2 * c.head_dim() : 0),
          c.mlp_bias ? 2 * c.intermediate_size + c.hidden_size : 0, &biases) ||
      __builtin_add_overflow(per_layer, biases, &per_layer) ||
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
  const ModelFamily* family = FamilyOfArchitecture(architecture);
  if (family == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown architecture ", Echo(architecture),
                     "; supported: ", SupportedArchitectures()));
  }
  if (model_type != family->model_type) {
    return FieldError("model_type",
                      absl::StrCat("is ", Echo(model_type), " but ", architecture,
                                   " is model_type \"", family->model_type, "\""));
  }
  RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  RETURN_IF_ERROR(Positive("num_hidden_layers", num_hidden_layers));
  RETURN_IF_ERROR(Positive("num_attention_heads", num_attention_heads));
  RETURN_IF_ERROR(Positive("num_key_value_heads", num_key_value_heads));
  RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  // transformers' LlamaConfig refuses it even with a head_dim; the others
  // need it only to derive head_dim.
  if (hidden_size % num_attention_heads != 0 &&
      (model_type == "llama" || explicit_head_dim == 0)) {
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
  if (!(rope_theta >= 1) || !std::isfinite(rope_theta)) {
    // Below 1 no model trains (published ones use 1e4 to 1e6), and a base
    // under float32's range makes every rotary frequency infinite.
    return FieldError("rope_theta",
                      absl::StrCat("must be a finite number >= 1, got ", rope_theta));
  }
  if (sliding_window < 0) {
    return FieldError("sliding_window",
                      absl::StrCat("must be positive or null, got ", sliding_window));
  }
  if (!layer_types.empty()) {
    if (static_cast<int64_t>(layer_types.size()) != num_hidden_layers) {
      return FieldError("layer_types",
                        absl::StrCat("has ", layer_types.size(), " entries for ",
                                     num_hidden_layers, " layers; give one per layer"));
    }
    for (const std::string& type : layer_types) {
      if (type != "full_attention" && type != "sliding_attention") {
        return FieldError(
            "layer_types",
            absl::StrCat("holds ", Echo(type),
                         "; use \"full_attention\" or \"sliding_attention\""));
      }
    }
  }
  const RopeScaling& r = rope_scaling;
  if (!IsSupportedRopeType(r.rope_type)) {
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
  if (r.rope_type == "yarn") {
    const std::pair<const char*, const std::optional<double>*> positive[] = {
        {"beta_fast", &r.beta_fast}, {"beta_slow", &r.beta_slow}};
    for (const auto& [name, value] : positive) {
      // transformers reads 0 (falsy) as its default; below 0 the YaRN ramp's
      // logarithm is not defined.
      if (value->has_value() && !(**value >= 0 && std::isfinite(**value))) {
        return FieldError(absl::StrCat("rope_parameters.", name),
                          absl::StrCat("must be a finite number >= 0, got ", **value));
      }
    }
    const std::pair<const char*, const std::optional<double>*> finite[] = {
        {"mscale", &r.mscale}, {"mscale_all_dim", &r.mscale_all_dim}};
    for (const auto& [name, value] : finite) {
      if (value->has_value() && !std::isfinite(**value)) {
        return FieldError(absl::StrCat("rope_parameters.", name),
                          absl::StrCat("must be finite, got ", **value));
      }
    }
    const double attention = RopeAttentionFactor(r);
    if (!(attention > 0 && attention <= kMaxRopeAttentionFactor)) {
      return FieldError(
          r.attention_factor ? "rope_parameters.attention_factor"
                             : "rope_parameters.mscale",
          absl::StrCat("gives an attention factor of ", attention,
                       " on cos and sin; it must be in (0, ", kMaxRopeAttentionFactor,
                       "] (published YaRN models use 1 to about 1.5)"));
    }
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
  RETURN_IF_ERROR(LayerCountWithinLimit(num_hidden_layers));
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

double RopeAttentionFactor(const RopeScaling& r) {
  if (r.rope_type != "yarn") return 1.0;
  if (r.attention_factor.has_value()) return *r.attention_factor;
  auto get_mscale = [](double scale, double mscale) {
    return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
  };
  if (r.mscale.value_or(0) != 0 && r.mscale_all_dim.value_or(0) != 0) {
    return get_mscale(r.factor, *r.mscale) / get_mscale(r.factor, *r.mscale_all_dim);
  }
  return get_mscale(r.factor, 1.0);
}

const char* SupportedRopeTypes() {
  static const std::string names = absl::StrJoin(kRopeTypes, ", ");
  return names.c_str();
}

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
        if (absl::c_find(kModeledKeys, key) == std::end(kModeledKeys)) j[key] = value;
      }
    }
  }
  return DumpJson(j, 2) + "\n";
}

int64_t LlamaConfig::NumParameters() const {
  int64_t n = 0;
  return CountParameters(*this, &n) ? n : -1;
}

std::vector<std::string> LlamaConfig::PresetNames() {
  return {"tiny", "small", "llama-3.2-1b", "llama-1b", "qwen2.5-0.5b", "smollm2-135m"};
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
  if (name == "qwen2.5-0.5b") {
    // Qwen2.5-0.5B as its config.json gives it (its sliding window is
    // configured but off: use_sliding_window false).
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.vocab_size = 151936;
    c.hidden_size = 896;
    c.intermediate_size = 4864;
    c.num_hidden_layers = 24;
    c.num_attention_heads = 14;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 32768;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1000000.0;
    c.max_window_layers = 24;
    c.layer_types.assign(24, "full_attention");
    return c;
  }
  if (name == "smollm2-135m") {
    // SmolLM2-135M as its config.json gives it.
    c.vocab_size = 49152;
    c.hidden_size = 576;
    c.intermediate_size = 1536;
    c.num_hidden_layers = 30;
    c.num_attention_heads = 9;
    c.num_key_value_heads = 3;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100000.0;
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset ", Echo(name),
                   "; known presets: ", absl::StrJoin(PresetNames(), ", ")));
}

bool operator==(const LlamaConfig& a, const LlamaConfig& b) {
  return a.architecture == b.architecture && a.model_type == b.model_type &&
         a.attention_bias == b.attention_bias && a.mlp_bias == b.mlp_bias &&
         a.sliding_window == b.sliding_window &&
         a.max_window_layers == b.max_window_layers && a.layer_types == b.layer_types &&
         a.vocab_size == b.vocab_size && a.hidden_size == b.hidden_size &&
         a.intermediate_size == b.intermediate_size &&
         a.num_hidden_layers == b.num_hidden_layers &&
         a.num_attention_heads == b.num_attention_heads &&
         a.num_key_value_heads == b.num_key_value_heads &&
         a.max_position_embeddings == b.max_position_embeddings &&
         a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
         a.rope_scaling == b.rope_scaling && a.head_dim() == b.head_dim() &&
         a.tie_word_embeddings == b.tie_word_embeddings && a.torch_dtype == b.torch_dtype;
}

}  // namespace memprofd
