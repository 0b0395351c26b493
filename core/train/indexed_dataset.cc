#include "core/train/indexed_dataset.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace memprofd {
namespace {

constexpr char kMagic[] = "MMIDIDX\0\0";
constexpr int64_t kMagicBytes = 9;
constexpr int64_t kVersionOffset = 9;
constexpr int64_t kDtypeOffset = 17;
constexpr int64_t kSequenceCountOffset = 18;
constexpr int64_t kDocumentCountOffset = 26;
constexpr int64_t kArraysOffset = 34;
// Cancellation is polled every this many entries.
constexpr int64_t kPollEntries = int64_t{1} << 20;

// Little-endian integers at `p`: the format is little-endian whatever the
// host (megatron writes with struct "<Q" and numpy's native order on x86).
uint64_t U64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
int64_t I64(const unsigned char* p) { return static_cast<int64_t>(U64(p)); }
int32_t I32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) |
                              (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24));
}

absl::Status Loss(absl::string_view file, int64_t offset, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(file, " is corrupt at byte ", offset, ": ",
                                          what,
                                          "; rebuild the pair with megatron-core's "
                                          "IndexedDatasetBuilder (docs/training.md)"));
}

absl::Status Truncated(absl::string_view file, int64_t size, int64_t needed,
                       absl::string_view what) {
  return Loss(
      file, size,
      absl::StrCat("the file ends there but ", what, " needs ", needed, " bytes"));
}

}  // namespace

absl::StatusOr<MegatronIndex> ParseMegatronIndex(absl::string_view idx,
                                                 absl::string_view idx_name,
                                                 int64_t bin_bytes,
                                                 absl::string_view bin_name,
                                                 const std::function<bool()>& cancelled) {
  const auto* p = reinterpret_cast<const unsigned char*>(idx.data());
  const int64_t size = static_cast<int64_t>(idx.size());
  if (size < kArraysOffset) {
    return Truncated(idx_name, size, kArraysOffset, "the MMIDIDX header");
  }
  if (std::memcmp(p, kMagic, kMagicBytes) != 0) {
    return Loss(idx_name, 0, "the magic is not MMIDIDX\\0\\0 (not a Megatron .idx)");
  }
  if (const uint64_t version = U64(p + kVersionOffset); version != 1) {
    return Loss(idx_name, kVersionOffset,
                absl::StrCat("index version ", version, ", only version 1 exists"));
  }
  MegatronIndex out;
  switch (p[kDtypeOffset]) {
    case 1:  // uint8
      out.width = 1;
      break;
    case 4:  // int32
      out.width = 4;
      out.is_signed = true;
      break;
    case 8:  // uint16
      out.width = 2;
      break;
    case 2:
    case 3:
    case 5:
    case 6:
    case 7:
      return absl::InvalidArgumentError(absl::StrCat(
          idx_name, " says its ids are dtype code ", p[kDtypeOffset],
          " (int8, int16, int64 or a float), which memprofd does not read as token ids; "
          "write token ids as uint16 or int32 (megatron's choice by vocabulary size)"));
    default:
      return Loss(
          idx_name, kDtypeOffset,
          absl::StrCat("unknown dtype code ", p[kDtypeOffset], " (1 to 8 exist)"));
  }
  const uint64_t sequences = U64(p + kSequenceCountOffset);
  const uint64_t documents = U64(p + kDocumentCountOffset);
  // 12 bytes per sequence and 8 per document must fit what follows the header.
  const uint64_t room = static_cast<uint64_t>(size - kArraysOffset);
  if (sequences > room / 12) {
    return Loss(idx_name, kSequenceCountOffset,
                absl::StrCat("a sequence count of ", sequences, " overruns the ", size,
                             "-byte index"));
  }
  if (documents > (room - sequences * 12) / 8) {
    return Loss(idx_name, kDocumentCountOffset,
                absl::StrCat("a document count of ", documents, " overruns the ", size,
                             "-byte index"));
  }
  const int64_t s = static_cast<int64_t>(sequences);
  const int64_t d = static_cast<int64_t>(documents);
  const int64_t lengths_at = kArraysOffset;
  const int64_t pointers_at = lengths_at + 4 * s;
  const int64_t documents_at = pointers_at + 8 * s;
  const int64_t end = documents_at + 8 * d;
  if (end != size) {
    return Loss(idx_name, end,
                absl::StrCat(size - end, " bytes follow the document indices"));
  }
  if (d < 1) {
    return Loss(idx_name, kDocumentCountOffset,
                "a document count of 0: the document indices hold at least the first 0");
  }
  out.sequences = s;
  // The sequences tile the .bin: pointer i is the bytes of those before it.
  int64_t next = 0;
  for (int64_t i = 0; i < s; ++i) {
    if (i % kPollEntries == 0 && cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while checking ", idx_name));
    }
    const int32_t length = I32(p + lengths_at + 4 * i);
    if (length < 0) {
      return Loss(idx_name, lengths_at + 4 * i,
                  absl::StrCat("sequence ", i, " has length ", length));
    }
    const int64_t pointer = I64(p + pointers_at + 8 * i);
    if (pointer != next) {
      return Loss(idx_name, pointers_at + 8 * i,
                  absl::StrCat("sequence ", i, " points at .bin byte ", pointer,
                               " but the lengths before it end at byte ", next));
    }
    next += int64_t{length} * out.width;
    if (next > bin_bytes) {
      return Loss(bin_name, bin_bytes,
                  absl::StrCat("the file ends there but sequence ", i,
                               " of the index ends at byte ", next));
    }
  }
  if (next != bin_bytes) {
    return Loss(bin_name, next,
                absl::StrCat("the index's sequences end there but the file has ",
                             bin_bytes - next, " more bytes"));
  }
  out.tokens = next / out.width;
  int64_t previous = 0;
  for (int64_t i = 0; i < d; ++i) {
    if (i % kPollEntries == 0 && cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while checking ", idx_name));
    }
    const int64_t at = documents_at + 8 * i;
    const int64_t first = I64(p + at);
    if (i == 0 && first != 0) {
      return Loss(idx_name, at,
                  absl::StrCat("the document indices start at ", first, ", not 0"));
    }
    if (first < previous || first > s) {
      return Loss(
          idx_name, at,
          absl::StrCat("document index ", i, " is sequence ", first, ", outside [",
                       previous, ", ", s,
                       "]: the indices must not decrease or pass the sequence count"));
    }
    previous = first;
    const int64_t bound =
        first == s ? out.tokens : I64(p + pointers_at + 8 * first) / out.width;
    // An empty document (no sequence, or empty ones) holds no window: only a
    // bound past the last is kept, so the heap this costs is bounded by the
    // .bin's tokens, not by a document count a sparse index can make
    // billions of.
    if (out.doc_bounds.empty() || bound > out.doc_bounds.back()) {
      out.doc_bounds.push_back(bound);
    }
  }
  if (previous != s) {
    return Loss(idx_name, end - 8,
                absl::StrCat("the document indices end at sequence ", previous,
                             ", not at the sequence count ", s));
  }
  return out;
}

}  // namespace memprofd
