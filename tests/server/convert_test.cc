// The proto conversions of server/convert.h: requests carry only what the
// client set, and the skip reasons map onto their proto fields through core's
// one table.
#include "server/convert.h"

#include <set>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/offload/offload_options.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

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

}  // namespace
}  // namespace memprofd
