// The proto conversions of server/convert.h: requests carry only what the
// client set (a field set to 0 is 0; ranges are the session's to check), a
// shard size that does not parse is INVALID_ARGUMENT, results and errors come
// back whole, and the skip reasons map onto their proto fields through core's
// one table.
#include "server/convert.h"

#include <grpcpp/support/status.h>

#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/attribution.h"
#include "core/common/json.h"
#include "core/common/option_status.h"
#include "core/offload/offload_options.h"
#include "core/snapshot/shard_plan.h"
#include "core/train/request_fields.h"
#include "core/train/trainer_state.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/convert_memory.h"
#include "server/grpc_status.h"
#include "server/option_flags.h"

namespace memprofd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(ConvertTest, EverySkipReasonHasItsProtoFieldAndNoFieldIsLeftOver) {
  std::set<std::string> mapped;
  for (const offload::SkipReason reason : offload::kSkipReasons) {
    const google::protobuf::FieldDescriptor* field = SkippedField(reason);
    ASSERT_NE(field, nullptr) << "v1::OffloadStats has no skipped_"
                              << offload::SkipReasonName(reason);
    EXPECT_EQ(field->cpp_type(), google::protobuf::FieldDescriptor::CPPTYPE_INT64);
    mapped.insert(field->name());
  }
  const google::protobuf::Descriptor* d = v1::OffloadStats::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& name = d->field(i)->name();
    if (absl::StartsWith(name, "skipped_")) {
      EXPECT_TRUE(mapped.count(name)) << name << " has no offload::SkipReason";
    }
  }
}

TEST(ConvertTest, OffloadStatsCarryEachReasonsCount) {
  offload::OffloadStats s;
  int64_t n = 1;
  for (const offload::SkipReason reason : offload::kSkipReasons)
    s.skipped_of(reason) = n++;
  const v1::OffloadStats o = ToProto(s);
  EXPECT_EQ(o.skipped_parameter(), s.skipped_of(offload::SkipReason::kParameter));
  EXPECT_EQ(o.skipped_small(), s.skipped_of(offload::SkipReason::kSmall));
  EXPECT_EQ(o.skipped_exempt(), s.skipped_of(offload::SkipReason::kExempt));
  EXPECT_EQ(o.skipped_disabled(), s.skipped_of(offload::SkipReason::kDisabled));
  const google::protobuf::Reflection* r = o.GetReflection();
  for (const offload::SkipReason reason : offload::kSkipReasons) {
    EXPECT_EQ(r->GetInt64(o, SkippedField(reason)), s.skipped_of(reason));
  }
}

TEST(ConvertTest, OffloadStatsCarryEffectiveness) {
  offload::OffloadStats s;
  s.bytes_out = 300;
  s.effective_bytes = 200;
  s.ineffective_bytes = 100;
  const v1::OffloadStats o = ToProto(s);
  EXPECT_EQ(o.effective_bytes(), 200);
  EXPECT_EQ(o.ineffective_bytes(), 100);
}

TEST(ConvertTest, OomReportLeavesUnknownFiguresAndOriginsAbsent) {
  OomReportRecord record;
  memory::OomReport& r = record.report;
  r.captured = true;
  r.device = "cpu";
  r.requested_bytes = 1 << 20;
  r.phase = Phase::kBackward;
  r.allocated_bytes = 5000;
  r.reserved_bytes = 5000;
  r.free_bytes = -1;  // unknown
  r.total_bytes = -1;
  memory::LiveAllocation known;
  known.bytes = 4000;
  known.category = "parameters";
  known.phase = Phase::kLoad;
  known.step = 0;
  memory::LiveAllocation unknown;
  unknown.bytes = 1000;
  unknown.category = "activations_and_temporaries";
  r.largest = {known, unknown};
  record.json = "{}";
  record.path = "/r/oom-step1-2.json";
  const v1::OomReport p = ToProto(record);
  EXPECT_EQ(p.phase(), "backward");
  EXPECT_TRUE(p.has_reserved_bytes());
  EXPECT_FALSE(p.has_free_bytes());
  EXPECT_FALSE(p.has_total_bytes());
  ASSERT_EQ(p.largest_allocations_size(), 2);
  EXPECT_EQ(p.largest_allocations(0).phase(), "load");
  EXPECT_EQ(p.largest_allocations(1).phase(), "");
  EXPECT_EQ(p.largest_allocations(1).category(), "activations_and_temporaries");
  EXPECT_EQ(p.path(), "/r/oom-step1-2.json");
  // Every category, in Named() order.
  ASSERT_EQ(p.categories_size(),
            static_cast<int>(memory::CategoryBytes().Named().size()));
  EXPECT_EQ(p.categories(0).category(), "parameters");
}

TEST(ConvertTest, TrainRequestOffloadCarriesOnlyTheFieldsSet) {
  v1::TrainRequest req;
  req.set_steps(1);
  absl::StatusOr<TrainSpec> none = FromProto(req);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->offload.enabled.has_value());
  EXPECT_FALSE(none->offload.offload_head.has_value());

  req.mutable_offload()->set_enabled(true);
  absl::StatusOr<TrainSpec> only_enabled = FromProto(req);
  ASSERT_TRUE(only_enabled.ok()) << only_enabled.status();
  EXPECT_EQ(only_enabled->offload.enabled, std::optional<bool>(true));
  EXPECT_FALSE(only_enabled->offload.offload_head.has_value());
  EXPECT_FALSE(only_enabled->offload.min_offload_bytes.has_value());
  EXPECT_FALSE(only_enabled->offload.target.has_value());

  v1::OffloadOptions* o = req.mutable_offload();
  o->set_offload_head(false);
  o->set_min_offload_bytes(0);  // set: "every tensor", not "the default"
  o->set_target(v1::OFFLOAD_TARGET_DISK);
  o->set_max_copies_in_flight(3);
  o->set_prefetch_depth(-1);
  absl::StatusOr<TrainSpec> all = FromProto(req);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->offload.offload_head, std::optional<bool>(false));
  EXPECT_EQ(all->offload.min_offload_bytes, std::optional<int64_t>(0));
  EXPECT_EQ(all->offload.target, std::optional<offload::Target>(offload::Target::kDisk));
  EXPECT_EQ(all->offload.max_copies_in_flight, std::optional<int>(3));
  EXPECT_EQ(all->offload.prefetch_depth, std::optional<int>(offload::kPrefetchAuto));

  // The unspecified target is "the daemon's".
  o->set_target(v1::OFFLOAD_TARGET_UNSPECIFIED);
  EXPECT_FALSE(FromProto(req)->offload.target.has_value());
}

// One table (core/train/request_fields.h) names each request's fields for
// every place that handles them; the proto must agree with it: each field of
// `message` is either listed or handled apart, and each name is a field.
template <size_t kListed, size_t kApart>
void ExpectTableMatches(const google::protobuf::Descriptor* message,
                        const char* const (&listed_names)[kListed],
                        const char* const (&apart_names)[kApart]) {
  const std::set<std::string> listed(std::begin(listed_names), std::end(listed_names));
  const std::set<std::string> apart(std::begin(apart_names), std::end(apart_names));
  for (int i = 0; i < message->field_count(); ++i) {
    const std::string name(message->field(i)->name());
    EXPECT_TRUE(listed.count(name) + apart.count(name) == 1)
        << message->full_name() << "." << name
        << " is neither in request_fields.h's lists nor among the fields handled apart "
           "(or in both)";
  }
  for (const std::set<std::string>* names : {&listed, &apart}) {
    for (const std::string& name : *names) {
      EXPECT_NE(message->FindFieldByName(name), nullptr)
          << name << " is in request_fields.h but not in " << message->full_name();
    }
  }
}

TEST(ConvertTest, EveryTrainRequestFieldIsInTheTableOrHandledApart) {
  ExpectTableMatches(v1::TrainRequest::descriptor(), kTrainTableFieldNames,
                     kTrainFieldsApart);
}

TEST(ConvertTest, EveryOffloadOptionsFieldIsInTheOffloadTable) {
  const std::set<std::string> listed(std::begin(offload::kOffloadFieldNames),
                                     std::end(offload::kOffloadFieldNames));
  const google::protobuf::Descriptor* message = v1::OffloadOptions::descriptor();
  for (int i = 0; i < message->field_count(); ++i) {
    EXPECT_EQ(listed.count(std::string(message->field(i)->name())), 1u)
        << message->field(i)->name() << " is not in offload_fields.h";
  }
  for (const std::string& name : listed) {
    EXPECT_NE(message->FindFieldByName(name), nullptr)
        << name << " is in offload_fields.h but not in " << message->full_name();
  }
}

TEST(ConvertTest, EveryEvaluateRequestFieldIsInTheTableOrHandledApart) {
  ExpectTableMatches(v1::EvaluateRequest::descriptor(), kEvalTableFieldNames,
                     kEvalFieldsApart);
}

// Sets each field named in `names` of `message` from its text in `values`
// (a test failure when a listed field has no value there).
template <size_t kNames>
void SetListedFields(const char* const (&names)[kNames],
                     const std::map<std::string, std::string>& values,
                     google::protobuf::Message* message) {
  const google::protobuf::Reflection* reflection = message->GetReflection();
  for (const char* name : names) {
    auto it = values.find(name);
    ASSERT_NE(it, values.end()) << "give " << name << " a value in this test";
    const google::protobuf::FieldDescriptor* f =
        message->GetDescriptor()->FindFieldByName(name);
    ASSERT_NE(f, nullptr) << name;
    const std::string& text = it->second;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
        reflection->SetInt64(message, f, std::stoll(text));
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
        reflection->SetUInt64(message, f, std::stoull(text));
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
        reflection->SetDouble(message, f, std::stod(text));
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
        reflection->SetBool(message, f, text == "true");
        break;
      case google::protobuf::FieldDescriptor::CPPTYPE_STRING:
        reflection->SetString(message, f, text);
        break;
      default:
        FAIL() << name << " has a type this test does not set";
    }
  }
}

// Every field of the table, set in a proto to a valid value other than its
// default, reaches the merged options, the run's JSON and back: a place that
// dropped a field would leave it at its default.
TEST(ConvertTest, EveryTableFieldTravelsFromTheProtoToTheRunsJsonAndBack) {
  // A valid, non-default value of each field, as text.
  const std::map<std::string, std::string> values = {
      {"steps", "7"},
      {"batch_size", "3"},
      {"seq_len", "16"},
      {"learning_rate", "0.0125"},
      {"seed", "9"},
      {"gradient_checkpointing", "true"},
      {"checkpoint_layers", "2"},
      {"weight_decay", "0.01"},
      {"beta1", "0.85"},
      {"beta2", "0.95"},
      {"adam_eps", "1e-06"},
      {"max_grad_norm", "1.5"},
      {"grad_accumulation_steps", "2"},
      {"warmup_steps", "2"},
      {"min_lr_ratio", "0.1"},
      {"eval_every_steps", "3"},
      {"eval_max_batches", "4"},
      {"loss_chunk_tokens", "32"},
      {"attn_implementation", "eager"},
      {"lr_scheduler_type", "cosine_with_min_lr"},
      {"mixed_precision", "bf16"},
      {"lora_r", "4"},
      {"lora_alpha", "16.5"},
      {"lora_use_rslora", "true"},
      {"lora_targets", "q_proj,k_proj"},
      {"lora_dropout", "0.125"},
      {"base_dtype", "bf16"},
  };
  v1::TrainRequest req;
  SetListedFields(kTrainTableFieldNames, values, &req);
  req.mutable_eval_data()->set_embedded_corpus(true);
  absl::StatusOr<TrainSpec> spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainOptions> merged =
      MergeTrainOverrides(TrainOptions(), spec->train, /*max_position_embeddings=*/64);
  ASSERT_TRUE(merged.ok()) << merged.status();

  const std::string text = TrainOptionsToJson(*merged);
  absl::StatusOr<Json> json = ParseJson(text);
  absl::StatusOr<Json> defaults = ParseJson(TrainOptionsToJson(TrainOptions()));
  ASSERT_TRUE(json.ok() && defaults.ok());
  for (const char* name : kTrainTableFieldNames) {
    const Json* got = JsonFind(*json, name);
    const Json* by_default = JsonFind(*defaults, name);
    ASSERT_TRUE(got != nullptr && by_default != nullptr)
        << name << " is missing from the run's JSON";
    EXPECT_NE(got->dump(), by_default->dump())
        << name << " did not travel: it kept its default " << by_default->dump();
    EXPECT_EQ(got->is_string() ? got->get<std::string>() : got->dump(), values.at(name))
        << name;
  }
  absl::StatusOr<TrainOptions> back = TrainOptionsFromJson(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(TrainOptionsToJson(*back), text);
}

// A run's JSON written before the chunked loss has no loss_chunk_tokens: it
// reads as off (those runs materialized the logits); any other field missing
// is an error naming it.
TEST(ConvertTest, RunJsonWithoutLossChunkTokensReadsAsOffAndOtherFieldsAreRequired) {
  TrainOptions options;
  options.loss_chunk_tokens = 64;
  absl::StatusOr<Json> json = ParseJson(TrainOptionsToJson(options));
  ASSERT_TRUE(json.ok());
  Json legacy = *json;
  legacy.erase("loss_chunk_tokens");
  // Nor had they LoRA fields: such a run trained every parameter.
  for (const char* lora : {"lora_r", "lora_alpha", "lora_use_rslora", "lora_targets",
                           "lora_dropout", "base_dtype"}) {
    legacy.erase(lora);
  }
  absl::StatusOr<TrainOptions> read = TrainOptionsFromJson(legacy.dump());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->loss_chunk_tokens, kLossChunkOff);
  EXPECT_EQ(read->lora.r, 0);
  EXPECT_EQ(read->lora, LoraOptions());
  EXPECT_EQ(read->base_dtype, BaseDtype::kFloat32);
  EXPECT_EQ(TrainOptionsFromJson(json->dump())->loss_chunk_tokens, 64);
  Json missing = *json;
  missing.erase("seq_len");
  EXPECT_THAT(TrainOptionsFromJson(missing.dump()).status().message(),
              HasSubstr("run.config.seq_len is missing"));
}

// Likewise every field of the Evaluate table reaches the merged options.
TEST(ConvertTest, EveryEvaluateTableFieldTravelsFromTheProtoToTheOptions) {
  const std::map<std::string, std::string> values = {
      {"batch_size", "3"},
      {"seq_len", "16"},
      {"max_batches", "2"},
      {"loss_chunk_tokens", "32"},
      {"attn_implementation", "eager"},
      {"mixed_precision", "bf16"},
  };
  v1::EvaluateRequest req;
  SetListedFields(kEvalTableFieldNames, values, &req);
  req.mutable_data()->set_embedded_corpus(true);
  absl::StatusOr<EvalOptions> merged =
      MergeEvalSpec(FromProto(req), /*max_position_embeddings=*/64);
  ASSERT_TRUE(merged.ok()) << merged.status();
  const EvalOptions defaults;
#define EXPECT_VALUE_NOT_DEFAULT_(name, type, member) \
  EXPECT_NE(merged->member, defaults.member) << #name " did not travel";
#define EXPECT_CHOICE_NOT_DEFAULT_(name, member, ...) \
  EXPECT_NE(merged->member, defaults.member) << #name " did not travel";
  MEMPROFD_EVAL_VALUE_FIELDS(EXPECT_VALUE_NOT_DEFAULT_)
  MEMPROFD_EVAL_CHOICE_FIELDS(EXPECT_CHOICE_NOT_DEFAULT_)
#undef EXPECT_VALUE_NOT_DEFAULT_
#undef EXPECT_CHOICE_NOT_DEFAULT_
  EXPECT_EQ(merged->batch_size, 3);
  EXPECT_EQ(merged->mixed_precision, MixedPrecision::kBf16);
}

TEST(ConvertTest, TrainRequestCarriesOnlyTheFieldsSet) {
  v1::TrainRequest req;
  absl::StatusOr<TrainSpec> none = FromProto(req);
  ASSERT_TRUE(none.ok()) << none.status();
  const TrainOverrides& n = none->train;
  EXPECT_FALSE(n.steps.has_value());  // required, but the session says so
  EXPECT_FALSE(n.batch_size.has_value());
  EXPECT_FALSE(n.seq_len.has_value());
  EXPECT_FALSE(n.learning_rate.has_value());
  EXPECT_FALSE(n.seed.has_value());
  EXPECT_FALSE(n.gradient_checkpointing.has_value());
  EXPECT_FALSE(n.weight_decay.has_value());
  EXPECT_FALSE(n.beta1.has_value());
  EXPECT_FALSE(n.beta2.has_value());
  EXPECT_FALSE(n.adam_eps.has_value());
  EXPECT_FALSE(n.max_grad_norm.has_value());
  EXPECT_FALSE(n.grad_accumulation_steps.has_value());
  EXPECT_FALSE(n.attn_implementation.has_value());
  EXPECT_FALSE(n.loss_chunk_tokens.has_value());
  EXPECT_FALSE(n.data.has_value());  // the defaults' data (the embedded corpus)

  req.set_seq_len(48);
  absl::StatusOr<TrainSpec> one = FromProto(req);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->train.seq_len, std::optional<int64_t>(48));
  EXPECT_FALSE(one->train.batch_size.has_value());
  EXPECT_FALSE(one->train.steps.has_value());
}

TEST(ConvertTest, TrainRequestFieldsSetToZeroAreZeroNotTheDefault) {
  v1::TrainRequest req;
  req.set_steps(0);
  req.set_batch_size(0);
  req.set_seq_len(0);
  req.set_learning_rate(0);
  req.set_seed(0);
  req.set_gradient_checkpointing(false);
  req.set_weight_decay(0);
  req.set_beta1(0);
  req.set_beta2(0);
  req.set_adam_eps(0);
  req.set_max_grad_norm(0);
  req.set_grad_accumulation_steps(0);
  req.set_loss_chunk_tokens(0);  // automatic, given as such
  absl::StatusOr<TrainSpec> spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const TrainOverrides& t = spec->train;
  EXPECT_EQ(t.steps, std::optional<int64_t>(0));
  EXPECT_EQ(t.batch_size, std::optional<int64_t>(0));
  EXPECT_EQ(t.seq_len, std::optional<int64_t>(0));
  EXPECT_EQ(t.learning_rate, std::optional<double>(0));
  EXPECT_EQ(t.seed, std::optional<uint64_t>(0));
  EXPECT_EQ(t.gradient_checkpointing, std::optional<bool>(false));
  EXPECT_EQ(t.weight_decay, std::optional<double>(0));
  EXPECT_EQ(t.beta1, std::optional<double>(0));
  EXPECT_EQ(t.beta2, std::optional<double>(0));
  EXPECT_EQ(t.adam_eps, std::optional<double>(0));
  EXPECT_EQ(t.max_grad_norm, std::optional<double>(0));
  EXPECT_EQ(t.grad_accumulation_steps, std::optional<int64_t>(0));
  EXPECT_EQ(t.loss_chunk_tokens, std::optional<int64_t>(0));
}

// Ranges are the session's to check, once (MergeTrainOverrides): the
// conversion passes even a value the session will refuse unchanged.
TEST(ConvertTest, TrainRequestValuesReachTheSessionUnchecked) {
  v1::TrainRequest req;
  req.set_steps(7);
  req.set_batch_size(-3);
  req.set_learning_rate(3e-4);
  req.set_seed(42);
  req.set_gradient_checkpointing(true);
  req.set_weight_decay(0.1);
  req.set_beta1(0.8);
  req.set_beta2(1.5);
  req.set_adam_eps(1e-6);
  req.set_max_grad_norm(-1);
  req.set_grad_accumulation_steps(4);
  req.set_attn_implementation("flash");  // not one memprofd has
  req.set_loss_chunk_tokens(-7);
  absl::StatusOr<TrainSpec> spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const TrainOverrides& t = spec->train;
  EXPECT_EQ(t.steps, std::optional<int64_t>(7));
  EXPECT_EQ(t.batch_size, std::optional<int64_t>(-3));
  EXPECT_EQ(t.learning_rate, std::optional<double>(3e-4));
  EXPECT_EQ(t.seed, std::optional<uint64_t>(42));
  EXPECT_EQ(t.gradient_checkpointing, std::optional<bool>(true));
  EXPECT_EQ(t.weight_decay, std::optional<double>(0.1));
  EXPECT_EQ(t.beta1, std::optional<double>(0.8));
  EXPECT_EQ(t.beta2, std::optional<double>(1.5));
  EXPECT_EQ(t.adam_eps, std::optional<double>(1e-6));
  EXPECT_EQ(t.max_grad_norm, std::optional<double>(-1));
  EXPECT_EQ(t.grad_accumulation_steps, std::optional<int64_t>(4));
  EXPECT_EQ(t.attn_implementation, std::optional<std::string>("flash"));
  EXPECT_EQ(t.loss_chunk_tokens, std::optional<int64_t>(-7));
  EXPECT_FALSE(spec->offload.enabled.has_value());  // no offload message
}

TEST(ConvertTest, EvaluateRequestLossChunkTokensOnlyWhenSet) {
  v1::EvaluateRequest req;
  EXPECT_FALSE(FromProto(req).loss_chunk_tokens.has_value());
  req.set_loss_chunk_tokens(-1);
  EXPECT_EQ(FromProto(req).loss_chunk_tokens, std::optional<int64_t>(-1));
}

TEST(ConvertTest, TrainRequestDataSourcesMapToDataSpecs) {
  v1::TrainRequest req;
  req.mutable_data()->set_embedded_corpus(true);
  EXPECT_EQ(FromProto(req)->train.data->kind, DataSpec::Kind::kEmbeddedCorpus);

  req.mutable_data()->set_text_file("/data/corpus.txt");
  DataSpec d = *FromProto(req)->train.data;
  EXPECT_EQ(d.kind, DataSpec::Kind::kTextFile);
  EXPECT_EQ(d.path, "/data/corpus.txt");

  req.mutable_data()->mutable_token_file()->set_path("/data/train.bin");
  d = *FromProto(req)->train.data;
  EXPECT_EQ(d.kind, DataSpec::Kind::kTokenFile);
  EXPECT_EQ(d.path, "/data/train.bin");
  EXPECT_EQ(d.bytes_per_token, DataSpec().bytes_per_token);  // unset: core's default
  req.mutable_data()->mutable_token_file()->set_bytes_per_token(4);
  EXPECT_EQ(FromProto(req)->train.data->bytes_per_token, 4);
  req.mutable_data()->mutable_token_file()->set_bytes_per_token(0);
  EXPECT_EQ(FromProto(req)->train.data->bytes_per_token,
            0);  // set: the session refuses it

  for (int64_t id : {5, 0, 255}) req.mutable_data()->mutable_inline_tokens()->add_ids(id);
  d = *FromProto(req)->train.data;
  EXPECT_EQ(d.kind, DataSpec::Kind::kInlineTokens);
  EXPECT_THAT(d.tokens, ElementsAre(5, 0, 255));

  req.mutable_data()->mutable_indexed_dataset()->set_prefix("/data/wiki_text_document");
  d = *FromProto(req)->train.data;
  EXPECT_EQ(d.kind, DataSpec::Kind::kIndexedDataset);
  EXPECT_EQ(d.path, "/data/wiki_text_document");
  EXPECT_EQ(d.windows, DataSpec::Windows::kPacked);  // unset: packed, Megatron's
  req.mutable_data()->mutable_indexed_dataset()->set_windows(
      v1::INDEXED_WINDOWS_WITHIN_DOCUMENTS);
  EXPECT_EQ(FromProto(req)->train.data->windows, DataSpec::Windows::kWithinDocuments);
  req.mutable_data()->mutable_indexed_dataset()->set_windows(v1::INDEXED_WINDOWS_PACKED);
  EXPECT_EQ(FromProto(req)->train.data->windows, DataSpec::Windows::kPacked);
  // An unknown value reaches core, whose validation refuses it by name.
  req.mutable_data()->mutable_indexed_dataset()->set_windows(
      static_cast<v1::IndexedWindows>(7));
  d = *FromProto(req)->train.data;
  EXPECT_THAT(std::string(ValidateDataSpec("data", d).message()), HasSubstr("windows"));
  v1::EvaluateRequest eval;
  eval.mutable_data()->mutable_indexed_dataset()->set_prefix("/data/val");
  EXPECT_EQ(FromProto(eval).data.kind, DataSpec::Kind::kIndexedDataset);
  EXPECT_EQ(FromProto(eval).data.path, "/data/val");
}

TEST(ConvertTest, LoadModelRequestCarriesSourceSeedAndPlacements) {
  v1::LoadModelRequest req;
  req.set_preset("small");
  req.set_seed(9);
  for (const auto& [module, placement] :
       std::vector<std::pair<std::string, v1::Placement>>{
           {"model.layers.0", v1::PLACEMENT_CPU},
           {"model.layers.1", v1::PLACEMENT_DISK},
           {"model.layers.2", v1::PLACEMENT_DEVICE},
           {"model.norm", v1::PLACEMENT_UNSPECIFIED}}) {
    v1::ModulePlacement* p = req.add_placement();
    p->set_module(module);
    p->set_placement(placement);
  }
  absl::StatusOr<LoadModelSpec> spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->preset, "small");
  EXPECT_EQ(spec->hf_directory, "");
  EXPECT_EQ(spec->seed, 9u);
  EXPECT_THAT(spec->placement, ElementsAre(Pair("model.layers.0", Placement::kCpu),
                                           Pair("model.layers.1", Placement::kDisk),
                                           Pair("model.layers.2", Placement::kDevice),
                                           Pair("model.norm", Placement::kDevice)));

  EXPECT_FALSE(spec->base_dtype.has_value());  // unset: the session decides
  req.set_base_dtype("bf16");
  spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->base_dtype, BaseDtype::kBf16);
  req.set_base_dtype("fp8");
  EXPECT_THAT(FromProto(req).status().message(),
              ::testing::HasSubstr("base_dtype: unknown value \"fp8\""));
  req.clear_base_dtype();

  req.set_hf_directory("/models/llama");
  spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->preset, "");  // a oneof: the directory replaced the preset
  EXPECT_EQ(spec->hf_directory, "/models/llama");
  EXPECT_FALSE(spec->init_weights);
  req.set_init_weights(true);
  spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_TRUE(spec->init_weights);
  EXPECT_FALSE(spec->init_if_no_weights);  // the operator's flag only, never a request
}

TEST(ConvertTest, SnapshotRequestShardSizeDtypeAndMode) {
  v1::SnapshotRequest req;
  req.set_name("s1");
  absl::StatusOr<SnapshotSpec> spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "s1");
  EXPECT_EQ(spec->options.max_shard_size, snapshot::kDefaultMaxShardSize);
  EXPECT_EQ(spec->options.dtype, snapshot::SnapshotDtype::kKeep);
  EXPECT_EQ(spec->mode, SnapshotMode::kBlocking);

  req.set_max_shard_size("500MB");
  req.set_mode(v1::SNAPSHOT_MODE_ASYNC);
  spec = FromProto(req);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->options.max_shard_size, 500'000'000);
  EXPECT_EQ(spec->mode, SnapshotMode::kAsync);

  for (const auto& [proto, core] :
       std::vector<std::pair<v1::SnapshotDtype, snapshot::SnapshotDtype>>{
           {v1::SNAPSHOT_DTYPE_UNSPECIFIED, snapshot::SnapshotDtype::kKeep},
           {v1::SNAPSHOT_DTYPE_KEEP, snapshot::SnapshotDtype::kKeep},
           {v1::SNAPSHOT_DTYPE_BF16, snapshot::SnapshotDtype::kBFloat16},
           {v1::SNAPSHOT_DTYPE_FP16, snapshot::SnapshotDtype::kFloat16},
           {v1::SNAPSHOT_DTYPE_FP32, snapshot::SnapshotDtype::kFloat32}}) {
    req.set_dtype(proto);
    EXPECT_EQ(FromProto(req)->options.dtype, core) << v1::SnapshotDtype_Name(proto);
  }

  req.set_max_shard_size("5GiB");
  spec = FromProto(req);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("\"5GB\""));
}

TEST(ConvertTest, UnknownEnumValuesAreRefusedByFieldNotReadAsTheDefault) {
  const auto refused = [&](const absl::Status& s, const std::string& field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field + ": unknown value 99")) << s;
  };
  v1::SnapshotRequest snap;
  snap.set_name("s1");
  snap.set_dtype(static_cast<v1::SnapshotDtype>(99));
  refused(FromProto(snap).status(), "dtype");
  snap.set_dtype(v1::SNAPSHOT_DTYPE_BF16);
  snap.set_mode(static_cast<v1::SnapshotMode>(99));
  refused(FromProto(snap).status(), "mode");
  snap.set_mode(v1::SNAPSHOT_MODE_ASYNC);
  snap.set_kind(static_cast<v1::SnapshotKind>(99));
  refused(FromProto(snap).status(), "kind");
  snap.set_kind(v1::SNAPSHOT_KIND_CHECKPOINT);
  EXPECT_TRUE(FromProto(snap).ok());

  v1::LoadModelRequest load;
  load.set_preset("tiny");
  v1::ModulePlacement* p = load.add_placement();
  p->set_module("lm_head");
  p->set_placement(static_cast<v1::Placement>(7));
  EXPECT_EQ(FromProto(load).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(FromProto(load).status().message()),
              HasSubstr("placement.placement: unknown value 7"));

  v1::TrainRequest train;
  train.mutable_offload()->set_target(static_cast<v1::OffloadTarget>(99));
  refused(FromProto(train).status(), "offload.target");
}

TEST(ConvertTest, CheckpointKindAndResumeFlagsReachTheSession) {
  v1::SnapshotRequest snap;
  snap.set_name("s");
  // Unspecified: weights (an explicit snapshot is most often an export).
  EXPECT_EQ(FromProto(snap)->options.kind, snapshot::SnapshotKind::kWeights);
  snap.set_kind(v1::SNAPSHOT_KIND_CHECKPOINT);
  EXPECT_EQ(FromProto(snap)->options.kind, snapshot::SnapshotKind::kCheckpoint);
  snap.set_kind(v1::SNAPSHOT_KIND_WEIGHTS);
  EXPECT_EQ(FromProto(snap)->options.kind, snapshot::SnapshotKind::kWeights);
  // Every kind on the wire reaches core as itself and comes back in the
  // manifest as itself.
  for (int k = v1::SnapshotKind_MIN + 1; k <= v1::SnapshotKind_MAX; ++k) {
    snap.set_kind(static_cast<v1::SnapshotKind>(k));
    const snapshot::SnapshotKind kind = FromProto(snap)->options.kind;
    snapshot::SnapshotManifest m;
    m.kind = std::string(snapshot::SnapshotKindName(kind));
    EXPECT_EQ(ToProto(m, SnapshotMode::kBlocking).kind(), k) << m.kind;
    EXPECT_EQ(absl::AsciiStrToLower(v1::SnapshotKind_Name(snap.kind())),
              absl::StrCat("snapshot_kind_", m.kind));
  }

  v1::LoadModelRequest load;
  load.set_hf_directory("/ck");
  EXPECT_FALSE(FromProto(load)->resume);
  load.set_resume(true);
  EXPECT_TRUE(FromProto(load)->resume);

  v1::TrainRequest train;
  EXPECT_FALSE(FromProto(train)->resume);
  train.set_resume(true);
  absl::StatusOr<TrainSpec> spec = FromProto(train);
  EXPECT_TRUE(spec->resume);
  EXPECT_FALSE(spec->train.steps.has_value());  // the session runs the rest of the run
  EXPECT_FALSE(spec->train.data.has_value());   // the run's own data

  snapshot::SnapshotManifest m;
  m.kind = "checkpoint";
  m.optimizer_bytes = 123;
  v1::SnapshotManifest p = ToProto(m, SnapshotMode::kBlocking);
  EXPECT_EQ(p.kind(), v1::SNAPSHOT_KIND_CHECKPOINT);
  EXPECT_EQ(p.optimizer_bytes(), 123);
  EXPECT_EQ(ToProto(snapshot::SnapshotManifest(), SnapshotMode::kBlocking).kind(),
            v1::SNAPSHOT_KIND_WEIGHTS);
}

TEST(ConvertTest, MemoryBudgetTravelsOnlyWhenSetAndItsChoiceComesBack) {
  v1::TrainRequest train;
  EXPECT_FALSE(FromProto(train)->memory_budget_bytes.has_value());
  // Zero and negative budgets reach the session, which refuses them.
  train.set_memory_budget_bytes(0);
  EXPECT_EQ(FromProto(train)->memory_budget_bytes, 0);
  train.set_memory_budget_bytes(int64_t{6} << 30);
  absl::StatusOr<TrainSpec> spec = FromProto(train);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->memory_budget_bytes, int64_t{6} << 30);
  // A directive to the session, not an option of the run.
  EXPECT_FALSE(spec->train.batch_size.has_value());

  SessionStepReport r;
  r.planned_peak_bytes = 1234;
  r.budget_choice = "batch 4 x 2 accumulated, checkpointing on, offloading off";
  const v1::StepReport p = ToProto(r);
  EXPECT_EQ(p.planned_peak_bytes(), 1234);
  EXPECT_EQ(p.budget_choice(), r.budget_choice);
  TrainResult t;
  t.planned_peak_bytes = 99;
  t.budget_choice = "batch 8 x 1 accumulated, checkpointing off, offloading off";
  const v1::TrainResult tp = ToProto(t);
  EXPECT_EQ(tp.planned_peak_bytes(), 99);
  EXPECT_EQ(tp.budget_choice(), t.budget_choice);
  EXPECT_EQ(ToProto(TrainResult()).budget_choice(), "");
}

TEST(ConvertTest, FailedOperationCarriesItsErrorAndNoResult) {
  OperationView view;
  view.id = "op-3";
  view.kind = OperationKind::kSnapshot;
  view.state = OperationState::kFailed;
  view.done = true;
  view.error = absl::ResourceExhaustedError("disk full under /snapshots");
  view.create_time = absl::FromUnixMicros(1'000'000);
  view.start_time = absl::InfinitePast();  // never ran
  view.end_time = absl::FromUnixMicros(2'500'000);
  const v1::Operation op = ToProto(view);
  EXPECT_EQ(op.id(), "op-3");
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_SNAPSHOT);
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_FAILED);
  EXPECT_TRUE(op.done());
  EXPECT_EQ(op.error().code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  EXPECT_EQ(op.error().message(), "disk full under /snapshots");
  EXPECT_EQ(op.result_case(), v1::Operation::RESULT_NOT_SET);
  EXPECT_EQ(op.create_time_us(), 1'000'000);
  EXPECT_EQ(op.start_time_us(), 0);
  EXPECT_EQ(op.end_time_us(), 2'500'000);
}

TEST(ConvertTest, OperationResultsComeBackTyped) {
  OperationView running;
  running.kind = OperationKind::kTrain;
  running.state = OperationState::kRunning;
  running.completed = 2;
  running.total = 10;
  running.unit = "steps";
  running.message = "step 2";
  v1::Operation op = ToProto(running);
  EXPECT_FALSE(op.done());
  EXPECT_FALSE(op.has_error());
  EXPECT_EQ(op.progress().completed(), 2);
  EXPECT_EQ(op.progress().total(), 10);
  EXPECT_EQ(op.progress().unit(), "steps");
  EXPECT_EQ(op.progress().message(), "step 2");
  EXPECT_EQ(op.result_case(), v1::Operation::RESULT_NOT_SET);

  // Cancelled training keeps the steps that ran, beside the CANCELLED error.
  OperationView cancelled = running;
  cancelled.state = OperationState::kCancelled;
  cancelled.done = true;
  cancelled.error = absl::CancelledError("cancelled by request");
  TrainResult train;
  train.steps_completed = 2;
  train.first_loss = 5.5;
  train.last_loss = 5.25;
  train.tokens = 512;
  cancelled.result = train;
  op = ToProto(cancelled);
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_CANCELLED);
  EXPECT_EQ(op.error().code(), static_cast<int>(grpc::StatusCode::CANCELLED));
  ASSERT_EQ(op.result_case(), v1::Operation::kTrain);
  EXPECT_EQ(op.train().steps_completed(), 2);
  EXPECT_EQ(op.train().first_loss(), 5.5);
  EXPECT_EQ(op.train().last_loss(), 5.25);
  EXPECT_EQ(op.train().tokens(), 512);
  EXPECT_EQ(op.error().reason(), "");

  // A training the drain stopped: ABORTED with its reason, the steps that
  // ran and the checkpoint to resume from.
  OperationView drained = cancelled;
  drained.state = OperationState::kFailed;
  drained.error = absl::AbortedError("memprofd is shutting down");
  drained.reason = std::string(kDrainingReason);
  train.global_step = 12;
  train.resume_checkpoint = "shutdown-1";
  train.resume_global_step = 12;
  drained.result = train;
  op = ToProto(drained);
  EXPECT_EQ(op.state(), v1::OPERATION_STATE_FAILED);
  EXPECT_EQ(op.error().code(), static_cast<int>(grpc::StatusCode::ABORTED));
  EXPECT_EQ(op.error().reason(), "DRAINING");
  ASSERT_EQ(op.result_case(), v1::Operation::kTrain);
  EXPECT_EQ(op.train().global_step(), 12);
  EXPECT_EQ(op.train().resume_checkpoint(), "shutdown-1");
  EXPECT_EQ(op.train().resume_global_step(), 12);

  OperationView snapshot;
  snapshot.kind = OperationKind::kSnapshot;
  snapshot.state = OperationState::kSucceeded;
  snapshot.done = true;
  SnapshotResult sr;
  sr.manifest.name = "s1";
  sr.manifest.files = {{"model.safetensors", 4096}, {"config.json", 300}};
  sr.manifest.total_size = 4000;
  sr.mode = SnapshotMode::kAsync;
  snapshot.result = sr;
  op = ToProto(snapshot);
  EXPECT_FALSE(op.has_error());
  ASSERT_EQ(op.result_case(), v1::Operation::kSnapshot);
  EXPECT_EQ(op.snapshot().name(), "s1");
  ASSERT_EQ(op.snapshot().files_size(), 2);
  EXPECT_EQ(op.snapshot().files(1).name(), "config.json");
  EXPECT_EQ(op.snapshot().files(1).bytes(), 300);
  EXPECT_EQ(op.snapshot().total_size(), 4000);
  EXPECT_EQ(op.snapshot().mode(), v1::SNAPSHOT_MODE_ASYNC);

  OperationView load;
  load.kind = OperationKind::kLoadModel;
  load.state = OperationState::kSucceeded;
  load.done = true;
  ModelSummary model;
  model.source = "preset:tiny";
  model.parameters.push_back(
      {"model.norm.weight", Placement::kDevice, {256}, "float32", 1024, {}});
  load.result = model;
  op = ToProto(load);
  ASSERT_EQ(op.result_case(), v1::Operation::kModel);
  EXPECT_EQ(op.model().source(), "preset:tiny");
  EXPECT_EQ(op.model().parameters_size(), 0);  // operations carry no parameter list
}

TEST(ConvertTest, ModelSummaryListsParametersOnlyWhenAsked) {
  ModelSummary m;
  m.source = "/models/llama";
  m.config.architecture = "LlamaForCausalLM";
  m.config.vocab_size = 97;
  m.config.num_key_value_heads = 2;
  m.config.rope_theta = 500.0;
  m.config.tie_word_embeddings = true;
  m.num_parameters = 1234;
  m.device = "cpu";
  m.steps_trained = 6;
  m.parameters = {{"a", Placement::kDevice, {2, 3}, "float32", 24, {"lm_head.weight"}},
                  {"b", Placement::kCpu, {4}, "bfloat16", 8, {}},
                  {"c", Placement::kDisk, {}, "float32", 4, {}}};
  m.load_notes = {"snapshots carry tokenizer.json"};
  const v1::ModelInfo brief = ToProto(m, /*with_parameters=*/false);
  EXPECT_EQ(brief.source(), "/models/llama");
  EXPECT_EQ(brief.config().architecture(), "LlamaForCausalLM");
  EXPECT_EQ(brief.config().vocab_size(), 97);
  EXPECT_EQ(brief.config().num_key_value_heads(), 2);
  EXPECT_EQ(brief.config().rope_theta(), 500.0);
  EXPECT_TRUE(brief.config().tie_word_embeddings());
  EXPECT_EQ(brief.num_parameters(), 1234);
  EXPECT_EQ(brief.device(), "cpu");
  EXPECT_EQ(brief.steps_trained(), 6);
  EXPECT_EQ(brief.parameters_size(), 0);
  EXPECT_THAT(brief.load_notes(), ElementsAre("snapshots carry tokenizer.json"));

  const v1::ModelInfo full = ToProto(m, /*with_parameters=*/true);
  ASSERT_EQ(full.parameters_size(), 3);
  EXPECT_EQ(full.parameters(0).name(), "a");
  EXPECT_THAT(full.parameters(0).shape(), ElementsAre(2, 3));
  EXPECT_THAT(full.parameters(0).tied(), ElementsAre("lm_head.weight"));
  EXPECT_EQ(full.parameters(1).tied_size(), 0);
  EXPECT_EQ(full.parameters(0).placement(), v1::PLACEMENT_DEVICE);
  EXPECT_EQ(full.parameters(1).placement(), v1::PLACEMENT_CPU);
  EXPECT_EQ(full.parameters(1).dtype(), "bfloat16");
  EXPECT_EQ(full.parameters(2).placement(), v1::PLACEMENT_DISK);
  EXPECT_EQ(full.parameters(2).shape_size(), 0);
  EXPECT_EQ(full.parameters(2).bytes(), 4);
}

TEST(ConvertTest, MemoryStatsCarryDevicesCategoriesAndPhasePeaks) {
  memory::MemoryStatsView s;
  memory::DeviceMemoryStats cpu;
  cpu.name = "cpu";
  cpu.current_bytes = 100;
  cpu.peak_bytes = 300;
  cpu.alloc_count = 7;
  cpu.free_count = 5;
  s.devices.push_back(cpu);
  s.last_step_phase_peaks.push_back({"cpu", Phase::kBackward, 250});
  s.current_phase = Phase::kForward;
  s.recording = true;
  s.history_entries = 12;
  s.history_max_entries = 100;
  s.history_dropped = 1;
  memory::CategoryBytes c;
  for (int i = 0; i < kNumCategories; ++i) c.Of(static_cast<Category>(i)) = 10 * (i + 1);
  const v1::MemoryStats p = ToProto(s, c);
  ASSERT_EQ(p.devices_size(), 1);
  EXPECT_EQ(p.devices(0).device(), "cpu");
  EXPECT_EQ(p.devices(0).current_bytes(), 100);
  EXPECT_EQ(p.devices(0).peak_bytes(), 300);
  EXPECT_EQ(p.devices(0).allocations_total(), 7);
  EXPECT_EQ(p.devices(0).frees_total(), 5);
  // Every category, in core's order, zeros included (they tile the allocator).
  const std::vector<std::pair<std::string, int64_t>> named = c.Named();
  ASSERT_EQ(p.categories_size(), static_cast<int>(named.size()));
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_EQ(p.categories(i).category(), named[i].first);
    EXPECT_EQ(p.categories(i).bytes(), named[i].second);
  }
  // Every category comes back from its wire name with its own bytes.
  std::set<Category> seen;
  for (const v1::CategoryBytes& wire : p.categories()) {
    const std::optional<Category> category = CategoryFromName(wire.category());
    ASSERT_TRUE(category.has_value()) << wire.category();
    EXPECT_EQ(wire.bytes(), c.Of(*category)) << wire.category();
    seen.insert(*category);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kNumCategories));
  EXPECT_EQ(seen.count(Category::kGatheredParameters), 1u);
  ASSERT_EQ(p.last_step_phase_peaks_size(), 1);
  EXPECT_EQ(p.last_step_phase_peaks(0).device(), "cpu");
  EXPECT_EQ(p.last_step_phase_peaks(0).phase(), PhaseName(Phase::kBackward));
  EXPECT_EQ(p.last_step_phase_peaks(0).peak_bytes(), 250);
  EXPECT_EQ(p.current_phase(), PhaseName(Phase::kForward));
  EXPECT_TRUE(p.recording());
  EXPECT_EQ(p.history_entries(), 12);
  EXPECT_EQ(p.history_max_entries(), 100);
  EXPECT_EQ(p.history_dropped(), 1);
}

TEST(ConvertTest, BreakdownRequestsSendOnlyWhatWasGivenAndRowsKeepTheirKind) {
  v1::GetMemoryBreakdownRequest req;
  memory::BreakdownRequest r = FromProto(req);
  EXPECT_FALSE(r.by || r.phase || r.top);  // core's defaults apply
  req.set_by("op");
  req.set_top(0);  // given, so core refuses it rather than defaulting it
  r = FromProto(req);
  EXPECT_EQ(r.by, "op");
  EXPECT_EQ(r.top, 0);
  EXPECT_FALSE(r.phase);

  memory::MemoryBreakdown b;
  b.device = "cpu";
  b.step = 4;
  b.phase = Phase::kBackward;
  memory::BreakdownRow row;
  row.key = "model.layers.1.mlp";
  row.category = Category::kSavedActivations;
  row.live_bytes = 10;
  row.peak_bytes = 30;
  row.peak_phase = Phase::kBackward;
  b.rows.push_back(row);
  b.categories.emplace_back(Category::kSavedActivations, 10);
  b.attributed_bytes = 10;
  b.allocator_bytes = 10;
  const v1::MemoryBreakdown p = ToProto(b);
  EXPECT_EQ(p.by(), "module");
  EXPECT_EQ(p.phase(), "backward");
  ASSERT_EQ(p.rows_size(), 1);
  EXPECT_EQ(p.rows(0).category(), "saved_activations");
  EXPECT_EQ(p.rows(0).module_kind(), "mlp");
  EXPECT_EQ(p.rows(0).peak_phase(), "backward");
  EXPECT_EQ(p.categories(0).category(), "saved_activations");

  memory::MemoryDiff d;
  d.step_a = 1;
  d.step_b = 2;
  d.rows.push_back({"lm_head", Category::kTemporaries, 5, 9, 0, 0});
  d.steps_kept = {1, 2};
  const v1::MemoryDiff pd = ToProto(d);
  ASSERT_EQ(pd.rows_size(), 1);
  EXPECT_EQ(pd.rows(0).module(), "lm_head");
  EXPECT_EQ(pd.rows(0).category(), "temporaries");
  EXPECT_EQ(pd.rows(0).peak_b() - pd.rows(0).peak_a(), 4);
  EXPECT_EQ(pd.steps_kept_size(), 2);
}

}  // namespace
}  // namespace memprofd

namespace memprofd {
namespace {

// A status about one of the daemon's options reaches the client with the flag
// that sets it; any other status unchanged.
TEST(OptionFlagsTest, StatusesAboutAnOptionNameItsFlag) {
  EXPECT_EQ(FlagOfOption("snapshot_root"), "snapshot_root");
  EXPECT_EQ(FlagOfOption("data_roots"), "data_root");
  EXPECT_EQ(FlagOfOption("collective_timeout"), "collective_timeout_seconds");
  EXPECT_EQ(FlagOfOption("offload.enabled"), "offload");
  EXPECT_EQ(FlagOfOption("offload.min_offload_bytes"), "min_offload_bytes");
  EXPECT_EQ(FlagOfOption("offload.target"), "offload_target");
  EXPECT_EQ(FlagOfOption("offload.prefetch_depth"), "offload_prefetch_depth");
  EXPECT_EQ(FlagOfOption("max_plan_time"), "max_plan_seconds");
  const grpc::Status marked = ToGrpcStatus(OptionError(
      absl::StatusCode::kFailedPrecondition, "snapshot_root", "snapshots are off"));
  EXPECT_EQ(marked.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(marked.error_message(),
            "snapshots are off (snapshot_root is memprofd's --snapshot_root)");
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("seq_len: too long")).error_message(),
            "seq_len: too long");
}

}  // namespace
}  // namespace memprofd
