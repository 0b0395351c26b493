#ifndef MEMPROFD_CORE_COMMON_JSON_H_
#define MEMPROFD_CORE_COMMON_JSON_H_

// memprofd's one JSON implementation: a strict RFC 8259 value type with a
// parser and a serializer, for Hugging Face config.json files, safetensors
// headers and indexes, and snapshot manifests. No LibTorch.
//
// The reader is as strict as serde_json (which the reference safetensors
// reader uses): valid UTF-8 only, no comments, trailing commas, NaN/Infinity,
// leading zeros, numbers beyond double range, raw control characters in
// strings, invalid escapes or unpaired surrogates; nesting at most 128 deep
// by default. Unlike serde_json it also rejects duplicate object keys.

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// One JSON value: null, bool, number, string, array or object.
//
// Numbers keep their JSON text: a parsed number serializes back exactly as
// it was written (1e-05 stays 1e-05, 18446744073709551615 stays exact), and
// a number built from a C++ value is written as an integer or as the
// shortest double text that reads back to the same value (10000.0, 1e-05).
// A number written as an integer literal that fits in int64 is an integer
// (is_integer()); AsUint64 reads integers up to UINT64_MAX from the text.
// Objects keep their members in insertion (document) order; keys are unique.
// A value type: copyable, not thread-safe for concurrent mutation, safe for
// concurrent reads.
class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  using Member = std::pair<std::string, JsonValue>;
  using Object = std::vector<Member>;

  // Nesting limit of Parse unless told otherwise: serde_json's, so that
  // whatever memprofd accepts the reference safetensors reader accepts too.
  static constexpr int kDefaultMaxDepth = 128;

  JsonValue() = default;                                    // null
  JsonValue(bool b) : type_(Type::kBool), bool_(b) {}       // NOLINT(runtime/explicit)
  JsonValue(int i) : JsonValue(static_cast<int64_t>(i)) {}  // NOLINT
  JsonValue(int64_t i);                                     // NOLINT(runtime/explicit)
  // Values above INT64_MAX are exact in the text but not is_integer().
  JsonValue(uint64_t u);  // NOLINT(runtime/explicit)
  // Non-finite doubles (not representable in JSON) become null.
  JsonValue(double d);      // NOLINT(runtime/explicit)
  JsonValue(std::string s)  // NOLINT(runtime/explicit)
      : type_(Type::kString), text_(std::move(s)) {}
  JsonValue(const char* s) : JsonValue(std::string(s)) {}            // NOLINT
  JsonValue(absl::string_view s) : JsonValue(std::string(s)) {}      // NOLINT
  JsonValue(Array a) : type_(Type::kArray), array_(std::move(a)) {}  // NOLINT
  static JsonValue MakeObject() {
    JsonValue v;
    v.type_ = Type::kObject;
    return v;
  }
  static JsonValue MakeArray() { return JsonValue(Array{}); }

  // Parses exactly one JSON value (surrounding whitespace allowed) under the
  // rules above, with at most `max_depth` levels of nesting. INVALID_ARGUMENT
  // "invalid JSON at byte N: ..." naming what was wrong or expected.
  static absl::StatusOr<JsonValue> Parse(absl::string_view text,
                                         int max_depth = kDefaultMaxDepth);

  // Writes the value as JSON. indent < 0: compact, no spaces at all (like
  // serde_json); indent >= 0: one member per line indented by `indent`
  // spaces per level, like Python's json.dumps(indent=...). sort_keys orders
  // object members by key bytes (code point order), as json.dumps does.
  // Non-ASCII text is written as UTF-8; quotes, backslashes and control
  // characters are escaped.
  std::string Serialize(int indent = -1, bool sort_keys = false) const;

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  // A number written as an integer literal that fits in int64.
  bool is_integer() const { return type_ == Type::kNumber && is_integer_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // Accessors; on a value of another type they return false, 0 or an empty
  // string/array/object.
  bool bool_value() const { return type_ == Type::kBool && bool_; }
  double number_value() const { return type_ == Type::kNumber ? double_ : 0.0; }
  int64_t int_value() const { return is_integer() ? int_ : 0; }
  const std::string& string_value() const;
  // A number's JSON text, exactly as parsed or generated.
  const std::string& number_text() const;
  const Array& array_items() const { return array_; }
  const Object& object_items() const { return object_; }
  Array& mutable_array_items() { return array_; }

  // True and *out set when this is an integer number (no fraction, no
  // exponent) that fits the type; false and *out untouched otherwise.
  bool AsInt64(int64_t* out) const;
  bool AsUint64(uint64_t* out) const;
  // True and *out set for any number.
  bool AsDouble(double* out) const;

  // Object member `key`, or nullptr when absent or when this is no object.
  const JsonValue* Find(absl::string_view key) const;
  // Sets member `key` of an object (replacing an existing one in place,
  // appending a new one at the end). Turns a null value into an object.
  void Set(absl::string_view key, JsonValue value);
  // Appends to an array. Turns a null value into an array.
  void Append(JsonValue value);

  // Structural equality (numbers compare by value; object member order
  // matters).
  friend bool operator==(const JsonValue& a, const JsonValue& b);
  friend bool operator!=(const JsonValue& a, const JsonValue& b) { return !(a == b); }

 private:
  friend class JsonParser;
  void SerializeTo(std::string* out, int indent, bool sort_keys, int depth) const;

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_integer_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string text_;  // a string's value or a number's JSON text
  Array array_;
  Object object_;
};

// `s` as a JSON string literal, quotes included, with the escapes JSON needs
// (control characters as \u00XX; non-ASCII UTF-8 passes through).
std::string JsonQuote(absl::string_view s);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_JSON_H_
