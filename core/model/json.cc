#include "core/model/json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memprofd {

// Recursive-descent parser over one document. Not thread-safe (one per
// Parse call).
class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue value;
    absl::Status s = ParseValue(&value, 0);
    if (!s.ok()) return s;
    SkipWhitespace();
    if (pos_ != text_.size()) return Error("end of input after the value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 256;

  absl::Status Error(absl::string_view expected) const {
    std::string found = pos_ < text_.size() ? absl::StrFormat("'%c'", text_[pos_])
                                            : std::string("end of input");
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
    if (depth > kMaxDepth) return Error("nesting no deeper than 256");
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
      char e = text_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          absl::Status s = ParseHex4(&cp);
          if (!s.ok()) return s;
          if (cp >= 0xDC00 && cp <= 0xDFFF)
            return Error("a high surrogate before a low one");
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
          break;
        }
        default:
          --pos_;
          return Error("a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
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
    int64_t i = 0;
    if (integer && absl::SimpleAtoi(literal, &i)) {
      *out = JsonValue(i);
      return absl::OkStatus();
    }
    double d = 0;
    // SimpleAtod is locale-independent; it saturates to +-inf on overflow.
    if (!absl::SimpleAtod(literal, &d) || !std::isfinite(d)) {
      pos_ = start;
      return Error("a number within double range");
    }
    *out = JsonValue(d);
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

absl::StatusOr<JsonValue> JsonValue::Parse(absl::string_view text) {
  return JsonParser(text).ParseDocument();
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
    case JsonValue::Type::kNumber:
      if (a.is_integer_ && b.is_integer_) return a.int_ == b.int_;
      return a.double_ == b.double_;
    case JsonValue::Type::kString:
      return a.string_ == b.string_;
    case JsonValue::Type::kArray:
      return a.array_ == b.array_;
    case JsonValue::Type::kObject:
      return a.object_ == b.object_;
  }
  return false;
}

std::string JsonQuote(absl::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

namespace {

std::string FormatDouble(double d) {
  if (!std::isfinite(d)) return "null";
  // Integral values as Python prints them (10000.0, not 1e+04).
  if (d == std::floor(d) && std::fabs(d) < 1e15) return absl::StrFormat("%.1f", d);
  // Shortest %.Ng that reads back exactly; keep a '.' or exponent so that
  // the value reads back as a float in Python too.
  std::string s;
  for (int precision = 1; precision <= 17; ++precision) {
    s = absl::StrFormat("%.*g", precision, d);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == d) break;
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

void Newline(std::string* out, int indent, int depth) {
  if (indent < 0) return;
  out->push_back('\n');
  out->append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

void JsonValue::SerializeTo(std::string* out, int indent, int depth) const {
  switch (type_) {
    case Type::kNull:
      out->append("null");
      return;
    case Type::kBool:
      out->append(bool_ ? "true" : "false");
      return;
    case Type::kNumber:
      out->append(is_integer_ ? absl::StrCat(int_) : FormatDouble(double_));
      return;
    case Type::kString:
      out->append(JsonQuote(string_));
      return;
    case Type::kArray:
      out->push_back('[');
      for (size_t i = 0; i < array_.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(out, indent, depth + 1);
        array_[i].SerializeTo(out, indent, depth + 1);
      }
      if (!array_.empty()) Newline(out, indent, depth);
      out->push_back(']');
      return;
    case Type::kObject:
      out->push_back('{');
      for (size_t i = 0; i < object_.size(); ++i) {
        if (i > 0) out->push_back(',');
        Newline(out, indent, depth + 1);
        out->append(JsonQuote(object_[i].first));
        out->append(indent < 0 ? ":" : ": ");
        object_[i].second.SerializeTo(out, indent, depth + 1);
      }
      if (!object_.empty()) Newline(out, indent, depth);
      out->push_back('}');
      return;
  }
}

std::string JsonValue::Serialize(int indent) const {
  std::string out;
  SerializeTo(&out, indent, 0);
  return out;
}

}  // namespace memprofd
