// memprofd's JSON over nlohmann: what the strict reader rejects and at which
// byte, exact integers, doubles written as Python writes them, and the
// writer's formats (compact like serde_json, indented like json.dumps).
#include "core/common/json.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace memprofd {
namespace {

using ::testing::HasSubstr;

// `text` must fail with "invalid JSON at byte <offset>: ...<what>...".
void ExpectRejected(absl::string_view text, size_t offset, absl::string_view what,
                    int max_depth = kDefaultJsonMaxDepth) {
  absl::StatusOr<Json> v = ParseJson(text, max_depth);
  ASSERT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(v.status().message(),
              HasSubstr(absl::StrCat("invalid JSON at byte ", offset, ": ")))
      << text;
  EXPECT_THAT(v.status().message(), HasSubstr(what)) << text;
  // Status messages travel in protobuf strings.
  EXPECT_TRUE(IsValidUtf8(v.status().message())) << v.status().message();
}

TEST(JsonTest, ParsesScalarsArraysAndObjects) {
  absl::StatusOr<Json> v = ParseJson(
      R"( {"a": 1, "b": [true, false, null, -2.5e3, "x", -7], "c": {"d": 0}} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  EXPECT_EQ(v->size(), 3u);
  EXPECT_TRUE((*v)["a"].is_number_unsigned());
  const Json& b = (*v)["b"];
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b[0], true);
  EXPECT_EQ(b[1], false);
  EXPECT_TRUE(b[2].is_null());
  EXPECT_TRUE(b[3].is_number_float());
  EXPECT_EQ(b[3].get<double>(), -2500.0);
  EXPECT_EQ(b[4], "x");
  EXPECT_TRUE(b[5].is_number_integer());
  EXPECT_FALSE(b[5].is_number_unsigned());
  EXPECT_EQ(JsonFind(*JsonFind(*v, "c"), "d")->get<int>(), 0);
}

TEST(JsonTest, JsonFindIsNullForMissingKeysAndNonObjects) {
  absl::StatusOr<Json> v = ParseJson(R"({"a": [1]})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(JsonFind(*v, "missing"), nullptr);
  EXPECT_EQ(JsonFind(*JsonFind(*v, "a"), "a"), nullptr);
  EXPECT_EQ(JsonFind(Json(), "a"), nullptr);
  EXPECT_EQ(JsonFind(Json("a"), "a"), nullptr);
}

TEST(JsonTest, DecodesEscapesAndSurrogatePairs) {
  absl::StatusOr<Json> v = ParseJson(R"("q\"b\\s\/n\nt\tu\u00e9\ud83d\ude00\b\f\r")");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "q\"b\\s/n\nt\tu\xc3\xa9\xf0\x9f\x98\x80\b\f\r");
}

TEST(JsonTest, KeepsIntegersExactToUint64Max) {
  // safetensors data offsets beyond 2^53 must not lose precision.
  absl::StatusOr<Json> v =
      ParseJson("[9007199254740993, -9223372036854775808, 18446744073709551615]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0].get<uint64_t>(), 9007199254740993u);
  EXPECT_EQ((*v)[1].get<int64_t>(), INT64_MIN);
  EXPECT_EQ((*v)[2].get<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(DumpJson(*v), "[9007199254740993,-9223372036854775808,18446744073709551615]");
  // Past the integer types: a double, as in Python's float(text).
  absl::StatusOr<Json> big = ParseJson("[18446744073709551616, -9223372036854775809]");
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_TRUE((*big)[0].is_number_float());
  EXPECT_EQ((*big)[0].get<double>(), 18446744073709551616.0);
  EXPECT_TRUE((*big)[1].is_number_float());
}

TEST(JsonTest, JsonToInt64TakesIntegerLiteralsThatFit) {
  absl::StatusOr<Json> v = ParseJson(
      "[0, -0, 9223372036854775807, -9223372036854775808, "
      "9223372036854775808, 1.0, 5E+3, \"5\", null]");
  ASSERT_TRUE(v.ok()) << v.status();
  int64_t i = 7;
  EXPECT_TRUE(JsonToInt64((*v)[0], &i));
  EXPECT_EQ(i, 0);
  EXPECT_TRUE(JsonToInt64((*v)[1], &i));
  EXPECT_EQ(i, 0);
  EXPECT_TRUE(JsonToInt64((*v)[2], &i));
  EXPECT_EQ(i, INT64_MAX);
  EXPECT_TRUE(JsonToInt64((*v)[3], &i));
  EXPECT_EQ(i, INT64_MIN);
  i = 7;
  for (int k = 4; k < 9; ++k) {
    EXPECT_FALSE(JsonToInt64((*v)[k], &i)) << (*v)[k];
    EXPECT_EQ(i, 7);
  }
}

TEST(JsonTest, RejectsMalformedDocumentsAtTheByteThatFailed) {
  struct Case {
    const char* text;
    size_t offset;
    const char* what;
  };
  for (const Case& c : {
           Case{"", 0, "unexpected end of input"},
           Case{"{", 1, "unexpected end of input"},
           Case{"[1,]", 3, "unexpected ']'"},
           Case{"{\"a\":1,}", 7, "unexpected '}'"},
           Case{"{a:1}", 1, "invalid literal"},
           Case{"{\"a\" 1}", 5, "expected ':'"},
           Case{"01", 1, "expected end of input"},
           Case{"-01", 2, "expected end of input"},
           Case{"1.", 2, "expected digit after '.'"},
           Case{".5", 0, "invalid literal"},
           Case{"-", 1, "expected digit after '-'"},
           Case{"1e", 2, "after exponent"},
           Case{"+1", 0, "invalid literal"},
           Case{"NaN", 0, "invalid literal"},
           Case{"Infinity", 0, "invalid literal"},
           Case{"[-Infinity]", 2, "expected digit after '-'"},
           Case{"tru", 3, "invalid literal; last read: 'tru'"},
           Case{"nul", 3, "invalid literal"},
           Case{"\"abc", 4, "missing closing quote"},
           Case{"\"\\x\"", 2, "forbidden character after backslash"},
           Case{"\"\\u12\"", 5, "4 hex digits"},
           Case{"\"\\ud800\"", 7, "must be followed by U+DC00..U+DFFF"},
           Case{"\"\\ud800\\u0041\"", 12, "must be followed by U+DC00..U+DFFF"},
           Case{"\"\\udc00\"", 6, "must follow U+D800..U+DBFF"},
           Case{"\"a\tb\"", 2, "control character U+0009 (HT) must be escaped"},
           Case{"\"a\nb\"", 2, "control character U+000A (LF) must be escaped"},
           Case{"[1] [2]", 4, "expected end of input"},
           Case{"{} x", 3, "expected end of input"},
           Case{"/*c*/1", 0, "invalid literal"},
           Case{"// c\n1", 0, "invalid literal"},
           Case{"[1 # c\n]", 3, "invalid literal"},
       }) {
    ExpectRejected(c.text, c.offset, c.what);
  }
}

TEST(JsonTest, RejectsNumbersBeyondDoubleRange) {
  ExpectRejected("1e999", 4, "number overflow parsing '1e999'");
  ExpectRejected("[-1E400]", 6, "number overflow");
  ExpectRejected("{\"eps\": 1e309}", 12, "number overflow");
  absl::StatusOr<Json> v = ParseJson("[1.7976931348623157e308, 1e-400]");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)[0].get<double>(), std::numeric_limits<double>::max());
  EXPECT_EQ((*v)[1].get<double>(), 0.0);  // underflow reads as 0, as in Python
}

TEST(JsonTest, RejectsDuplicateKeysAtTheSecondKey) {
  ExpectRejected(R"({"a": 1, "a": 2})", 9, "duplicate key \"a\"");
  ExpectRejected(R"({"x": {"b": 1, "c": {}, "b": [2]}})", 24, "duplicate key \"b\"");
  // Equal after decoding the escapes.
  ExpectRejected(R"({"a": 1, "\u0061": 2})", 9, "duplicate key \"a\"");
  ExpectRejected(R"({"q\"\\": 1, "q\"\\": 2})", 13, R"(duplicate key "q\"\\")");
  // The same key in sibling objects is fine.
  EXPECT_TRUE(ParseJson(R"([{"a": 1}, {"a": 2}])").ok());
}

TEST(JsonTest, RejectsNestingBeyondTheLimit) {
  auto nested = [](int n, char open, char close) {
    return std::string(n, open) + std::string(n, close);
  };
  EXPECT_TRUE(ParseJson(nested(kDefaultJsonMaxDepth, '[', ']')).ok());
  ExpectRejected(nested(kDefaultJsonMaxDepth + 1, '[', ']'), 128,
                 "nesting deeper than 128 levels");
  ExpectRejected(nested(100000, '[', ']'), 128, "nesting deeper than 128 levels");
  std::string objects;
  for (int i = 0; i < 4; ++i) objects += "{\"k\":";
  objects += "1}}}}";
  EXPECT_TRUE(ParseJson(objects, /*max_depth=*/4).ok());
  ExpectRejected(objects, 15, "nesting deeper than 3 levels", /*max_depth=*/3);
  EXPECT_TRUE(ParseJson(nested(200, '[', ']'), /*max_depth=*/256).ok());
  ExpectRejected(nested(300, '[', ']'), 256, "nesting deeper than 256", 256);
  // Scalars have no depth.
  EXPECT_TRUE(ParseJson("1", /*max_depth=*/0).ok());
}

TEST(JsonTest, RejectsInvalidUtf8AndByteOrderMarks) {
  struct Case {
    const char* text;
    size_t offset;
  };
  for (const Case& c : {
           Case{"{\"ab\xe2\x82\":1}", 6},    // truncated sequence in a key
           Case{"\"\xc0\xaf\"", 1},          // overlong '/'
           Case{"\"\xe0\x80\xaf\"", 2},      // overlong, 3 bytes
           Case{"\"\xed\xa0\x80\"", 2},      // surrogate U+D800 in UTF-8
           Case{"\"\xf4\x90\x80\x80\"", 2},  // above U+10FFFF
           Case{"\"\x80\"", 1},              // lone continuation byte
           Case{"\"\xff\"", 1},              //
           Case{"[\"ok\", \xc3\xa9]", 7},    // valid UTF-8 outside a string
           Case{"tru\xc3\xa9", 3},           // the quoted token would be cut
       }) {
    ExpectRejected(c.text, c.offset, "");
  }
  ExpectRejected("\xef\xbb\xbf{}", 0, "a byte order mark is not allowed");
  // Valid multi-byte text is kept byte for byte.
  absl::StatusOr<Json> v = ParseJson("\"\xe2\x82\xac \xf4\x8f\xbf\xbf\"");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "\xe2\x82\xac \xf4\x8f\xbf\xbf");
}

TEST(JsonTest, WritesCompactOrIndentedWithSortedKeys) {
  absl::StatusOr<Json> v = ParseJson(
      "{\"\xc3\xa9\":1,\"b\":{\"z\":[],\"a\":{}},\"B\":[1,-2.5e3,true,null],"
      "\"a\":\"y\\n\xf0\x9f\x98\x80\"}");
  ASSERT_TRUE(v.ok()) << v.status();
  // Byte order of the keys is code point order; no spaces when compact.
  EXPECT_EQ(DumpJson(*v),
            "{\"B\":[1,-2500.0,true,null],\"a\":\"y\\n\xf0\x9f\x98\x80\",\"b\":{\"a\":{},"
            "\"z\":[]},\"\xc3\xa9\":1}");
  // Python's json.dumps(v, indent=2, sort_keys=True, ensure_ascii=False).
  EXPECT_EQ(DumpJson(*v, 2),
            "{\n  \"B\": [\n    1,\n    -2500.0,\n    true,\n    null\n  ],\n"
            "  \"a\": \"y\\n\xf0\x9f\x98\x80\",\n  \"b\": {\n    \"a\": {},\n"
            "    \"z\": []\n  },\n  \"\xc3\xa9\": 1\n}");
}

TEST(JsonTest, QuotesStringsAndNeverThrowsOnInvalidUtf8) {
  EXPECT_EQ(JsonQuote("a \"quoted\"\n\x01 \\ str\xc3\xa9"),
            R"("a \"quoted\"\n\u0001 \\ str)"
            "\xc3\xa9\"");
  // nlohmann's dump() would throw; DumpJson writes U+FFFD instead.
  EXPECT_EQ(JsonQuote("bad \xff byte"), "\"bad \xef\xbf\xbd byte\"");
  EXPECT_EQ(DumpJson(Json::object({{"k\xc0", "v\xff"}})),
            "{\"k\xef\xbf\xbd\":\"v\xef\xbf\xbd\"}");
}

TEST(JsonTest, WritesDoublesAsPythonReprDoes) {
  // The values config.json holds, and how transformers (Python's repr)
  // writes them.
  struct Case {
    double value;
    const char* text;
  };
  for (const Case& c : {
           Case{1e-5, "1e-05"},
           Case{1e-6, "1e-06"},
           Case{0.02, "0.02"},
           Case{0.0, "0.0"},
           Case{-0.0, "-0.0"},
           Case{500000.0, "500000.0"},
           Case{10000.0, "10000.0"},
           Case{1.0 / 3.0, "0.3333333333333333"},
           Case{0.1, "0.1"},
           Case{0.0001, "0.0001"},
           Case{1e16, "1e+16"},
           Case{1e300, "1e+300"},
           Case{5e-324, "5e-324"},
       }) {
    const std::string text = DumpJson(Json(c.value));
    EXPECT_EQ(text, c.text);
    absl::StatusOr<Json> back = ParseJson(text);
    ASSERT_TRUE(back.ok()) << back.status();
    const double d = back->get<double>();
    EXPECT_EQ(std::memcmp(&d, &c.value, sizeof d), 0) << text;
  }
  // Not representable in JSON: null, as Python's json.dumps cannot write them either.
  EXPECT_EQ(DumpJson(Json(std::numeric_limits<double>::infinity())), "null");
  EXPECT_EQ(DumpJson(Json(std::numeric_limits<double>::quiet_NaN())), "null");
}

TEST(JsonTest, TransformersConfigPassesThroughByteForByte) {
  // LlamaConfig(...).to_json_string(use_diff=False) from transformers 5.
  const std::string config = R"({
  "_name_or_path": "",
  "architectures": null,
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "dtype": "bfloat16",
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "id2label": {
    "0": "LABEL_0",
    "1": "LABEL_1"
  },
  "initializer_range": 0.02,
  "max_position_embeddings": 131072,
  "pad_token_id": null,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {
    "rope_theta": 500000.0,
    "rope_type": "default"
  },
  "tie_word_embeddings": true,
  "vocab_size": 128256
}
)";
  absl::StatusOr<Json> v = ParseJson(config);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)["rms_norm_eps"].get<double>(), 1e-5);
  EXPECT_EQ((*v)["rope_parameters"]["rope_theta"].get<double>(), 500000.0);
  EXPECT_TRUE((*v)["rope_parameters"]["rope_theta"].is_number_float());
  EXPECT_EQ(DumpJson(*v, 2) + "\n", config);
}

}  // namespace
}  // namespace memprofd
