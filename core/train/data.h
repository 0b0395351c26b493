#ifndef MEMPROFD_CORE_TRAIN_DATA_H_
#define MEMPROFD_CORE_TRAIN_DATA_H_

// Training tokens and the random windows drawn from them.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "core/common/files.h"
#include "core/train/train_options.h"

namespace memprofd {

// The English prose compiled into the binary (DataSpec::kEmbeddedCorpus).
absl::string_view EmbeddedCorpus();

// The bytes a TokenDataset of `spec` holds in the CPU's allocator for as long
// as it lives: its tokens as int32 for the sources kept in memory (the
// embedded corpus, inline tokens); 0 for files, which are mapped. What a
// memory plan adds for the data (plan::PlanSpec::data_bytes).
int64_t InMemoryTokenBytes(const DataSpec& spec);

// One batch of next-token prediction: targets[b, t] == the token after
// inputs[b, t]. Both int64 [batch, seq_len] on the CPU.
struct TokenBatch {
  at::Tensor inputs;
  at::Tensor targets;
};

// Where a dataset may read files and how it stops early. The defaults are
// for trusted callers (tests, the operator's own flags): any path, no limit
// but the file's, never cancelled.
struct DataAccess {
  // Client-named paths must resolve inside these (PathRoots::Confine);
  // nullptr: not confined.
  const PathRoots* roots = nullptr;
  int64_t max_file_bytes = std::numeric_limits<int64_t>::max();
  // Polled while a large file is checked; true stops with CANCELLED.
  std::function<bool()> cancelled;
};

// A sequence of token ids, all below the vocabulary size: held in memory
// (the embedded corpus, inline tokens: int32 on the CPU) or read from the
// file in windows with pread (text and token files), so that a large file
// costs page cache the kernel can reclaim rather than the daemon's own
// memory (its pages are dropped behind the one scan that checks the ids),
// and a file truncated or rewritten under a run fails it with DATA_LOSS
// rather than killing the process (a mapped page past a truncation raises
// SIGBUS). A Megatron indexed dataset is its .bin read so (the documents
// concatenated, in order), its .idx read and checked as it is parsed at
// Create (never mapped either) and its document boundaries kept. Immutable
// after Create but for a table of within-document window starts built by
// the first NextBatch of a seq_len (under a mutex); NextBatch may be called
// from one thread at a time (the generator is the caller's).
class TokenDataset {
 public:
  // Loads and checks the tokens of `spec` (see DataSpec) under `access`.
  // INVALID_ARGUMENT for a missing file, one that is not a regular file
  // (a FIFO, a device, a directory, a /proc file), one over the size limit,
  // an empty source, a token file whose size is not a multiple of
  // bytes_per_token, bytes_per_token other than 2 or 4, or a token id
  // outside [0, vocab_size) (naming its position and value; NOT_FOUND is not
  // used: the path is part of the request); PERMISSION_DENIED for a path
  // outside access.roots or one the daemon may not read; CANCELLED when
  // access.cancelled said so. An indexed dataset (PREFIX.bin and
  // PREFIX.idx, each refused as a file above) adds DATA_LOSS naming the
  // file and byte offset for a corrupt or inconsistent pair and
  // INVALID_ARGUMENT for ids that are not token ids (ParseMegatronIndex).
  // Messages never quote the file's contents.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Create(
      const DataSpec& spec, int64_t vocab_size, const DataAccess& access = {});
  ~TokenDataset();

  // OK when windows of seq_len + 1 tokens fit in the data (within one
  // document for DataSpec::Windows::kWithinDocuments); INVALID_ARGUMENT with
  // the token count (or the longest document's) otherwise.
  absl::Status Validate(int64_t seq_len) const;

  // `batch` windows of seq_len + 1 contiguous tokens, starting at positions
  // drawn uniformly by `generator` (a CPU generator), one draw of `batch`
  // integers per call: among every start for packed data, among the starts
  // whose window stays inside its document for within-document windows.
  // Validate(seq_len)'s
  // error when the data is too short; RESOURCE_EXHAUSTED when the batch
  // cannot be allocated.
  absl::StatusOr<TokenBatch> NextBatch(int64_t batch, int64_t seq_len,
                                       at::Generator& generator) const;

  // Tokens [start, start + count) as int64 [count] on the CPU, across
  // documents for an indexed dataset (evaluation reads its windows so).
  // Requires 0 <= start and start + count <= size(). RESOURCE_EXHAUSTED when
  // it cannot be allocated; DATA_LOSS naming the file when a file changed
  // since it was checked (shorter, or an id outside the vocabulary now).
  absl::StatusOr<at::Tensor> Window(int64_t start, int64_t count) const;

  int64_t size() const { return size_; }

  // An indexed dataset's document d is tokens [bounds[d], bounds[d + 1]);
  // empty for the other sources.
  const std::vector<int64_t>& document_bounds() const { return doc_bounds_; }

 private:
  // The within-document starts for one seq_len: window k of the
  // `cumulative.back()` is in eligible document j with
  // cumulative[j] <= k < cumulative[j + 1], at first_token[j] + k - cumulative[j].
  struct WithinDocumentStarts {
    int64_t seq_len = -1;
    std::vector<int64_t> cumulative;   // [eligible + 1]
    std::vector<int64_t> first_token;  // [eligible]
  };

  TokenDataset() = default;
  static absl::StatusOr<std::unique_ptr<TokenDataset>> CreateIndexed(
      const DataSpec& spec, int64_t vocab_size, const DataAccess& access);
  // File tokens [start, start + count) into out[0, count), each checked
  // against the vocabulary again: DATA_LOSS naming the file when it changed
  // since it was checked.
  absl::Status ReadTokens(int64_t start, int64_t count, int64_t* out) const;
  // The longest document's tokens (an indexed dataset).
  int64_t LongestDocument() const;

  at::Tensor tokens_;                   // int32 [N], when held in memory
  std::unique_ptr<ReadOnlyFile> file_;  // otherwise, read from this
  int width_ = 0;                       // bytes per token in file_: 1, 2 or 4
  int64_t vocab_size_ = 0;              // what file_'s ids were checked against
  bool is_signed_ = false;              // 4-byte ids are int32 (Megatron's)
  int64_t size_ = 0;
  std::vector<int64_t> doc_bounds_;  // an indexed dataset's documents
  DataSpec::Windows windows_ = DataSpec::Windows::kPacked;
  mutable absl::Mutex starts_mu_;
  mutable WithinDocumentStarts starts_ ABSL_GUARDED_BY(starts_mu_);
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_DATA_H_
