#include "core/train/eval_options.h"

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/utf8.h"

namespace memprofd {

absl::Status ValidateDataSpec(absl::string_view field, const DataSpec& spec) {
  switch (spec.kind) {
    case DataSpec::Kind::kEmbeddedCorpus:
    case DataSpec::Kind::kInlineTokens:
      return absl::OkStatus();
    case DataSpec::Kind::kTokenFile:
      if (spec.bytes_per_token != 2 && spec.bytes_per_token != 4) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": bytes_per_token must be 2 (uint16) or 4 (uint32), got ",
            spec.bytes_per_token));
      }
      [[fallthrough]];
    case DataSpec::Kind::kIndexedDataset:
      if (spec.windows != DataSpec::Windows::kPacked &&
          spec.windows != DataSpec::Windows::kWithinDocuments) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": unknown indexed windows ", static_cast<int>(spec.windows),
            "; use packed or within_documents"));
      }
      [[fallthrough]];
    case DataSpec::Kind::kTextFile:
      if (spec.path.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": the data source is a file but no path was given"));
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown data kind ", static_cast<int>(spec.kind)));
}

absl::string_view DataWindowsName(DataSpec::Windows windows) {
  switch (windows) {
    case DataSpec::Windows::kPacked:
      return "packed";
    case DataSpec::Windows::kWithinDocuments:
      return "within_documents";
  }
  return "unknown";
}

absl::StatusOr<DataSpec::Windows> ParseDataWindows(absl::string_view name) {
  if (name == "packed") return DataSpec::Windows::kPacked;
  if (name == "within_documents") return DataSpec::Windows::kWithinDocuments;
  return absl::InvalidArgumentError(
      absl::StrCat("indexed windows: unknown value ", Echo(name),
                   "; use packed (across documents) or within_documents"));
}

absl::string_view MixedPrecisionName(MixedPrecision precision) {
  switch (precision) {
    case MixedPrecision::kNo:
      return "no";
    case MixedPrecision::kBf16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<MixedPrecision> ParseMixedPrecision(absl::string_view name) {
  for (MixedPrecision p : {MixedPrecision::kNo, MixedPrecision::kBf16}) {
    if (name == MixedPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "mixed_precision: unknown value ", Echo(name), "; use no (float32) or bf16"));
}

absl::Status ValidateLossChunkTokens(int64_t loss_chunk_tokens) {
  if (loss_chunk_tokens < kLossChunkOff || loss_chunk_tokens > kMaxLossChunkTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss_chunk_tokens must be -1 (off: materialize the logits), 0 (automatic, "
        "from the vocabulary and hidden size) or a number of tokens per chunk from 1 "
        "to ",
        kMaxLossChunkTokens, ", got ", loss_chunk_tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateEvalOptions(const EvalOptions& o, int64_t max_position_embeddings) {
  if (o.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be at least 1, got ", o.batch_size));
  }
  if (o.seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be at least 1, got ", o.seq_len));
  }
  if (o.seq_len > max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq_len ", o.seq_len, " exceeds the model's max_position_embeddings (",
        max_position_embeddings, "); use a seq_len of at most ",
        max_position_embeddings));
  }
  if (o.max_batches < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batches must be >= 0 (0: every window), got ", o.max_batches));
  }
  RETURN_IF_ERROR(ValidateLossChunkTokens(o.loss_chunk_tokens));
  return ValidateDataSpec("data", o.data);
}

absl::StatusOr<EvalOptions> MergeEvalSpec(const EvalSpec& request,
                                          int64_t max_position_embeddings) {
  EvalOptions o;
  o.data = request.data;
  MEMPROFD_EVAL_VALUE_FIELDS(MEMPROFD_MERGE_VALUE_FIELD)
  MEMPROFD_EVAL_CHOICE_FIELDS(MEMPROFD_MERGE_CHOICE_FIELD)
  RETURN_IF_ERROR(ValidateEvalOptions(o, max_position_embeddings));
  return o;
}

}  // namespace memprofd
