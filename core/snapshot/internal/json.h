#ifndef MEMPROFD_CORE_SNAPSHOT_INTERNAL_JSON_H_
#define MEMPROFD_CORE_SNAPSHOT_INTERNAL_JSON_H_

// A small strict JSON value, reader and writer for safetensors headers,
// index files, config.json and snapshot manifests. Private to
// memprofd_snapshot (the model library has its own general JSON type).
//
// The reader follows RFC 8259 strictly, like serde_json (which the reference
// safetensors reader uses): valid UTF-8 only, no comments, no trailing commas,
// no lone surrogates, no control characters in strings, nesting depth at most
// 128, whitespace allowed before and after the value. Unlike serde_json it
// also rejects duplicate object keys. Objects keep their insertion order.
// Values are plain data: not thread-safe for concurrent mutation.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/internal/utf8.h"

namespace memprofd {
namespace snapshot_internal {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  using Object = std::vector<std::pair<std::string, JsonValue>>;
  using Array = std::vector<JsonValue>;

  JsonValue() = default;  // null
  static JsonValue Bool(bool b);
  static JsonValue Int(int64_t v);
  static JsonValue Double(double v);  // non-finite values become null
  // A number from its JSON text (already validated by the parser).
  static JsonValue NumberText(std::string text);
  static JsonValue String(std::string s);
  static JsonValue MakeArray();
  static JsonValue MakeObject();

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  bool bool_value() const { return bool_; }
  // The string's value, or the number's JSON text.
  const std::string& text() const { return text_; }
  // True and *out set when this is a number written as an integer (no
  // fraction, no exponent) that fits.
  bool AsInt64(int64_t* out) const;
  bool AsUint64(uint64_t* out) const;
  // True and *out set for any number.
  bool AsDouble(double* out) const;

  const Array& array() const { return array_; }
  Array& mutable_array() { return array_; }
  const Object& object() const { return object_; }
  // The member named `key`, or nullptr (also when not an object).
  const JsonValue* Find(absl::string_view key) const;
  // Replaces the member named `key` or appends it. Object only.
  void Set(absl::string_view key, JsonValue value);
  void Append(JsonValue value) { array_.push_back(std::move(value)); }

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  std::string text_;
  Array array_;
  Object object_;
};

// Parses one JSON document. INVALID_ARGUMENT with the byte offset and the
// problem on any violation of the rules above.
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

// Serializes `value`. indent < 0: compact (no spaces at all, like serde_json).
// indent >= 0: one member per line, like Python's json.dumps(indent=...).
// sort_keys orders object members by key bytes. Non-ASCII text is written as
// UTF-8; control characters and quotes are escaped.
std::string SerializeJson(const JsonValue& value, int indent = -1,
                          bool sort_keys = false);

// `s` as a JSON string literal with quotes.
std::string JsonQuote(absl::string_view s);

}  // namespace snapshot_internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_JSON_H_
