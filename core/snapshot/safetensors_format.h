#ifndef MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_FORMAT_H_
#define MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_FORMAT_H_

// The safetensors file format without LibTorch: building a header in the
// reference writer's layout and validating one as strictly as the reference
// (Rust) reader. See REFERENCE.md §2.2.
//
// File: u64 little-endian N | N bytes of UTF-8 JSON starting with '{',
// padded with spaces to a multiple of 8 | data. The JSON maps each tensor name
// to exactly {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative
// to the data start) and may hold "__metadata__" (string -> string).
// All functions are pure and thread-safe.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {
namespace snapshot {

// The reference reader's cap on N (safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Bytes per element of a safetensors dtype string memprofd reads and writes
// (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL); 0 for any other string.
int64_t SafetensorsDtypeSize(absl::string_view dtype);

// True for the dtype strings safetensors defines that memprofd does not
// handle (F8_*, U16, U32, U64, C64, F4, F6_*): a Llama checkpoint's weights
// never need them.
bool IsUnsupportedSafetensorsDtype(absl::string_view dtype);

// One tensor of a file.
struct TensorEntry {
  std::string name;
  std::string dtype;           // "F32", "BF16", ...
  std::vector<int64_t> shape;  // [] for a scalar
  uint64_t begin = 0;          // data_offsets, relative to the data start
  uint64_t end = 0;

  uint64_t bytes() const { return end - begin; }
};

// What a tensor's entry will be, before offsets are assigned.
struct TensorSpec {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
};

// A file's layout as the reference writer makes it.
struct SafetensorsLayout {
  // The first 8 + N bytes of the file: the length and the padded JSON.
  std::string header_bytes;
  // In file order: dtype alignment descending, then name (byte order);
  // offsets back to back from 0.
  std::vector<TensorEntry> entries;
  uint64_t data_bytes = 0;

  uint64_t file_size() const { return header_bytes.size() + data_bytes; }
};

// Lays out `specs` with `metadata` as "__metadata__" (omitted when empty).
// INVALID_ARGUMENT for an empty, duplicate or not UTF-8 name, the name
// "__metadata__", metadata that is not UTF-8, an unknown dtype, a negative
// dimension, a size that overflows, or a header over
// kMaxSafetensorsHeaderBytes.
absl::StatusOr<SafetensorsLayout> LayoutSafetensors(
    std::vector<TensorSpec> specs, const std::map<std::string, std::string>& metadata);

// A validated header.
struct SafetensorsHeader {
  uint64_t header_size = 0;  // N
  uint64_t data_bytes = 0;   // end of the last tensor
  // Sorted by begin offset (file order).
  std::vector<TensorEntry> tensors;
  std::map<std::string, std::string> metadata;

  uint64_t data_start() const { return 8 + header_size; }
};

// Validates the whole file `file` (all of its bytes, typically a mapping).
// `path` only names the file in messages. DATA_LOSS ("corrupt safetensors
// file <path>: ...") for: fewer than 8 bytes; N over the cap; N past the end
// of the file; invalid UTF-8; JSON not starting with '{' or not parsing;
// an entry that is not exactly dtype/shape/data_offsets; an unknown dtype;
// non-string metadata; duplicate keys; offsets with a gap, an overlap, or a
// first offset other than 0; an entry whose byte size is not numel x element
// size; a file size other than 8 + N + end of the last tensor (truncated or
// trailing bytes). INVALID_ARGUMENT for a dtype that is valid safetensors but
// that memprofd does not handle.
absl::StatusOr<SafetensorsHeader> ParseSafetensors(absl::string_view file,
                                                   absl::string_view path);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_FORMAT_H_
