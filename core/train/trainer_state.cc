#include "core/train/trainer_state.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/common/json.h"
#include "core/common/status_macros.h"

namespace memprofd {
namespace {

constexpr char kFormatName[] = "memprofd-trainer-state";

struct DataKindName {
  DataSpec::Kind kind;
  const char* name;
};
constexpr DataKindName kDataKinds[] = {
    {DataSpec::Kind::kEmbeddedCorpus, "embedded_corpus"},
    {DataSpec::Kind::kTextFile, "text_file"},
    {DataSpec::Kind::kTokenFile, "token_file"},
    {DataSpec::Kind::kInlineTokens, "inline_tokens"},
    {DataSpec::Kind::kIndexedDataset, "indexed_dataset"},
};

Json DataToJson(const DataSpec& d) {
  const char* kind = "embedded_corpus";
  for (const auto& k : kDataKinds) {
    if (k.kind == d.kind) kind = k.name;
  }
  return {{"kind", kind},
          {"path", d.path},
          {"bytes_per_token", d.bytes_per_token},
          {"tokens", d.tokens},
          {"windows", DataWindowsName(d.windows)}};
}

// The run's configuration: request_fields.h's fields by name, and the data
// sources. The schedule's position is the run's steps_completed: only its
// shape is kept.
Json OptionsToJson(const TrainOptions& o) {
  Json j = Json::object();
#define MEMPROFD_VALUE_TO_JSON_(name, type, member) j[#name] = o.member;
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_VALUE_TO_JSON_)
#undef MEMPROFD_VALUE_TO_JSON_
#define MEMPROFD_CHOICE_TO_JSON_(name, member, parse, name_of) \
  j[#name] = std::string(name_of(o.member));
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_CHOICE_TO_JSON_)
#undef MEMPROFD_CHOICE_TO_JSON_
  j["data"] = DataToJson(o.data);
  j["eval_data"] = o.eval_data ? DataToJson(*o.eval_data) : Json(nullptr);
  return j;
}

// Reads typed members of one JSON object; the first failure is kept and
// named by its dotted path.
class Reader {
 public:
  // `absent` (optional): the values of members that states written by older
  // versions lack, read when `object` has no such member.
  Reader(const Json& object, std::string where, absl::Status* error,
         const Json* absent = nullptr)
      : object_(object), absent_(absent), where_(std::move(where)), error_(error) {}

  const Json* Get(const char* key) {
    const Json* v = JsonFind(object_, key);
    if (v == nullptr && absent_ != nullptr) v = JsonFind(*absent_, key);
    if (v == nullptr) Fail(key, "is missing");
    return v;
  }
  int64_t Int(const char* key) {
    const Json* v = Get(key);
    int64_t out = 0;
    if (v != nullptr && !JsonToInt64(*v, &out)) Fail(key, "is not an integer");
    return out;
  }
  uint64_t Uint(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return 0;
    if (!v->is_number_unsigned()) {
      int64_t i = 0;
      if (JsonToInt64(*v, &i) && i >= 0) return static_cast<uint64_t>(i);
      Fail(key, "is not an unsigned integer");
      return 0;
    }
    return v->get<uint64_t>();
  }
  double Double(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return 0;
    if (!v->is_number()) {
      Fail(key, "is not a number");
      return 0;
    }
    return v->get<double>();
  }
  bool Bool(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return false;
    if (!v->is_boolean()) {
      Fail(key, "is not true or false");
      return false;
    }
    return v->get<bool>();
  }
  std::string String(const char* key) {
    const Json* v = Get(key);
    if (v == nullptr) return {};
    if (!v->is_string()) {
      Fail(key, "is not a string");
      return {};
    }
    return v->get<std::string>();
  }
  // The typed getter for a field of request_fields.h's TYPE.
  void Read(const char* key, int64_t* out) { *out = Int(key); }
  void Read(const char* key, uint64_t* out) { *out = Uint(key); }
  void Read(const char* key, double* out) { *out = Double(key); }
  void Read(const char* key, bool* out) { *out = Bool(key); }
  // A named choice: its name, parsed by `parse`.
  template <typename Enum, typename Parse>
  void ReadChoice(const char* key, Parse parse, Enum* out) {
    const std::string name = String(key);
    if (!error_->ok()) return;
    absl::StatusOr<Enum> parsed = parse(name);
    if (parsed.ok()) {
      *out = *parsed;
    } else {
      Fail(key, parsed.status().message());
    }
  }
  // A member that must be an object; nullptr (and the error set) otherwise.
  const Json* Object(const char* key) {
    const Json* v = Get(key);
    if (v != nullptr && !v->is_object()) {
      Fail(key, "is not an object");
      return nullptr;
    }
    return v;
  }
  std::string Path(const char* key) const { return absl::StrCat(where_, key); }
  void Fail(const char* key, absl::string_view why) {
    if (error_->ok())
      *error_ = absl::InvalidArgumentError(absl::StrCat(Path(key), " ", why));
  }

 private:
  const Json& object_;
  const Json* const absent_;
  const std::string where_;
  absl::Status* error_;
};

DataSpec DataFromJson(const Json& v, absl::Status* error) {
  Reader r(v, "run.config.data.", error);
  DataSpec d;
  const std::string kind = r.String("kind");
  bool known = false;
  for (const auto& k : kDataKinds) {
    if (kind == k.name) {
      d.kind = k.kind;
      known = true;
    }
  }
  if (!known && error->ok()) r.Fail("kind", absl::StrCat("\"", kind, "\" is unknown"));
  d.path = r.String("path");
  d.bytes_per_token = static_cast<int>(r.Int("bytes_per_token"));
  // Absent from states written before indexed datasets: packed.
  if (r.Get("windows") != nullptr) {
    absl::StatusOr<DataSpec::Windows> windows = ParseDataWindows(r.String("windows"));
    if (windows.ok()) {
      d.windows = *windows;
    } else if (error->ok()) {
      r.Fail("windows", windows.status().message());
    }
  }
  if (const Json* tokens = r.Get("tokens"); tokens != nullptr) {
    if (!tokens->is_array()) r.Fail("tokens", "is not an array");
    for (const Json& t : tokens->is_array() ? *tokens : Json::array()) {
      int64_t id = 0;
      if (!JsonToInt64(t, &id)) {
        r.Fail("tokens", "holds a value that is not an integer");
        break;
      }
      d.tokens.push_back(id);
    }
  }
  return d;
}

TrainOptions OptionsFromJson(const Json& v, absl::Status* error) {
  // States written before the chunked loss have no loss_chunk_tokens: their
  // runs materialized the logits, and are kept so, to resume bit for bit.
  // Nor did they train LoRA adapters.
  static const Json* const kAbsent =
      new Json{{"loss_chunk_tokens", kLossChunkOff},
               {"lora_r", 0},
               {"lora_alpha", LoraOptions().alpha},
               {"lora_use_rslora", false},
               {"lora_dropout", 0.0},
               {"lora_targets", LoraTargetsName(LoraOptions().target_modules)},
               {"base_dtype", std::string(BaseDtypeName(BaseDtype::kFloat32))}};
  Reader r(v, "run.config.", error, kAbsent);
  TrainOptions o;
#define MEMPROFD_VALUE_FROM_JSON_(name, type, member) r.Read(#name, &o.member);
  MEMPROFD_TRAIN_VALUE_FIELDS(MEMPROFD_VALUE_FROM_JSON_)
#undef MEMPROFD_VALUE_FROM_JSON_
#define MEMPROFD_CHOICE_FROM_JSON_(name, member, parse, name_of) \
  r.ReadChoice(#name, parse, &o.member);
  MEMPROFD_TRAIN_CHOICE_FIELDS(MEMPROFD_CHOICE_FROM_JSON_)
#undef MEMPROFD_CHOICE_FROM_JSON_
  if (const Json* data = r.Object("data"); data != nullptr)
    o.data = DataFromJson(*data, error);
  if (const Json* eval = r.Get("eval_data"); eval != nullptr && !eval->is_null()) {
    if (eval->is_object()) {
      o.eval_data = DataFromJson(*eval, error);
    } else {
      r.Fail("eval_data", "is not an object or null");
    }
  }
  return o;
}

}  // namespace

std::string TrainOptionsToJson(const TrainOptions& options) {
  return DumpJson(OptionsToJson(options), -1);
}

absl::StatusOr<TrainOptions> TrainOptionsFromJson(absl::string_view text) {
  absl::StatusOr<Json> parsed = ParseJson(text);
  if (!parsed.ok()) return absl::InvalidArgumentError(parsed.status().message());
  if (!parsed->is_object())
    return absl::InvalidArgumentError("training options are not a JSON object");
  absl::Status error;
  TrainOptions options = OptionsFromJson(*parsed, &error);
  if (!error.ok()) return absl::InvalidArgumentError(error.message());
  return options;
}

std::string TrainerStateToJson(const TrainerState& s) {
  Json losses = Json::array();
  for (const auto& [step, loss] : s.recent_losses) {
    losses.push_back({{"global_step", step}, {"loss", loss}});
  }
  Json run = nullptr;
  if (s.run) {
    const DataSamplerState& d = s.run->sampler;
    run = {
        {"config", OptionsToJson(s.run->options)},
        {"steps_completed", s.run->steps_completed},
        {"data_tokens", s.run->data_tokens},
        {"data_sampler",
         {{"generator", "cpu_mt19937"},
          {"seed", d.seed},
          {"state_base64", absl::Base64Escape(d.generator_state)},
          {"batches_drawn", d.batches_drawn},
          {"windows_drawn", d.windows_drawn}}},
    };
  }
  Json v = {
      {"format", kFormatName},
      {"format_version", kTrainerStateFormatVersion},
      {"memprofd_version", MEMPROFD_VERSION},
      {"global_step", s.global_step},
      {"run", std::move(run)},
      {"recent_losses", std::move(losses)},
  };
  if (!s.lora_base_fingerprint.empty()) {
    v["lora_base_fingerprint"] = s.lora_base_fingerprint;
  }
  return DumpJson(v, 2) + "\n";
}

absl::StatusOr<TrainerState> TrainerStateFromJson(absl::string_view text,
                                                  absl::string_view path) {
  auto bad = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat("trainer state ", path, " is damaged: ", why,
                                            "; take the checkpoint again or restore "
                                            "the file"));
  };
  absl::StatusOr<Json> parsed = ParseJson(text);
  if (!parsed.ok()) return bad(parsed.status().message());
  const Json& v = *parsed;
  if (!v.is_object()) return bad("not a JSON object");
  absl::Status error;
  Reader top(v, "", &error);
  if (top.String("format") != kFormatName && error.ok()) {
    return bad(absl::StrCat("format is not \"", kFormatName, "\""));
  }
  const int64_t version = top.Int("format_version");
  if (error.ok() && version != kTrainerStateFormatVersion) {
    return bad(absl::StrCat("format_version ", version, " is not ",
                            kTrainerStateFormatVersion,
                            " (written by another memprofd version)"));
  }
  TrainerState s;
  s.global_step = top.Int("global_step");
  const Json* run = top.Get("run");
  if (run != nullptr && !run->is_null()) {
    if (!run->is_object()) return bad("run is neither null nor an object");
    Reader r(*run, "run.", &error);
    RunState rs;
    if (const Json* config = r.Object("config"); config != nullptr) {
      rs.options = OptionsFromJson(*config, &error);
    }
    rs.steps_completed = r.Int("steps_completed");
    rs.data_tokens = r.Int("data_tokens");
    if (const Json* sampler = r.Object("data_sampler"); sampler != nullptr) {
      Reader d(*sampler, "run.data_sampler.", &error);
      if (d.String("generator") != "cpu_mt19937" && error.ok()) {
        d.Fail("generator", "is not \"cpu_mt19937\"");
      }
      rs.sampler.seed = d.Uint("seed");
      const std::string state = d.String("state_base64");
      if (error.ok() && !absl::Base64Unescape(state, &rs.sampler.generator_state)) {
        d.Fail("state_base64", "is not base64");
      }
      rs.sampler.batches_drawn = d.Int("batches_drawn");
      rs.sampler.windows_drawn = d.Int("windows_drawn");
    }
    s.run = std::move(rs);
  }
  if (JsonFind(v, "lora_base_fingerprint") != nullptr) {  // absent: no adapters
    s.lora_base_fingerprint = top.String("lora_base_fingerprint");
  }
  if (const Json* losses = top.Get("recent_losses"); losses != nullptr) {
    if (!losses->is_array()) top.Fail("recent_losses", "is not an array");
    for (const Json& l : losses->is_array() ? *losses : Json::array()) {
      if (!l.is_object()) {
        top.Fail("recent_losses", "holds a value that is not an object");
        break;
      }
      Reader r(l, "recent_losses[].", &error);
      const int64_t step = r.Int("global_step");
      // A diverged step's NaN or infinite loss is written as null.
      const Json* raw = JsonFind(l, "loss");
      const double loss = raw != nullptr && raw->is_null()
                              ? std::numeric_limits<double>::quiet_NaN()
                              : r.Double("loss");
      s.recent_losses.emplace_back(step, loss);
    }
  }
  if (!error.ok()) return bad(error.message());
  return s;
}

}  // namespace memprofd
