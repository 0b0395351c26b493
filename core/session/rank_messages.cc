#include "core/session/rank_messages.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/train/trainer_state.h"

namespace memprofd::rank_messages {
namespace {

// One offload field's value in JSON, and back (BadCommand naming the field).
template <typename T>
Json FieldToJson(T value) {
  return value;
}
Json FieldToJson(offload::Target target) {
  return std::string(offload::TargetName(target));
}

absl::Status FieldFromJson(const Json& v, absl::string_view name,
                           std::optional<bool>* out) {
  if (!v.is_boolean())
    return BadCommand(absl::StrCat("offload.", name, " is not a boolean"));
  *out = v.get<bool>();
  return absl::OkStatus();
}
absl::Status FieldFromJson(const Json& v, absl::string_view name,
                           std::optional<int64_t>* out) {
  int64_t n = 0;
  if (!JsonToInt64(v, &n))
    return BadCommand(absl::StrCat("offload.", name, " is not an integer"));
  *out = n;
  return absl::OkStatus();
}
absl::Status FieldFromJson(const Json& v, absl::string_view name,
                           std::optional<int>* out) {
  int64_t n = 0;
  if (!JsonToInt64(v, &n) || n < std::numeric_limits<int>::min() ||
      n > std::numeric_limits<int>::max()) {
    return BadCommand(absl::StrCat("offload.", name, " is not a 32-bit integer"));
  }
  *out = static_cast<int>(n);
  return absl::OkStatus();
}
absl::Status FieldFromJson(const Json& v, absl::string_view name,
                           std::optional<offload::Target>* out) {
  if (!v.is_string()) return BadCommand(absl::StrCat("offload.", name, " is not a name"));
  absl::StatusOr<offload::Target> target = offload::ParseTarget(v.get<std::string>());
  if (!target.ok()) return BadCommand(target.status().message());
  *out = *target;
  return absl::OkStatus();
}

}  // namespace

std::string CommandKey(int64_t n) { return absl::StrCat("cmd/", n); }
std::string MemoryKey(int rank) { return absl::StrCat("mem/", rank); }
std::string ByeKey(int rank) { return absl::StrCat("bye/", rank); }
std::string BoundaryEventKey(int64_t boundary, int64_t k) {
  return absl::StrCat("boundary/", boundary, "/", k);
}
std::string ShardAnswerKey(int64_t id, int rank) {
  return absl::StrCat("shard/", id, "/", rank);
}

Json StatusToJson(const absl::Status& status) {
  return {{"code", static_cast<int>(status.code())},
          {"error", std::string(status.message())}};
}

absl::Status StatusFromJson(const Json& v) {
  const Json* code = JsonFind(v, "code");
  const Json* error = JsonFind(v, "error");
  int64_t c = static_cast<int64_t>(absl::StatusCode::kUnknown);
  if (code != nullptr) JsonToInt64(*code, &c);
  return absl::Status(static_cast<absl::StatusCode>(c),
                      error != nullptr && error->is_string()
                          ? error->get<std::string>()
                          : std::string("(no message)"));
}

absl::Status BadCommand(absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("rank 0's command cannot be read: ", why,
                   " (are all ranks running the same memprofd version?)"));
}

std::optional<int64_t> IntField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  int64_t out = 0;
  if (f == nullptr || !JsonToInt64(*f, &out)) return std::nullopt;
  return out;
}

std::optional<bool> BoolField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  if (f == nullptr || !f->is_boolean()) return std::nullopt;
  return f->get<bool>();
}

std::string StringField(const Json& v, absl::string_view key) {
  const Json* f = JsonFind(v, key);
  return f != nullptr && f->is_string() ? f->get<std::string>() : std::string();
}

Json OffloadOverridesToJson(const offload::OffloadOverrides& offload) {
  Json v = Json::object();
#define MEMPROFD_OFFLOAD_TO_JSON_(name, ...) \
  if (offload.name) v[#name] = FieldToJson(*offload.name);
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_TO_JSON_)
#undef MEMPROFD_OFFLOAD_TO_JSON_
  return v;
}

absl::StatusOr<offload::OffloadOverrides> OffloadOverridesFromJson(const Json& v) {
  if (!v.is_object()) return BadCommand("offload is not a JSON object");
  offload::OffloadOverrides offload;
#define MEMPROFD_OFFLOAD_FROM_JSON_(name, ...)                \
  if (const Json* f = JsonFind(v, #name); f != nullptr) {     \
    RETURN_IF_ERROR(FieldFromJson(*f, #name, &offload.name)); \
  }
  MEMPROFD_OFFLOAD_FIELDS(MEMPROFD_OFFLOAD_FROM_JSON_)
#undef MEMPROFD_OFFLOAD_FROM_JSON_
  return offload;
}

std::string EncodeTrainCommand(const TrainCommand& command) {
  return DumpJson(Json{{"kind", "train"},
                       {"options", TrainOptionsToJson(command.train)},
                       {"offload", OffloadOverridesToJson(command.offload)},
                       {"resume", command.resume}});
}

absl::StatusOr<TrainCommand> DecodeTrainCommand(const Json& command) {
  TrainCommand out;
  ASSIGN_OR_RETURN(out.train, TrainOptionsFromJson(StringField(command, "options")));
  const Json* offload = JsonFind(command, "offload");
  ASSIGN_OR_RETURN(out.offload, OffloadOverridesFromJson(
                                    offload != nullptr ? *offload : Json::object()));
  out.resume = BoolField(command, "resume").value_or(false);
  return out;
}

Json RankMemoryToJson(const RankMemory& m) {
  return {{"rank", m.rank},
          {"node_rank", m.node_rank},
          {"device", m.device},
          {"current_bytes", m.current_bytes},
          {"peak_bytes", m.peak_bytes},
          {"last_step_peak_bytes", m.last_step_peak_bytes},
          {"steps_total", m.steps_total},
          {"published_unix_ms", absl::ToUnixMillis(absl::Now())}};
}

RankMemory RankMemoryFromJson(int rank, absl::string_view text) {
  RankMemory m;
  m.rank = rank;
  absl::StatusOr<Json> v = ParseJson(text);
  if (!v.ok() || !v->is_object()) {
    m.ok = false;
    m.error = absl::StrCat("rank ", rank, " published memory that is not a JSON object");
    return m;
  }
  m.node_rank = static_cast<int>(IntField(*v, "node_rank").value_or(0));
  m.device = StringField(*v, "device");
  m.current_bytes = IntField(*v, "current_bytes").value_or(0);
  m.peak_bytes = IntField(*v, "peak_bytes").value_or(0);
  m.last_step_peak_bytes = IntField(*v, "last_step_peak_bytes").value_or(0);
  m.steps_total = IntField(*v, "steps_total").value_or(0);
  const int64_t published = IntField(*v, "published_unix_ms").value_or(0);
  m.age_seconds =
      std::max<double>(0, (absl::ToUnixMillis(absl::Now()) - published) / 1000.0);
  return m;
}

}  // namespace memprofd::rank_messages
