#include "core/common/utf8.h"

#include <cstdint>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace memprofd {

bool IsValidUtf8(absl::string_view s, size_t* bad_offset) {
  size_t i = 0;
  const size_t n = s.size();
  auto fail = [&] {
    if (bad_offset != nullptr) *bad_offset = i;
    return false;
  };
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return fail();
    }
    if (i + len > n) return fail();
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return fail();
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF)) {
      return fail();
    }
    i += len;
  }
  return true;
}

std::string ToValidUtf8(absl::string_view s) {
  std::string out;
  size_t bad = 0;
  while (!IsValidUtf8(s, &bad)) {
    out.append(s.data(), bad);
    out.append("\xEF\xBF\xBD");
    s.remove_prefix(bad + 1);
  }
  out.append(s.data(), s.size());
  return out;
}

std::string Echo(absl::string_view value, size_t max_bytes) {
  std::string escaped = absl::CEscape(value);
  if (escaped.size() <= max_bytes) return absl::StrCat("\"", escaped, "\"");
  // Never cut inside an escape sequence ("\\x7f", "\\n"): back up to
  // before the backslash that starts it.
  size_t cut = max_bytes;
  const size_t floor = cut >= 4 ? cut - 4 : 0;
  for (size_t i = cut; i-- > floor;) {
    if (escaped[i] == '\\') {
      size_t run = 0;  // backslashes ending at i
      while (run <= i && escaped[i - run] == '\\') ++run;
      if (run % 2 == 1) cut = i;
      break;
    }
  }
  return absl::StrCat("\"", absl::string_view(escaped).substr(0, cut), "\"... (",
                      value.size(), " bytes)");
}

std::string CapMessage(absl::string_view message, size_t max_bytes) {
  if (message.size() <= max_bytes) return std::string(message);
  size_t cut = max_bytes;
  // Back up over continuation bytes (10xxxxxx) to the start of a character.
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), "... [message cut: ", message.size(),
                      " bytes in all]");
}

}  // namespace memprofd
