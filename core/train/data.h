#ifndef MEMPROFD_CORE_TRAIN_DATA_H_
#define MEMPROFD_CORE_TRAIN_DATA_H_

// Training tokens and the random windows drawn from them.

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/train/train_options.h"

namespace memprofd {

// The English prose compiled into the binary (DataSpec::kEmbeddedCorpus).
absl::string_view EmbeddedCorpus();

// One batch of next-token prediction: targets[b, t] == the token after
// inputs[b, t]. Both int64 [batch, seq_len] on the CPU.
struct TokenBatch {
  at::Tensor inputs;
  at::Tensor targets;
};

// A sequence of token ids held in memory (int32 on the CPU), all below the
// vocabulary size. Immutable after Create; NextBatch may be called from one
// thread at a time (the generator is the caller's).
class TokenDataset {
 public:
  // Loads and checks the tokens of `spec` (see DataSpec). INVALID_ARGUMENT
  // for a missing or unreadable file (NOT_FOUND is not used: the path is
  // part of the request), an empty source, a token file whose size is not a
  // multiple of bytes_per_token, bytes_per_token other than 2 or 4, or a
  // token id outside [0, vocab_size) (naming its position and value).
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Create(const DataSpec& spec,
                                                              int64_t vocab_size);

  // OK when windows of seq_len + 1 tokens fit in the data; INVALID_ARGUMENT
  // with the token count otherwise.
  absl::Status Validate(int64_t seq_len) const;

  // `batch` windows of seq_len + 1 contiguous tokens, starting at positions
  // drawn uniformly by `generator` (a CPU generator). Validate(seq_len)'s
  // error when the data is too short; RESOURCE_EXHAUSTED when the batch
  // cannot be allocated.
  absl::StatusOr<TokenBatch> NextBatch(int64_t batch, int64_t seq_len,
                                       at::Generator& generator) const;

  int64_t size() const;
  const at::Tensor& tokens() const { return tokens_; }

 private:
  explicit TokenDataset(at::Tensor tokens) : tokens_(std::move(tokens)) {}

  at::Tensor tokens_;  // int32 [N]
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_DATA_H_
