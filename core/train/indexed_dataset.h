#ifndef MEMPROFD_CORE_TRAIN_INDEXED_DATASET_H_
#define MEMPROFD_CORE_TRAIN_INDEXED_DATASET_H_

// The index of a Megatron indexed dataset (PREFIX.idx beside PREFIX.bin),
// in the MMIDIDX format megatron-core's IndexedDatasetBuilder writes
// (megatron/core/datasets/indexed_dataset.py, _IndexWriter and
// _IndexReader; read in megatron-core 0.16.1). All little-endian:
//
//   offset 0   9 bytes  "MMIDIDX\0\0"
//          9   uint64   version, 1
//         17   uint8    dtype code of the .bin's ids (DType: 1 uint8, 2 int8,
//                       3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
//                       8 uint16); megatron picks uint16 below a vocabulary
//                       of 65500 and int32 otherwise
//         18   uint64   S, the sequence count
//         26   uint64   D, the document count (documents + 1)
//         34   int32[S] sequence lengths, in ids
//              int64[S] sequence pointers, byte offsets into the .bin:
//                       0, then each the previous plus its length x itemsize
//              int64[D] document indices: sequence indices, 0 first,
//                       S last, document d is sequences [doc[d], doc[d+1])
//
// (A multimodal index adds int8[S] sequence modes; memprofd reads language
// model data only and refuses it as trailing bytes.) No LibTorch.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memprofd {

// What training needs of a checked index: how to decode the .bin and where
// its documents begin. Invariant: doc_bounds is strictly increasing from 0 to
// tokens, and tokens x width is the .bin's size.
struct MegatronIndex {
  int width = 0;           // bytes per id in the .bin: 1, 2 or 4
  bool is_signed = false;  // int32 ids (negative ones are out of vocabulary)
  int64_t tokens = 0;      // ids in the .bin
  int64_t sequences = 0;   // S
  // Token offset of each non-empty document's first id, then `tokens`
  // (strictly increasing: empty documents hold no window and are not kept,
  // so there are at most tokens + 1 entries whatever the index's document
  // count); document k is [doc_bounds[k], doc_bounds[k + 1]).
  std::vector<int64_t> doc_bounds;
};

// Checks `idx` (the whole .idx file, named `idx_name` in messages) against
// a .bin of `bin_bytes` bytes (named `bin_name`). DATA_LOSS naming the file
// and the byte offset for a truncated index, a bad magic or version, an
// unknown dtype code, counts that overrun the index, bytes after the
// document indices, a negative length, a pointer that disagrees with the
// lengths before it, sequences that overrun the .bin or leave bytes after
// them, document indices that do not start at 0, decrease, or do not end at
// S; INVALID_ARGUMENT for a known dtype that is not token ids (int8, int16,
// int64, floats); CANCELLED when `cancelled` says so (polled while the
// arrays are scanned). Thread-safe.
absl::StatusOr<MegatronIndex> ParseMegatronIndex(
    absl::string_view idx, absl::string_view idx_name, int64_t bin_bytes,
    absl::string_view bin_name, const std::function<bool()>& cancelled = {});

// Where an index's bytes come from when it is read as it is parsed: fills
// `out` with the `length` bytes at `offset` (inside the index), or fails,
// and that status is the parse's (a file read with pread says DATA_LOSS
// when it shrank meanwhile).
using IndexReader =
    std::function<absl::Status(int64_t offset, int64_t length, void* out)>;

// The same over an index of `size` bytes read through `read`, front to back
// through windows of 1 MiB: the memory is a few windows, and nothing is
// mapped, so a file truncated during the parse fails it (DATA_LOSS) rather
// than raising SIGBUS.
absl::StatusOr<MegatronIndex> ParseMegatronIndex(
    const IndexReader& read, int64_t size, absl::string_view idx_name, int64_t bin_bytes,
    absl::string_view bin_name, const std::function<bool()>& cancelled = {});

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_INDEXED_DATASET_H_
