#include "core/model/json.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

TEST(JsonTest, ParsesScalarsArraysAndObjects) {
  absl::StatusOr<JsonValue> v = JsonValue::Parse(
      R"( {"a": 1, "b": [true, false, null, -2.5e3, "x"], "c": {"d": 0}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  ASSERT_EQ(v->object_items().size(), 3u);
  EXPECT_EQ(v->object_items()[0].first, "a");
  EXPECT_TRUE(v->Find("a")->is_integer());
  EXPECT_EQ(v->Find("a")->int_value(), 1);
  const JsonValue::Array& b = v->Find("b")->array_items();
  ASSERT_EQ(b.size(), 5u);
  EXPECT_TRUE(b[0].bool_value());
  EXPECT_TRUE(b[1].is_bool());
  EXPECT_FALSE(b[1].bool_value());
  EXPECT_TRUE(b[2].is_null());
  EXPECT_FALSE(b[3].is_integer());
  EXPECT_DOUBLE_EQ(b[3].number_value(), -2500.0);
  EXPECT_EQ(b[4].string_value(), "x");
  EXPECT_EQ(v->Find("c")->Find("d")->int_value(), 0);
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(JsonTest, DecodesEscapesAndSurrogatePairs) {
  absl::StatusOr<JsonValue> v =
      JsonValue::Parse(R"("q\"b\\s\/n\nt\tu\u00e9\ud83d\ude00\b\f\r")");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->string_value(), "q\"b\\s/n\nt\tu\xc3\xa9\xf0\x9f\x98\x80\b\f\r");
}

TEST(JsonTest, KeepsLargeIntegersExact) {
  // safetensors data offsets beyond 2^53 must not lose precision.
  absl::StatusOr<JsonValue> v =
      JsonValue::Parse("[9007199254740993, -9223372036854775808]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->array_items()[0].int_value(), 9007199254740993);
  EXPECT_EQ(v->array_items()[1].int_value(), INT64_MIN);
  EXPECT_EQ(v->Serialize(), "[9007199254740993,-9223372036854775808]");
  // Past int64: a double.
  absl::StatusOr<JsonValue> big = JsonValue::Parse("18446744073709551616");
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->is_integer());
  EXPECT_DOUBLE_EQ(big->number_value(), 18446744073709551616.0);
}

TEST(JsonTest, RejectsMalformedDocumentsWithPosition) {
  const char* bad[] = {
      "",        "{",       "[1,]",      "{\"a\":1,}",  "{a:1}",
      "01",      "1.",      ".5",        "-",           "1e",
      "+1",      "NaN",     "Infinity",  "tru",         "nul",
      "\"abc",   "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\udc00\"",
      "[1] [2]", "/*c*/1",  "\"a\tb\"",  "1e999",       "{\"a\" 1}",
  };
  for (const char* text : bad) {
    absl::StatusOr<JsonValue> v = JsonValue::Parse(text);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
        << "'" << text << "'";
    if (!v.ok()) {
      EXPECT_THAT(v.status().message(), HasSubstr("invalid JSON at byte"));
    }
  }
}

TEST(JsonTest, RejectsDuplicateKeys) {
  absl::StatusOr<JsonValue> v = JsonValue::Parse(R"({"a": 1, "a": 2})");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("duplicate key \"a\""));
}

TEST(JsonTest, RejectsNestingBeyondLimit) {
  std::string deep(300, '[');
  deep += std::string(300, ']');
  EXPECT_EQ(JsonValue::Parse(deep).status().code(), absl::StatusCode::kInvalidArgument);
  std::string ok(200, '[');
  ok += std::string(200, ']');
  EXPECT_TRUE(JsonValue::Parse(ok).ok());
}

TEST(JsonTest, SerializesAndParsesBack) {
  JsonValue root = JsonValue::MakeObject();
  root.Set("name", "a \"quoted\"\n\x01 string");
  root.Set("eps", 1e-5);
  root.Set("theta", 10000.0);
  root.Set("third", 1.0 / 3.0);
  root.Set("n", int64_t{42});
  root.Set("flag", true);
  root.Set("none", JsonValue());
  JsonValue arr = JsonValue::MakeArray();
  arr.Append(1);
  arr.Append("two");
  arr.Append(JsonValue::MakeObject());
  root.Set("list", arr);
  root.Set("n", int64_t{43});  // replaces in place

  for (int indent : {-1, 2}) {
    std::string text = root.Serialize(indent);
    absl::StatusOr<JsonValue> back = JsonValue::Parse(text);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
    EXPECT_EQ(*back, root) << text;
  }
  EXPECT_EQ(root.object_items()[4].first, "n");
  EXPECT_EQ(root.Find("n")->int_value(), 43);
  std::string compact = root.Serialize();
  EXPECT_THAT(compact, HasSubstr(R"("eps":1e-05)"));
  EXPECT_THAT(compact, HasSubstr(R"("theta":10000.0)"));
  EXPECT_THAT(compact, HasSubstr(R"("name":"a \"quoted\"\n\u0001 string")"));
  EXPECT_EQ(JsonValue::MakeArray().Serialize(2), "[]");
}

TEST(JsonTest, NonFiniteDoublesSerializeAsNull) {
  EXPECT_EQ(JsonValue(std::numeric_limits<double>::infinity()).Serialize(), "null");
}

}  // namespace
}  // namespace memprofd
