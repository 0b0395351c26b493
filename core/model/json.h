#ifndef MEMPROFD_CORE_MODEL_JSON_H_
#define MEMPROFD_CORE_MODEL_JSON_H_

// A small strict JSON (RFC 8259) value type with a parser and a serializer,
// for Hugging Face config.json files and safetensors headers.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// One JSON value: null, bool, number, string, array or object.
//
// Numbers remember whether their literal was an integer that fits in int64
// (safetensors offsets, config sizes), so they round-trip exactly; other
// numbers are doubles. Objects keep their members in insertion (document)
// order; keys are unique. A value type: copyable, not thread-safe for
// concurrent mutation, safe for concurrent reads.
class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Array = std::vector<JsonValue>;
  using Member = std::pair<std::string, JsonValue>;
  using Object = std::vector<Member>;

  JsonValue() = default;                                    // null
  JsonValue(bool b) : type_(Type::kBool), bool_(b) {}       // NOLINT(runtime/explicit)
  JsonValue(int i) : JsonValue(static_cast<int64_t>(i)) {}  // NOLINT
  JsonValue(int64_t i)                                      // NOLINT(runtime/explicit)
      : type_(Type::kNumber),
        is_integer_(true),
        int_(i),
        double_(static_cast<double>(i)) {}
  // Values above INT64_MAX become doubles.
  JsonValue(uint64_t u)  // NOLINT(runtime/explicit)
      : type_(Type::kNumber),
        is_integer_(u <= static_cast<uint64_t>(INT64_MAX)),
        int_(is_integer_ ? static_cast<int64_t>(u) : 0),
        double_(static_cast<double>(u)) {}
  JsonValue(double d) : type_(Type::kNumber), double_(d) {}  // NOLINT
  JsonValue(std::string s)                                   // NOLINT(runtime/explicit)
      : type_(Type::kString), string_(std::move(s)) {}
  JsonValue(const char* s) : JsonValue(std::string(s)) {}            // NOLINT
  JsonValue(absl::string_view s) : JsonValue(std::string(s)) {}      // NOLINT
  JsonValue(Array a) : type_(Type::kArray), array_(std::move(a)) {}  // NOLINT
  static JsonValue MakeObject() {
    JsonValue v;
    v.type_ = Type::kObject;
    return v;
  }
  static JsonValue MakeArray() { return JsonValue(Array{}); }

  // Parses exactly one JSON value (surrounding whitespace allowed). Strict:
  // no comments, trailing commas, NaN/Infinity, leading zeros, raw control
  // characters in strings, invalid escapes or unpaired surrogates, duplicate
  // object keys, or nesting deeper than 256. INVALID_ARGUMENT naming the byte
  // offset and what was expected.
  static absl::StatusOr<JsonValue> Parse(absl::string_view text);

  // Writes the value as JSON. indent < 0: compact, one line; indent >= 0:
  // one member per line indented by `indent` spaces per level. Doubles use
  // the shortest form that reads back to the same value; non-finite doubles
  // (not representable in JSON) are written as null.
  std::string Serialize(int indent = -1) const;

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
  const std::string& string_value() const { return string_; }
  const Array& array_items() const { return array_; }
  const Object& object_items() const { return object_; }
  Array& mutable_array_items() { return array_; }

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
  void SerializeTo(std::string* out, int indent, int depth) const;

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool is_integer_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  Array array_;
  Object object_;
};

// `s` as a JSON string literal, quotes included, with the escapes JSON needs
// (control characters as \u00XX; non-ASCII UTF-8 passes through).
std::string JsonQuote(absl::string_view s);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_MODEL_JSON_H_
