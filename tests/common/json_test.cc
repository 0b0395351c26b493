// memprofd's JSON value type: the strict reader (what it rejects, with byte
// offsets), exact numbers, and the serializer's formats (compact like
// serde_json, indented and key-sorted like Python's json.dumps).
#include "core/common/json.h"

#include <cstdint>
#include <limits>
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
  EXPECT_EQ(JsonValue::Parse(deep, /*max_depth=*/256).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string ok(200, '[');
  ok += std::string(200, ']');
  EXPECT_TRUE(JsonValue::Parse(ok, /*max_depth=*/256).ok());
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
  EXPECT_TRUE(JsonValue(std::numeric_limits<double>::quiet_NaN()).is_null());
}

TEST(JsonTest, ParsesAndSerializesRoundTrip) {
  auto v = JsonValue::Parse(
      R"( {"b": [1, -2.5e3, true, null], "a": {"x": "y\n\u00e9\ud83d\ude00"}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Serialize(), R"({"b":[1,-2.5e3,true,null],"a":{"x":"y\n)"
                            "\xc3\xa9\xf0\x9f\x98\x80\"}}");
  EXPECT_EQ(
      v->Serialize(2, /*sort_keys=*/true),
      "{\n  \"a\": {\n    \"x\": \"y\\n\xc3\xa9\xf0\x9f\x98\x80\"\n  },\n  \"b\": [\n"
      "    1,\n    -2.5e3,\n    true,\n    null\n  ]\n}");
  int64_t i;
  EXPECT_TRUE(v->Find("b")->array_items()[0].AsInt64(&i));
  EXPECT_EQ(i, 1);
  EXPECT_FALSE(v->Find("b")->array_items()[1].AsInt64(&i));
}

TEST(JsonTest, RejectsWhatSerdeRejectsAndDuplicates) {
  for (const char* bad :
       {"", "{", "{\"a\":1,}", "[1,]", "01", "1.", "{\"a\" 1}", "\"\\x\"", "\"\t\"",
        "\"\\ud800\"", "nul", "{} x", "{\"a\":1,\"a\":2}", "\"\xff\"", "\"\xc0\xaf\""}) {
    EXPECT_FALSE(JsonValue::Parse(bad).ok()) << bad;
  }
  // serde_json's recursion limit (128) is the default.
  std::string deep(200, '[');
  deep += std::string(200, ']');
  EXPECT_FALSE(JsonValue::Parse(deep).ok());
  std::string at_limit(129, '[');
  at_limit += std::string(129, ']');
  EXPECT_TRUE(JsonValue::Parse(at_limit).ok());
  at_limit = "[" + at_limit + "]";
  EXPECT_THAT(JsonValue::Parse(at_limit).status().message(),
              HasSubstr("nesting no deeper than 128"));
}

TEST(JsonTest, RejectsInvalidUtf8WithItsOffset) {
  absl::StatusOr<JsonValue> v = JsonValue::Parse("{\"ab\xe2\x82\":1}");
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(v.status().message(), HasSubstr("invalid JSON at byte 4: not valid UTF-8"));
  // Valid multi-byte text is kept byte for byte.
  v = JsonValue::Parse("\"\xe2\x82\xac \xf4\x8f\xbf\xbf\"");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->string_value(), "\xe2\x82\xac \xf4\x8f\xbf\xbf");
}

TEST(JsonTest, KeepsNumberTextExactly) {
  // safetensors offsets and config values must come back as written.
  absl::StatusOr<JsonValue> v =
      JsonValue::Parse("[1e-05, 0.020, 1.50, -0, 18446744073709551615, 5E+3]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Serialize(), "[1e-05,0.020,1.50,-0,18446744073709551615,5E+3]");
  const JsonValue::Array& a = v->array_items();
  EXPECT_EQ(a[1].number_text(), "0.020");
  EXPECT_DOUBLE_EQ(a[1].number_value(), 0.02);
  uint64_t u = 0;
  EXPECT_TRUE(a[4].AsUint64(&u));
  EXPECT_EQ(u, UINT64_MAX);
  EXPECT_FALSE(a[4].is_integer());
  int64_t i = 7;
  EXPECT_FALSE(a[4].AsInt64(&i));
  EXPECT_EQ(i, 7);
  EXPECT_FALSE(a[3].AsUint64(&u));  // "-0"
  EXPECT_TRUE(a[3].AsInt64(&i));
  EXPECT_EQ(i, 0);
  EXPECT_FALSE(a[5].AsUint64(&u));  // exponent: not an integer literal
  double d = 0;
  EXPECT_TRUE(a[5].AsDouble(&d));
  EXPECT_EQ(d, 5000.0);
  EXPECT_FALSE(JsonValue("5").AsDouble(&d));
  EXPECT_EQ(JsonValue("5").number_text(), "");
  EXPECT_EQ(JsonValue(5).string_value(), "");
  // Values built from C++ numbers.
  EXPECT_EQ(JsonValue(uint64_t{UINT64_MAX}).Serialize(), "18446744073709551615");
  EXPECT_EQ(JsonValue(uint64_t{UINT64_MAX}), a[4]);
  EXPECT_NE(JsonValue(uint64_t{UINT64_MAX - 1}), a[4]);
  EXPECT_EQ(JsonValue(0.1).Serialize(), "0.1");
  EXPECT_EQ(JsonValue(-3.0).Serialize(), "-3.0");
  EXPECT_EQ(JsonValue(1e300).Serialize(), "1e+300");
}

TEST(JsonTest, SortKeysOrdersByCodePointAtEveryLevel) {
  absl::StatusOr<JsonValue> v =
      JsonValue::Parse("{\"\xc3\xa9\":1,\"b\":{\"z\":[],\"a\":{}},\"B\":2,\"a\":3}");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Serialize(-1, /*sort_keys=*/true),
            "{\"B\":2,\"a\":3,\"b\":{\"a\":{},\"z\":[]},\"\xc3\xa9\":1}");
  // Sorting only affects the output, not the value.
  EXPECT_EQ(v->object_items()[0].first, "\xc3\xa9");
}

}  // namespace
}  // namespace memprofd
