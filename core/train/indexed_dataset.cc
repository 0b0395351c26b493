#include "core/train/indexed_dataset.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

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

// Reads an index front to back through a window of its own: each cursor
// walks one array in increasing offsets, so a window is read once, and the
// memory is the window's, whatever the index's size.
class Cursor {
 public:
  Cursor(const IndexReader& read, int64_t size) : read_(read), size_(size) {}

  // The `n` (at most 8) bytes at `offset`, inside the index.
  absl::StatusOr<const unsigned char*> At(int64_t offset, int64_t n) {
    if (offset < begin_ || offset + n > begin_ + length_) {
      begin_ = offset;
      length_ = std::min<int64_t>(kWindowBytes, size_ - offset);
      window_.resize(static_cast<size_t>(kWindowBytes));
      if (absl::Status s = read_(begin_, length_, window_.data()); !s.ok()) {
        length_ = 0;
        return s;
      }
    }
    return window_.data() + (offset - begin_);
  }

 private:
  static constexpr int64_t kWindowBytes = int64_t{1} << 20;
  const IndexReader& read_;
  const int64_t size_;
  std::vector<unsigned char> window_;
  int64_t begin_ = 0;
  int64_t length_ = 0;
};

}  // namespace

absl::StatusOr<MegatronIndex> ParseMegatronIndex(absl::string_view idx,
                                                 absl::string_view idx_name,
                                                 int64_t bin_bytes,
                                                 absl::string_view bin_name,
                                                 const std::function<bool()>& cancelled) {
  const IndexReader read = [idx](int64_t offset, int64_t length, void* out) {
    std::memcpy(out, idx.data() + offset, static_cast<size_t>(length));
    return absl::OkStatus();
  };
  return ParseMegatronIndex(read, static_cast<int64_t>(idx.size()), idx_name, bin_bytes,
                            bin_name, cancelled);
}

absl::StatusOr<MegatronIndex> ParseMegatronIndex(const IndexReader& read, int64_t size,
                                                 absl::string_view idx_name,
                                                 int64_t bin_bytes,
                                                 absl::string_view bin_name,
                                                 const std::function<bool()>& cancelled) {
  if (size < kArraysOffset) {
    return Truncated(idx_name, size, kArraysOffset, "the MMIDIDX header");
  }
  unsigned char header[kArraysOffset];
  RETURN_IF_ERROR(read(0, kArraysOffset, header));
  const unsigned char* p = header;
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
  Cursor lengths(read, size);
  Cursor pointers(read, size);
  // The sequences tile the .bin: pointer i is the bytes of those before it.
  int64_t next = 0;
  for (int64_t i = 0; i < s; ++i) {
    if (i % kPollEntries == 0 && cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while checking ", idx_name));
    }
    ASSIGN_OR_RETURN(const unsigned char* length_at, lengths.At(lengths_at + 4 * i, 4));
    const int32_t length = I32(length_at);
    if (length < 0) {
      return Loss(idx_name, lengths_at + 4 * i,
                  absl::StrCat("sequence ", i, " has length ", length));
    }
    ASSIGN_OR_RETURN(const unsigned char* pointer_at,
                     pointers.At(pointers_at + 8 * i, 8));
    const int64_t pointer = I64(pointer_at);
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
  Cursor document_indices(read, size);
  Cursor firsts(read, size);  // the pointers of documents' first sequences
  int64_t previous = 0;
  for (int64_t i = 0; i < d; ++i) {
    if (i % kPollEntries == 0 && cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while checking ", idx_name));
    }
    const int64_t at = documents_at + 8 * i;
    ASSIGN_OR_RETURN(const unsigned char* first_at, document_indices.At(at, 8));
    const int64_t first = I64(first_at);
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
    int64_t bound = out.tokens;
    if (first < s) {
      ASSIGN_OR_RETURN(const unsigned char* pointer_at,
                       firsts.At(pointers_at + 8 * first, 8));
      bound = I64(pointer_at) / out.width;
    }
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
