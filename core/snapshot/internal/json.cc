#include "core/snapshot/internal/json.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace memprofd {
namespace snapshot_internal {
namespace {

constexpr int kMaxDepth = 128;

class Parser {
 public:
  explicit Parser(absl::string_view text) : s_(text) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    SkipWhitespace();
    JsonValue value;
    if (!ParseValue(0, &value)) return Error();
    SkipWhitespace();
    if (pos_ != s_.size()) {
      Fail("trailing characters after the JSON value");
      return Error();
    }
    return value;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at byte ", error_pos_, ": ", error_));
  }
  bool Fail(std::string message) {
    if (error_.empty()) {
      error_ = std::move(message);
      error_pos_ = pos_;
    }
    return false;
  }
  void SkipWhitespace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  bool Consume(absl::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool ParseValue(int depth, JsonValue* out) {
    if (depth > kMaxDepth) return Fail("nesting deeper than 128");
    if (pos_ >= s_.size()) return Fail("unexpected end of input");
    const char c = s_[pos_];
    if (c == '{') return ParseObject(depth, out);
    if (c == '[') return ParseArray(depth, out);
    if (c == '"') {
      std::string str;
      if (!ParseString(&str)) return false;
      *out = JsonValue::String(std::move(str));
      return true;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return ParseNumber(out);
    if (Consume("true")) {
      *out = JsonValue::Bool(true);
      return true;
    }
    if (Consume("false")) {
      *out = JsonValue::Bool(false);
      return true;
    }
    if (Consume("null")) {
      *out = JsonValue();
      return true;
    }
    return Fail(absl::StrFormat("unexpected character 0x%02x", static_cast<uint8_t>(c)));
  }

  bool ParseObject(int depth, JsonValue* out) {
    ++pos_;  // '{'
    *out = JsonValue::MakeObject();
    std::set<std::string> seen;
    SkipWhitespace();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWhitespace();
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a string key");
      const size_t key_pos = pos_;
      std::string key;
      if (!ParseString(&key)) return false;
      if (!seen.insert(key).second) {
        pos_ = key_pos;
        return Fail(absl::StrCat("duplicate key ", JsonQuote(key)));
      }
      SkipWhitespace();
      if (pos_ >= s_.size() || s_[pos_] != ':') return Fail("expected ':'");
      ++pos_;
      SkipWhitespace();
      JsonValue member;
      if (!ParseValue(depth + 1, &member)) return false;
      out->Set(key, std::move(member));
      SkipWhitespace();
      if (pos_ >= s_.size()) return Fail("unterminated object");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == '}') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  bool ParseArray(int depth, JsonValue* out) {
    ++pos_;  // '['
    *out = JsonValue::MakeArray();
    SkipWhitespace();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      SkipWhitespace();
      JsonValue element;
      if (!ParseValue(depth + 1, &element)) return false;
      out->Append(std::move(element));
      SkipWhitespace();
      if (pos_ >= s_.size()) return Fail("unterminated array");
      if (s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  bool ParseHex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return Fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Fail("bad hex digit in \\u escape");
      }
    }
    pos_ += 4;
    *out = v;
    return true;
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

  bool ParseString(std::string* out) {
    ++pos_;  // '"'
    while (true) {
      if (pos_ >= s_.size()) return Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("control character in string");
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        ++pos_;
        continue;
      }
      ++pos_;
      if (pos_ >= s_.size()) return Fail("unterminated escape");
      const char e = s_[pos_++];
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
          uint32_t cp;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return Fail("lone low surrogate");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (!Consume("\\u") || !ParseHex4(&low) || low < 0xDC00 || low > 0xDFFF) {
              return Fail("lone high surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Fail("invalid escape");
      }
    }
  }

  bool ParseNumber(JsonValue* out) {
    const size_t start = pos_;
    auto digit = [&] { return pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9'; };
    if (s_[pos_] == '-') ++pos_;
    if (!digit()) return Fail("expected a digit");
    if (s_[pos_] == '0') {
      ++pos_;
      if (digit()) return Fail("leading zero in number");
    } else {
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (!digit()) return Fail("expected a digit after '.'");
      while (digit()) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (!digit()) return Fail("expected a digit in exponent");
      while (digit()) ++pos_;
    }
    *out = JsonValue::NumberText(std::string(s_.substr(start, pos_ - start)));
    return true;
  }

  absl::string_view s_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
};

void Serialize(const JsonValue& v, int indent, bool sort_keys, int level,
               std::string* out) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * lvl, ' ');
  };
  switch (v.type()) {
    case JsonValue::Type::kNull:
      out->append("null");
      return;
    case JsonValue::Type::kBool:
      out->append(v.bool_value() ? "true" : "false");
      return;
    case JsonValue::Type::kNumber:
      out->append(v.text());
      return;
    case JsonValue::Type::kString:
      out->append(JsonQuote(v.text()));
      return;
    case JsonValue::Type::kArray: {
      if (v.array().empty()) {
        out->append("[]");
        return;
      }
      out->push_back('[');
      for (size_t i = 0; i < v.array().size(); ++i) {
        if (i > 0) out->push_back(',');
        newline(level + 1);
        Serialize(v.array()[i], indent, sort_keys, level + 1, out);
      }
      newline(level);
      out->push_back(']');
      return;
    }
    case JsonValue::Type::kObject: {
      if (v.object().empty()) {
        out->append("{}");
        return;
      }
      std::vector<const std::pair<std::string, JsonValue>*> members;
      for (const auto& m : v.object()) members.push_back(&m);
      if (sort_keys) {
        std::sort(members.begin(), members.end(),
                  [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out->push_back('{');
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) out->push_back(',');
        newline(level + 1);
        out->append(JsonQuote(members[i]->first));
        out->append(indent < 0 ? ":" : ": ");
        Serialize(members[i]->second, indent, sort_keys, level + 1, out);
      }
      newline(level);
      out->push_back('}');
      return;
    }
  }
}

}  // namespace

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}
JsonValue JsonValue::Int(int64_t i) { return NumberText(absl::StrCat(i)); }
JsonValue JsonValue::Double(double d) {
  if (!std::isfinite(d)) return JsonValue();
  std::string text = absl::StrFormat("%.17g", d);
  // "%.17g" of an integral double has no '.', which would read back as an
  // integer; that is still a valid JSON number.
  return NumberText(std::move(text));
}
JsonValue JsonValue::NumberText(std::string text) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.text_ = std::move(text);
  return v;
}
JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.text_ = std::move(s);
  return v;
}
JsonValue JsonValue::MakeArray() {
  JsonValue v;
  v.type_ = Type::kArray;
  return v;
}
JsonValue JsonValue::MakeObject() {
  JsonValue v;
  v.type_ = Type::kObject;
  return v;
}

bool JsonValue::AsInt64(int64_t* out) const {
  if (type_ != Type::kNumber || text_.find_first_of(".eE") != std::string::npos) {
    return false;
  }
  return absl::SimpleAtoi(text_, out);
}
bool JsonValue::AsUint64(uint64_t* out) const {
  if (type_ != Type::kNumber || text_.find_first_of(".eE-") != std::string::npos) {
    return false;
  }
  return absl::SimpleAtoi(text_, out);
}
bool JsonValue::AsDouble(double* out) const {
  return type_ == Type::kNumber && absl::SimpleAtod(text_, out);
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  for (const auto& m : object_) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

void JsonValue::Set(absl::string_view key, JsonValue value) {
  for (auto& m : object_) {
    if (m.first == key) {
      m.second = std::move(value);
      return;
    }
  }
  object_.emplace_back(std::string(key), std::move(value));
}

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  size_t bad = 0;
  if (!IsValidUtf8(text, &bad)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid JSON: not valid UTF-8 at byte ", bad));
  }
  return Parser(text).ParseDocument();
}

std::string SerializeJson(const JsonValue& value, int indent, bool sort_keys) {
  std::string out;
  Serialize(value, indent, sort_keys, 0, &out);
  return out;
}

std::string JsonQuote(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      case '\b':
        out.append("\\b");
        break;
      case '\f':
        out.append("\\f");
        break;
      default:
        if (c < 0x20) {
          out.append(absl::StrFormat("\\u%04x", c));
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace snapshot_internal
}  // namespace memprofd
