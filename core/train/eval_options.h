#ifndef MEMPROFD_CORE_TRAIN_EVAL_OPTIONS_H_
#define MEMPROFD_CORE_TRAIN_EVAL_OPTIONS_H_

// What an evaluation asks for and what it reports, and the numeric precision
// of forward passes. Plain structs, free of LibTorch, so that the server can
// fill and read them.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/config.h"
#include "core/train/request_fields.h"

namespace memprofd {

// Where tokens come from (training windows, evaluation windows).
struct DataSpec {
  enum class Kind {
    // English prose compiled into the binary, read as bytes (ids 0..255).
    kEmbeddedCorpus = 0,
    // Any file read as bytes: byte-level tokens, ids 0..255.
    kTextFile = 1,
    // A flat file of little-endian token ids, bytes_per_token (2 or 4) each:
    // nanoGPT's uint16 .bin convention, or uint32.
    kTokenFile = 2,
    // The ids in `tokens`.
    kInlineTokens = 3,
    // A Megatron indexed dataset: `path` is the prefix of PREFIX.bin (the
    // token ids) and PREFIX.idx (megatron-core's MMIDIDX index of sequences
    // and documents; core/train/indexed_dataset.h).
    kIndexedDataset = 4,
  };
  // How training windows are drawn from an indexed dataset.
  enum class Windows {
    // Across documents, as Megatron's GPTDataset packs them: the documents
    // concatenated and windows drawn from the whole stream (the default).
    kPacked = 0,
    // Inside one document: a window never crosses a document boundary, and
    // documents shorter than seq_len + 1 tokens are never drawn.
    kWithinDocuments = 1,
  };
  Kind kind = Kind::kEmbeddedCorpus;
  std::string path;             // kTextFile, kTokenFile, kIndexedDataset (the prefix)
  int bytes_per_token = 2;      // kTokenFile
  std::vector<int64_t> tokens;  // kInlineTokens
  Windows windows = Windows::kPacked;  // kIndexedDataset
};

// "packed", "within_documents".
absl::string_view DataWindowsName(DataSpec::Windows windows);
// INVALID_ARGUMENT naming the valid values for anything else.
absl::StatusOr<DataSpec::Windows> ParseDataWindows(absl::string_view name);

// OK, or INVALID_ARGUMENT (prefixed with `field`): bytes_per_token other than
// 2 or 4 for a token file, no path for a file kind, an unknown kind.
absl::Status ValidateDataSpec(absl::string_view field, const DataSpec& spec);

// How forward passes compute: transformers' / accelerate's mixed_precision.
enum class MixedPrecision {
  // float32 everywhere.
  kNo = 0,
  // Autocast to bfloat16 (matmuls and linear layers in bf16, reductions and
  // norms in float32) on the model's device; the weights, the gradients and
  // the optimizer state stay float32.
  kBf16 = 1,
};
// "no", "bf16".
absl::string_view MixedPrecisionName(MixedPrecision precision);
// INVALID_ARGUMENT naming the valid values for anything else.
absl::StatusOr<MixedPrecision> ParseMixedPrecision(absl::string_view name);

// How the language-model head and the loss are computed (loss_chunk_tokens
// of EvalOptions and TrainOptions; core/train/chunked_loss.h): in chunks of
// tokens sized from the vocabulary and hidden size (automatic, the default),
// materializing the whole [tokens x vocab] logits (off), or in chunks of that
// many tokens (>= 1).
inline constexpr int64_t kLossChunkAutomatic = 0;
inline constexpr int64_t kLossChunkOff = -1;
inline constexpr int64_t kMaxLossChunkTokens = int64_t{1} << 30;

// OK, or INVALID_ARGUMENT for a loss_chunk_tokens below -1 or above
// kMaxLossChunkTokens, saying what the values mean.
absl::Status ValidateLossChunkTokens(int64_t loss_chunk_tokens);

// One evaluation, every field given: the loss over consecutive windows of
// seq_len + 1 tokens (window i starts at token i * seq_len), batch_size
// windows a batch, at most max_batches batches (0: every window; a last
// batch may be smaller).
struct EvalOptions {
  DataSpec data;
  int64_t batch_size = 8;
  int64_t seq_len = 128;
  int64_t max_batches = 0;
  AttentionImplementation attn_implementation = AttentionImplementation::kSdpa;
  MixedPrecision mixed_precision = MixedPrecision::kNo;
  // kLossChunkAutomatic, kLossChunkOff or tokens per chunk.
  int64_t loss_chunk_tokens = kLossChunkAutomatic;
};

// An evaluation as a client sends it: each field unset takes EvalOptions'
// default; MergeEvalSpec fills the gaps and validates the result. The
// fields are request_fields.h's Evaluate lists (a named choice as its name:
// "sdpa", "bf16"), and the data, which must be given.
struct EvalSpec {
  DataSpec data;
  MEMPROFD_EVAL_VALUE_FIELDS(MEMPROFD_OPTIONAL_VALUE_FIELD)
  MEMPROFD_EVAL_CHOICE_FIELDS(MEMPROFD_OPTIONAL_CHOICE_FIELD)
};

struct EvalResult {
  // Mean next-token cross-entropy over every target token evaluated.
  double loss = 0.0;
  double perplexity = 0.0;  // exp(loss)
  int64_t tokens = 0;       // target tokens evaluated
  int64_t batches = 0;
  double seconds = 0.0;
  // The model's trained steps when it was evaluated.
  int64_t global_step = 0;
  // Fully sharded: the most bytes of parameters gathered from the ranks held
  // at once (EvalUnits); 0 where the model is whole.
  int64_t peak_gathered_parameter_bytes = 0;
};

// OK, or INVALID_ARGUMENT naming the field: batch_size and seq_len >= 1,
// seq_len <= max_position_embeddings, max_batches >= 0, the data spec's.
absl::Status ValidateEvalOptions(const EvalOptions& options,
                                 int64_t max_position_embeddings);

// `request` over EvalOptions' defaults, validated.
absl::StatusOr<EvalOptions> MergeEvalSpec(const EvalSpec& request,
                                          int64_t max_position_embeddings);

}  // namespace memprofd

#endif  // MEMPROFD_CORE_TRAIN_EVAL_OPTIONS_H_
