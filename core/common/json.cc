#include "core/common/json.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/utf8.h"

namespace memprofd {

// Recursive-descent parser over one document. Not thread-safe (one per
// Parse call).
class JsonParser {
 public:
  JsonParser(absl::string_view text, int max_depth)
      : text_(text), max_depth_(max_depth) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    absl::Status s = ParseValue(&value, 0);
    if (!s.ok()) return s;
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("end of input after the value");
    return value;
  }

 private:
  absl::Status Error(absl::string_view expected) const {
    std::string found = "end of input";
    if (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      found = c >= 0x20 && c < 0x7F ? absl::StrFormat("'%c'", c)
                                    : absl::StrFormat("byte 0x%02x", c);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid JSON at byte ", pos_, ": expected ", expected, ", found ", found));
  }

  void SkipWhitespace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(absl::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) return false;
    pos_ += literal.size();
    return true;
  }

  absl::Status ParseValue(JsonValue* out, int depth) {
    if (depth > max_depth_) {
      return Error(absl::StrCat("nesting no deeper than ", max_depth_));
    }
    SkipWhitespace();
    if (pos_ >= text_.size()) return Error("a value");
    char c = text_[pos_];
    switch (c) {
      case '{':
        return ParseObject(out, depth);
      case '[':
        return ParseArray(out, depth);
      case '"': {
        std::string s;
        absl::Status st = ParseString(&s);
        if (!st.ok()) return st;
        *out = JsonValue(std::move(s));
        return absl::OkStatus();
      }
      case 't':
        if (Consume("true")) {
          *out = JsonValue(true);
          return absl::OkStatus();
        }
        return Error("a value");
      case 'f':
        if (Consume("false")) {
          *out = JsonValue(false);
          return absl::OkStatus();
        }
        return Error("a value");
      case 'n':
        if (Consume("null")) {
          *out = JsonValue();
          return absl::OkStatus();
        }
        return Error("a value");
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
        return Error("a value");
    }
  }

  absl::Status ParseObject(JsonValue* out, int depth) {
    ++pos_;  // '{'
    *out = JsonValue::MakeObject();
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == '}') {
      ++pos_;
      return absl::OkStatus();
    }
    std::unordered_set<std::string> keys;
    while (true) {
      SkipWhitespace();
      if (pos_ >= text_.size() || text_[pos_] != '"') return Error("a string key");
      size_t key_pos = pos_;
      std::string key;
      absl::Status s = ParseString(&key);
      if (!s.ok()) return s;
      if (!keys.insert(key).second) {
        return absl::InvalidArgumentError(absl::StrCat("invalid JSON at byte ", key_pos,
                                                       ": duplicate key \"", key, "\""));
      }
      SkipWhitespace();
      if (!Consume(":")) return Error("':'");
      JsonValue value;
      s = ParseValue(&value, depth + 1);
      if (!s.ok()) return s;
      out->object_.emplace_back(std::move(key), std::move(value));
      SkipWhitespace();
      if (Consume(",")) continue;
      if (Consume("}")) return absl::OkStatus();
      return Error("',' or '}'");
    }
  }

  absl::Status ParseArray(JsonValue* out, int depth) {
    ++pos_;  // '['
    *out = JsonValue::MakeArray();
    SkipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == ']') {
      ++pos_;
      return absl::OkStatus();
    }
    while (true) {
      JsonValue value;
      absl::Status s = ParseValue(&value, depth + 1);
      if (!s.ok()) return s;
      out->array_.push_back(std::move(value));
      SkipWhitespace();
      if (Consume(",")) continue;
      if (Consume("]")) return absl::OkStatus();
      return Error("',' or ']'");
    }
  }

  absl::Status ParseHex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Error("four hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Error("a hex digit");
      }
      ++pos_;
    }
    *out = v;
    return absl::OkStatus();
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  absl::Status ParseString(std::string* out) {
    ++pos_;  // '"'
    out->clear();
    while (true) {
      if (pos_ >= text_.size()) return Error("'\"' closing the string");
      unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return absl::OkStatus();
      }
      if (c < 0x20) return Error("no raw control character in a string (use \\u00XX)");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= text_.size()) return Error("an escape character");
      const char e = text_[pos_++];
      // The escapes that stand for one character, and those characters.
      constexpr absl::string_view kEscapes = "\"\\/bfnrt";
      constexpr absl::string_view kMeanings = "\"\\/\b\f\n\r\t";
      if (const size_t k = kEscapes.find(e); k != absl::string_view::npos) {
        out->push_back(kMeanings[k]);
        continue;
      }
      if (e != 'u') {
        --pos_;
        return Error("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
      uint32_t cp = 0;
      absl::Status s = ParseHex4(&cp);
      if (!s.ok()) return s;
      if (cp >= 0xDC00 && cp <= 0xDFFF) return Error("a high surrogate before a low one");
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (!Consume("\\u")) return Error("a low surrogate (\\uDC00-\\uDFFF)");
        uint32_t low = 0;
        s = ParseHex4(&low);
        if (!s.ok()) return s;
        if (low < 0xDC00 || low > 0xDFFF)
          return Error("a low surrogate (\\uDC00-\\uDFFF)");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
      }
      AppendUtf8(cp, out);
    }
  }

  absl::Status ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    bool integer = true;
    if (text_[pos_] == '-') ++pos_;
    auto digit = [&] {
      return pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9';
    };
    if (!digit()) return Error("a digit");
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit()) return Error("no leading zero");
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < text_.size() && text_[pos_] == '.') {
      integer = false;
      ++pos_;
      if (!digit()) return Error("a digit after '.'");
      while (digit()) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      integer = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit()) return Error("a digit in the exponent");
      while (digit()) ++pos_;
    }
    absl::string_view literal = text_.substr(start, pos_ - start);
    JsonValue v;
    v.type_ = JsonValue::Type::kNumber;
    v.text_ = std::string(literal);
    // SimpleAtod is locale-independent; it saturates to +-inf on overflow.
    if (!absl::SimpleAtod(literal, &v.double_) || !std::isfinite(v.double_)) {
      pos_ = start;
      return Error("a number within double range");
    }
    if (integer && absl::SimpleAtoi(literal, &v.int_)) {
      v.is_integer_ = true;
      v.double_ = static_cast<double>(v.int_);
    }
    *out = std::move(v);
    return absl::OkStatus();
  }

  absl::string_view text_;
  int max_depth_;
  size_t pos_ = 0;
};

absl::StatusOr<JsonValue> JsonValue::Parse(absl::string_view text, int max_depth) {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at byte ", bad, ": not valid UTF-8"));
  }
  return JsonParser(text, max_depth).ParseDocument();
}

namespace {

const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}

// Shortest text that reads back to `d` (finite), always with a '.' or an
// exponent so that Python reads it back as a float; integral values as
// Python prints them (10000.0, not 1e+04).
std::string FormatDouble(double d) {
  if (d == std::floor(d) && std::fabs(d) < 1e15) return absl::StrFormat("%.1f", d);
  std::string s;
  for (int precision = 1; precision <= 17; ++precision) {
    s = absl::StrFormat("%.*g", precision, d);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == d) break;
  }
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

void Newline(std::string* out, int indent, int depth) {
  if (indent < 0) return;
  out->push_back('\n');
  out->append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

JsonValue::JsonValue(int64_t i)
    : type_(Type::kNumber),
      is_integer_(true),
      int_(i),
      double_(static_cast<double>(i)),
      text_(absl::StrCat(i)) {}

JsonValue::JsonValue(uint64_t u)
    : type_(Type::kNumber),
      is_integer_(u <= static_cast<uint64_t>(INT64_MAX)),
      int_(is_integer_ ? static_cast<int64_t>(u) : 0),
      double_(static_cast<double>(u)),
      text_(absl::StrCat(u)) {}

JsonValue::JsonValue(double d) {
  if (!std::isfinite(d)) return;  // null
  type_ = Type::kNumber;
  double_ = d;
  text_ = FormatDouble(d);
}

const std::string& JsonValue::string_value() const {
  return type_ == Type::kString ? text_ : EmptyString();
}

const std::string& JsonValue::number_text() const {
  return type_ == Type::kNumber ? text_ : EmptyString();
}

bool JsonValue::AsInt64(int64_t* out) const {
  if (!is_integer()) return false;
  *out = int_;
  return true;
}

bool JsonValue::AsUint64(uint64_t* out) const {
  if (type_ != Type::kNumber || text_.find_first_of(".eE-") != std::string::npos) {
    return false;
  }
  return absl::SimpleAtoi(text_, out);
}

bool JsonValue::AsDouble(double* out) const {
  if (type_ != Type::kNumber) return false;
  *out = double_;
  return true;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const Member& m : object_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

void JsonValue::Set(absl::string_view key, JsonValue value) {
  if (type_ == Type::kNull) type_ = Type::kObject;
  for (Member& m : object_) {
    if (m.first == key) {
      m.second = std::move(value);
      return;
    }
  }
  object_.emplace_back(std::string(key), std::move(value));
}

void JsonValue::Append(JsonValue value) {
  if (type_ == Type::kNull) type_ = Type::kArray;
  array_.push_back(std::move(value));
}

bool operator==(const JsonValue& a, const JsonValue& b) {
  if (a.type_ != b.type_) return false;
  switch (a.type_) {
    case JsonValue::Type::kNull:
      return true;
    case JsonValue::Type::kBool:
      return a.bool_ == b.bool_;
    case JsonValue::Type::kNumber: {
      if (a.is_integer_ && b.is_integer_) return a.int_ == b.int_;
      uint64_t ua = 0, ub = 0;  // exact beyond int64 and 2^53
      if (a.AsUint64(&ua) && b.AsUint64(&ub)) return ua == ub;
      return a.double_ == b.double_;
    }
    case JsonValue::Type::kString:
      return a.text_ == b.text_;
    case JsonValue::Type::kArray:
      return a.array_ == b.array_;
    case JsonValue::Type::kObject:
      return a.object_ == b.object_;
  }
  return false;
}

std::string JsonQuote(absl::string_view s) {
  // The characters with a short escape, and their escape letters.
  constexpr absl::string_view kSpecial = "\"\\\b\f\n\r\t";
  constexpr absl::string_view kLetters = "\"\\bfnrt";
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (const size_t k = kSpecial.find(ch); k != absl::string_view::npos) {
      out.push_back('\\');
      out.push_back(kLetters[k]);
    } else if (c < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(ch);
    }
  }
  out.push_back('"');
  return out;
}

void JsonValue::SerializeTo(std::string* out, int indent, bool sort_keys,
                            int depth) const {
  switch (type_) {
    case Type::kNull:
      out->append("null");
      return;
    case Type::kBool:
      out->append(bool_ ? "true" : "false");
      return;
    case Type::kNumber:
      out->append(text_);
      return;
    case Type::kString:
      out->append(JsonQuote(text_));
      return;
    case Type::kArray:
      out->push_back('[');
      for (size_t i = 0; i < array_.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(out, indent, depth + 1);
        array_[i].SerializeTo(out, indent, sort_keys, depth + 1);
      }
      if (!array_.empty()) Newline(out, indent, depth);
      out->push_back(']');
      return;
    case Type::kObject: {
      std::vector<const Member*> members;
      members.reserve(object_.size());
      for (const Member& m : object_) members.push_back(&m);
      if (sort_keys) {
        // std::string compares bytes as unsigned char: UTF-8 code point order.
        std::sort(members.begin(), members.end(),
                  [](const Member* a, const Member* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(out, indent, depth + 1);
        out->append(JsonQuote(members[i]->first));
        out->append(indent < 0 ? ":" : ": ");
        members[i]->second.SerializeTo(out, indent, sort_keys, depth + 1);
      }
      if (!members.empty()) Newline(out, indent, depth);
      out->push_back('}');
      return;
    }
  }
}

std::string JsonValue::Serialize(int indent, bool sort_keys) const {
  std::string out;
  SerializeTo(&out, indent, sort_keys, 0);
  return out;
}

}  // namespace memprofd
