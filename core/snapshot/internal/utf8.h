#ifndef MEMPROFD_CORE_SNAPSHOT_INTERNAL_UTF8_H_
#define MEMPROFD_CORE_SNAPSHOT_INTERNAL_UTF8_H_

// Strict UTF-8 validation for safetensors headers, JSON and snapshot names.
// Pure and thread-safe.

#include <cstddef>

#include "absl/strings/string_view.h"

namespace memprofd {
namespace snapshot_internal {

// True when `s` is valid UTF-8 (no overlong forms, no surrogates, <= U+10FFFF).
// On failure *bad_offset (if given) is the first bad byte.
bool IsValidUtf8(absl::string_view s, size_t* bad_offset = nullptr);

}  // namespace snapshot_internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_UTF8_H_
