#ifndef MEMPROFD_CORE_COMMON_JSON_H_
#define MEMPROFD_CORE_COMMON_JSON_H_

// memprofd's JSON: nlohmann::json values, read through one strict parser and
// written through one serializer that never throws. For Hugging Face
// config.json files, safetensors headers and indexes, and snapshot
// manifests. No LibTorch.
//
// nlohmann throws on misuse; memprofd code never lets it. When reading a
// value, check its type (is_string(), is_number_unsigned()...) before
// get<T>(), look members up with JsonFind (never at() or operator[] on a
// const value), and write with DumpJson rather than dump().

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// A JSON value. Objects are std::maps, so members are unique and always
// written sorted by key (byte order, which is code point order), as Python's
// json.dumps(sort_keys=True) and so transformers write them. Numbers are
// int64, uint64 (every non-negative integer literal up to UINT64_MAX, exact)
// or double (any literal with a fraction or exponent, or out of integer
// range); a double is written as the shortest text that reads back to it,
// as Python's repr does (1e-05, 500000.0). A value type: copyable, safe for
// concurrent reads, not for concurrent mutation.
using Json = nlohmann::json;

// Nesting limit of ParseJson unless told otherwise: serde_json's budget (the
// reference safetensors reader's parser, which stops one level earlier, at
// 127; no valid safetensors header nests deeper than 3).
inline constexpr int kDefaultJsonMaxDepth = 128;

// Parses exactly one JSON value (surrounding whitespace allowed) with at
// most `max_depth` nested arrays and objects. Strict: valid UTF-8 only; no
// byte order mark, comments, trailing commas, NaN/Infinity, leading zeros,
// numbers beyond double range, raw control characters in strings, invalid
// escapes, unpaired surrogates or duplicate object keys (which nlohmann
// alone would let the last one win). INVALID_ARGUMENT "invalid JSON at byte
// N: ..." where N is the offset of the byte at which the problem was found
// (the text's size when it ended too early). Thread-safe.
absl::StatusOr<Json> ParseJson(absl::string_view text,
                               int max_depth = kDefaultJsonMaxDepth);

// `value` as JSON text: compact with no spaces at all for indent < 0 (like
// serde_json), else one member per line indented by `indent` spaces per
// level, like Python's json.dumps(indent=...). Non-ASCII text is written as
// UTF-8; quotes, backslashes and control characters are escaped. Never
// throws: bytes that are not valid UTF-8 in a string are written as U+FFFD.
std::string DumpJson(const Json& value, int indent = -1);

// `s` as a JSON string literal, quotes included, as DumpJson writes it.
std::string JsonQuote(absl::string_view s);

// Member `key` of `object`, or nullptr when it is absent or `object` is not
// an object.
const Json* JsonFind(const Json& object, absl::string_view key);

// True and *out set when `value` is an integer number (written without
// fraction or exponent) that fits int64_t; false and *out untouched
// otherwise.
bool JsonToInt64(const Json& value, int64_t* out);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_JSON_H_
