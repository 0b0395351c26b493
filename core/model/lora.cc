#include "core/model/lora.h"

#include <ATen/ATen.h>

#include <cmath>
#include <mutex>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

constexpr char kAllLinear[] = "all-linear";

std::string TargetNames() {
  std::vector<std::string> names;
  for (const LoraTarget& t : kLoraTargets) names.emplace_back(t.name);
  return absl::StrJoin(names, ", ");
}

}  // namespace

double LoraOptions::Scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r))
                    : alpha / static_cast<double>(r);
}

std::vector<std::string> LoraOptions::Targets() const {
  const bool all = target_modules.size() == 1 && target_modules[0] == kAllLinear;
  std::vector<std::string> out;
  for (const LoraTarget& t : kLoraTargets) {
    for (const std::string& m : target_modules) {
      if (all || m == t.name) {
        out.emplace_back(t.name);
        break;
      }
    }
  }
  return out;
}

at::Tensor LoraDropout(const at::Tensor& x, double p, uint64_t seed) {
  at::Tensor u = at::empty(x.sizes(), x.options().dtype(at::kFloat));
  if (!x.is_meta()) {
    at::Generator gen = at::globalContext().defaultGenerator(x.device()).clone();
    {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(seed);
    }
    u.uniform_(0, 1, gen);
  }
  const at::Tensor dropped = u.ge(1.0 - p);
  u = at::Tensor();  // freed before the output is made
  // masked_fill rather than a product with the mask: no mixed-dtype kernel,
  // whose hidden float copy of the mask a plan could not see; backward keeps
  // the bool mask.
  return x.masked_fill(dropped, 0).mul_(1.0 / (1.0 - p));
}

std::pair<int64_t, int64_t> ProjectionShape(const LlamaConfig& config,
                                            const std::string& name) {
  const int64_t h = config.hidden_size;
  const int64_t q = config.num_attention_heads * config.head_dim();
  const int64_t kv = config.num_key_value_heads * config.head_dim();
  const int64_t inter = config.intermediate_size;
  if (name == "q_proj") return {q, h};
  if (name == "k_proj" || name == "v_proj") return {kv, h};
  if (name == "o_proj") return {h, q};
  if (name == "gate_proj" || name == "up_proj") return {inter, h};
  return {h, inter};  // down_proj
}

absl::Status ValidateLoraOptions(const LoraOptions& options) {
  if (options.r < 1 || options.r > kMaxLoraRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_r must be in [1, ", kMaxLoraRank, "], got ", options.r));
  }
  if (!std::isfinite(options.alpha) || options.alpha <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_alpha must be a finite number > 0, got ", options.alpha));
  }
  if (!(options.dropout >= 0 && options.dropout < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_dropout must be in [0, 1), got ", options.dropout));
  }
  if (options.target_modules.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("lora_targets is empty; name some of ",
                                                   TargetNames(), ", or all-linear"));
  }
  std::set<std::string> seen;
  for (const std::string& m : options.target_modules) {
    if (m == kAllLinear) {
      if (options.target_modules.size() > 1) {
        return absl::InvalidArgumentError(
            "lora_targets: all-linear targets every projection; give it alone");
      }
      continue;
    }
    bool known = false;
    for (const LoraTarget& t : kLoraTargets) known = known || m == t.name;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat("lora_targets: no projection ",
                                                     Echo(m), "; use ", TargetNames(),
                                                     ", or all-linear"));
    }
    if (!seen.insert(m).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora_targets names ", Echo(m), " twice"));
    }
  }
  return absl::OkStatus();
}

absl::string_view BaseDtypeName(BaseDtype dtype) {
  switch (dtype) {
    case BaseDtype::kFloat32:
      return "float32";
    case BaseDtype::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<BaseDtype> ParseBaseDtype(absl::string_view name) {
  for (BaseDtype d : {BaseDtype::kFloat32, BaseDtype::kBf16}) {
    if (name == BaseDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("base_dtype: unknown value ", Echo(name),
                   "; use float32 or bf16 (a LoRA run's frozen base in bf16)"));
}

absl::StatusOr<std::vector<std::string>> ParseLoraTargets(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("lora_targets ", Echo(text),
                       " has an empty name; write names joined by commas, "
                       "e.g. q_proj,v_proj, or all-linear"));
    }
    if (out.size() == kMaxLoraTargets) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora_targets names more than ", kMaxLoraTargets,
          " projections; a decoder layer has 7 (all-linear names them all)"));
    }
    out.emplace_back(part);
  }
  return out;
}

std::string LoraTargetsName(const std::vector<std::string>& targets) {
  return absl::StrJoin(targets, ",");
}

std::string AdapterConfigJson(const LoraOptions& options, const std::string& base_model) {
  const Json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"r", options.r},
      {"lora_alpha", options.alpha},
      {"lora_dropout", options.dropout},
      {"target_modules", options.Targets()},
      {"bias", "none"},
      {"use_rslora", options.use_rslora},
      {"use_dora", false},
      {"fan_in_fan_out", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"base_model_name_or_path", base_model},
  };
  return DumpJson(config, /*indent=*/2);
}

std::string PeftAdapterName(const std::string& name) {
  return absl::StrCat("base_model.model.", name);
}

absl::StatusOr<LoraOptions> LoraOptionsFromAdapterConfig(
    const std::string& json, std::vector<std::string>* notes) {
  ASSIGN_OR_RETURN(const Json config, ParseJson(json));
  auto bad = [](absl::string_view key, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter_config.json: ", key, " ", why));
  };
  if (!config.is_object()) return bad("(the file)", "is not a JSON object");
  // A key memprofd leaves at peft's default: absent, null, false, "none", or
  // empty.
  auto at_default = [&](const char* key) {
    const Json* v = JsonFind(config, key);
    return v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>()) ||
           (v->is_string() &&
            (v->get<std::string>() == "none" || v->get<std::string>().empty())) ||
           ((v->is_object() || v->is_array()) && v->empty());
  };
  const Json* type = JsonFind(config, "peft_type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "LORA") {
    return bad("peft_type", "is not \"LORA\": memprofd loads LoRA adapters only");
  }
  for (const char* key : {"use_dora", "bias", "fan_in_fan_out", "modules_to_save",
                          "layers_to_transform", "rank_pattern", "alpha_pattern"}) {
    if (!at_default(key)) {
      return bad(key, absl::StrCat("is ", DumpJson(*JsonFind(config, key)),
                                   ": memprofd computes plain LoRA only (peft's "
                                   "default for this key)"));
    }
  }
  LoraOptions o;
  const Json* r = JsonFind(config, "r");
  if (r == nullptr || !r->is_number_integer())
    return bad("r", "is missing or not an integer");
  o.r = r->get<int64_t>();
  if (const Json* alpha = JsonFind(config, "lora_alpha"); alpha != nullptr) {
    if (!alpha->is_number()) return bad("lora_alpha", "is not a number");
    o.alpha = alpha->get<double>();
  }
  if (const Json* dropout = JsonFind(config, "lora_dropout");
      dropout != nullptr && !dropout->is_null()) {
    if (!dropout->is_number()) return bad("lora_dropout", "is not a number");
    o.dropout = dropout->get<double>();
  }
  if (const Json* rs = JsonFind(config, "use_rslora"); rs != nullptr && !rs->is_null()) {
    if (!rs->is_boolean()) return bad("use_rslora", "is not true or false");
    o.use_rslora = rs->get<bool>();
  }
  const Json* targets = JsonFind(config, "target_modules");
  o.target_modules.clear();
  if (targets != nullptr && targets->is_string()) {
    o.target_modules.push_back(targets->get<std::string>());
  } else if (targets != nullptr && targets->is_array()) {
    for (const Json& t : *targets) {
      if (!t.is_string())
        return bad("target_modules", "holds a value that is not a name");
      o.target_modules.push_back(t.get<std::string>());
    }
  } else {
    return bad("target_modules", "is missing, or neither a name nor a list of names");
  }
  if (absl::Status valid = ValidateLoraOptions(o); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter_config.json: ", valid.message()));
  }
  if (o.dropout > 0) {
    notes->push_back(absl::StrCat("the adapters train with lora_dropout ", o.dropout,
                                  " (adapter_config.json's)"));
  }
  return o;
}

}  // namespace memprofd
