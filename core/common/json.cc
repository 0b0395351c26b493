#include "core/common/json.h"

#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/utf8.h"

namespace memprofd {
namespace {

// A character iterator over the text that publishes how far nlohmann's lexer
// has read, so that the errors the builder finds (duplicate keys, depth),
// which nlohmann reports without a position, can name a byte.
class ReadTrackingIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  ReadTrackingIterator(const char* p, const char** read) : p_(p), read_(read) {}
  reference operator*() const { return *p_; }
  ReadTrackingIterator& operator++() {
    *read_ = ++p_;
    return *this;
  }
  bool operator==(const ReadTrackingIterator& o) const { return p_ == o.p_; }
  bool operator!=(const ReadTrackingIterator& o) const { return p_ != o.p_; }

 private:
  const char* p_;
  const char** read_;
};

// nlohmann's parse error text without its "[json.exception...] " and "parse
// error at line L, column C: " prefixes (the caller names the byte), and
// without the token it quotes when that is not valid UTF-8 (status messages
// travel in protobuf strings).
std::string ErrorText(const std::string& what, const std::string& last_token) {
  absl::string_view s = what;
  if (absl::StartsWith(s, "[json.exception.")) s.remove_prefix(s.find("] ") + 2);
  if (absl::StartsWith(s, "parse error")) s.remove_prefix(s.find(": ") + 2);
  std::string out(s);
  const std::string quoted = absl::StrCat("; last read: '", last_token, "'");
  if (const size_t at = out.find(quoted);
      at != std::string::npos && !IsValidUtf8(last_token)) {
    out.erase(at, quoted.size());
  }
  return out;
}

// Builds a Json from nlohmann's SAX events, refusing what nlohmann's own
// builder lets through: duplicate keys and nesting beyond a limit. The lexer
// and parser reject everything else. One per document; not thread-safe.
class StrictBuilder final : public nlohmann::json_sax<Json> {
 public:
  StrictBuilder(absl::string_view text, const char* const* read, int max_depth)
      : text_(text), read_(read), max_depth_(max_depth) {}

  bool null() override { return Add(nullptr) != nullptr; }
  bool boolean(bool b) override { return Add(b) != nullptr; }
  bool number_integer(number_integer_t i) override { return Add(i) != nullptr; }
  bool number_unsigned(number_unsigned_t u) override { return Add(u) != nullptr; }
  bool number_float(number_float_t d, const string_t&) override {
    return Add(d) != nullptr;
  }
  bool string(string_t& s) override { return Add(std::move(s)) != nullptr; }
  bool binary(binary_t& b) override { return Add(std::move(b)) != nullptr; }
  bool start_object(std::size_t) override { return Open(Json::object()); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(Json::array()); }
  bool end_array() override { return Close(); }

  bool key(string_t& k) override {
    auto [it, inserted] =
        open_.back()->get_ref<Json::object_t&>().emplace(std::move(k), nullptr);
    if (!inserted) {
      return Fail(KeyOffset(), absl::StrCat("duplicate key ", JsonQuote(it->first)));
    }
    member_ = &it->second;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::json::exception& ex) override {
    // `position` counts the bytes read, the one that failed (or the end of
    // the text) included.
    return Fail(position == 0 ? 0 : position - 1, ErrorText(ex.what(), last_token));
  }

  absl::StatusOr<Json> Result() && {
    if (!status_.ok()) return status_;
    return std::move(root_);
  }

 private:
  // Places `value` where the document is at: the root, the end of the open
  // array, or the member of the last key. Returns where it went.
  template <typename T>
  Json* Add(T&& value) {
    if (open_.empty()) {
      root_ = Json(std::forward<T>(value));
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      Json::array_t& items = parent.get_ref<Json::array_t&>();
      items.emplace_back(std::forward<T>(value));
      return &items.back();
    }
    *member_ = Json(std::forward<T>(value));
    return member_;
  }

  bool Open(Json container) {
    if (open_.size() >= static_cast<size_t>(max_depth_)) {
      return Fail(BytesRead() - 1,
                  absl::StrCat("nesting deeper than ", max_depth_, " levels"));
    }
    open_.push_back(Add(std::move(container)));
    return true;
  }

  bool Close() {
    open_.pop_back();
    return true;
  }

  bool Fail(size_t offset, absl::string_view what) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat("invalid JSON at byte ", offset, ": ", what));
    return false;
  }

  size_t BytesRead() const { return static_cast<size_t>(*read_ - text_.data()); }

  // The offset of the opening quote of the key just read: the lexer stops
  // on its closing quote, and inside a JSON string every '"' is escaped by
  // an odd run of backslashes.
  size_t KeyOffset() const {
    size_t i = BytesRead() - 1;
    while (i > 0) {
      --i;
      if (text_[i] != '"') continue;
      size_t backslashes = 0;
      while (backslashes < i && text_[i - 1 - backslashes] == '\\') ++backslashes;
      if (backslashes % 2 == 0) break;
    }
    return i;
  }

  const absl::string_view text_;
  const char* const* const read_;
  const int max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the arrays and objects being filled, innermost last
  Json* member_ = nullptr;   // the value of the last key read
  absl::Status status_;
};

}  // namespace

absl::StatusOr<Json> ParseJson(absl::string_view text, int max_depth) {
  // nlohmann skips a leading UTF-8 byte order mark; JSON (RFC 8259 section
  // 8.1), serde_json and Python's json.loads do not.
  if (absl::StartsWith(text, "\xEF\xBB\xBF")) {
    return absl::InvalidArgumentError(
        "invalid JSON at byte 0: a byte order mark is not allowed");
  }
  const char* read = text.data();
  StrictBuilder builder(text, &read, max_depth);
  Json::sax_parse(ReadTrackingIterator(text.data(), &read),
                  ReadTrackingIterator(text.data() + text.size(), &read), &builder,
                  nlohmann::json::input_format_t::json, /*strict=*/true,
                  /*ignore_comments=*/false);
  return std::move(builder).Result();
}

std::string DumpJson(const Json& value, int indent) {
  return value.dump(indent, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

std::string JsonQuote(absl::string_view s) { return DumpJson(Json(std::string(s))); }

const Json* JsonFind(const Json& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

bool JsonToInt64(const Json& value, int64_t* out) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (!value.is_number_integer()) return false;
  *out = value.get<int64_t>();
  return true;
}

}  // namespace memprofd
