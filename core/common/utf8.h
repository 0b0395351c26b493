#ifndef MEMPROFD_CORE_COMMON_UTF8_H_
#define MEMPROFD_CORE_COMMON_UTF8_H_

// UTF-8 validation for names and headers that must be valid text before any
// parser sees them (snapshot names, safetensors headers), and the one way a
// client's value is quoted in a message (Echo). No LibTorch.

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace memprofd {

// True when `s` is valid UTF-8 (no overlong forms, no surrogates, nothing
// above U+10FFFF, no truncated sequence). On failure *bad_offset (if given)
// is the offset of the first bad sequence. Pure and thread-safe.
bool IsValidUtf8(absl::string_view s, size_t* bad_offset = nullptr);

// `s` with every byte that does not start a valid UTF-8 sequence replaced by
// U+FFFD (so the result is valid UTF-8 and keeps every valid character, in
// order); `s` itself when it is valid. Pure and thread-safe.
std::string ToValidUtf8(absl::string_view s);

// A client's value as an error message quotes it: in double quotes, C-escaped
// (control bytes, quotes and non-UTF-8 bytes visible), and cut to
// `max_bytes` of the escaped text with the value's full size noted, so that
// a message stays small whatever was sent (a status travels as gRPC
// metadata, which has a size limit). Pure and thread-safe.
inline constexpr size_t kMaxEchoBytes = 128;
std::string Echo(absl::string_view value, size_t max_bytes = kMaxEchoBytes);

// `message` cut to at most `max_bytes` of text at a UTF-8 character
// boundary, with what was cut noted ("... [message cut: 15728733 bytes in
// all]"), so that a message built around a huge value stays small wherever
// it is kept or sent; `message` itself when it fits. The result is at most
// max_bytes + 64 bytes. Pure and thread-safe.
std::string CapMessage(absl::string_view message, size_t max_bytes);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_COMMON_UTF8_H_
