#include "core/train/data.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/common/utf8.h"
#include "core/train/indexed_dataset.h"

namespace memprofd {
namespace {

at::Tensor BytesToTokens(absl::string_view bytes) {
  at::Tensor raw = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
  return raw.to(torch::kInt32);
}

// Little-endian uint8/uint16/uint32 id at `p`.
inline uint32_t DecodeToken(const unsigned char* p, int width) {
  if (width == 1) return p[0];
  uint32_t v = p[0] | (uint32_t{p[1]} << 8);
  if (width == 4) v |= (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
  return v;
}

absl::Status OutOfVocabulary(int64_t value, int64_t pos, absl::string_view source,
                             int64_t vocab_size) {
  return absl::InvalidArgumentError(absl::StrCat(
      "token id ", value, " at position ", pos, " of ", source,
      " is outside the model's vocabulary [0, ", vocab_size,
      "); use data tokenized for this model or a model with a larger vocab_size"));
}

absl::Status CheckRange(const at::Tensor& tokens, int64_t vocab_size,
                        absl::string_view source) {
  if (tokens.numel() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, " holds no tokens; training needs tokens"));
  }
  at::Tensor bad = (tokens < 0).logical_or(tokens >= vocab_size);
  if (!bad.any().item<bool>()) return absl::OkStatus();
  const int64_t pos = bad.to(torch::kUInt8).argmax().item<int64_t>();
  return OutOfVocabulary(tokens[pos].item<int64_t>(), pos, source, vocab_size);
}

// One pass over a file's ids in chunks read with pread, dropping each
// chunk's page cache behind it, so that checking a file of any size keeps
// one chunk resident and a file truncated meanwhile is DATA_LOSS, never a
// SIGBUS. `is_signed`: 4-byte ids are int32 (a Megatron dataset's),
// reported as such.
absl::Status CheckFileRange(const ReadOnlyFile& file, int width, int64_t count,
                            int64_t vocab_size, absl::string_view source,
                            const std::function<bool()>& cancelled,
                            bool is_signed = false) {
  // Every byte fits a vocabulary of 256 or more.
  if (width == 1 && vocab_size >= 256) return absl::OkStatus();
  constexpr int64_t kChunkTokens = int64_t{1} << 20;
  std::vector<unsigned char> chunk(
      static_cast<size_t>(std::min(count, kChunkTokens) * width));
  for (int64_t first = 0; first < count; first += kChunkTokens) {
    if (cancelled && cancelled()) {
      return absl::CancelledError(absl::StrCat("cancelled while checking ", source));
    }
    const int64_t last = std::min(count, first + kChunkTokens);
    RETURN_IF_ERROR(file.ReadAt(first * width, (last - first) * width, chunk.data()));
    for (int64_t i = first; i < last; ++i) {
      const uint32_t v = DecodeToken(chunk.data() + (i - first) * width, width);
      if (v >= static_cast<uint64_t>(vocab_size)) {
        return OutOfVocabulary(is_signed ? int64_t{static_cast<int32_t>(v)} : int64_t{v},
                               i, source, vocab_size);
      }
    }
    file.Release(first * width, (last - first) * width);
  }
  return absl::OkStatus();
}

// `path` confined to access.roots (a missing path inside them is
// INVALID_ARGUMENT: it is part of the request), or checked for NUL bytes
// when there are no roots.
absl::StatusOr<std::string> DataFilePath(const std::string& path,
                                         const DataAccess& access,
                                         absl::string_view what) {
  if (access.roots != nullptr) {
    absl::StatusOr<std::string> confined = access.roots->Confine(path, what);
    if (absl::IsNotFound(confined.status())) {
      return absl::InvalidArgumentError(confined.status().message());
    }
    return confined;
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", Echo(path), " contains a NUL byte"));
  }
  return path;
}

absl::StatusOr<std::unique_ptr<ReadOnlyFile>> OpenDataFile(const std::string& path,
                                                           const DataAccess& access,
                                                           absl::string_view what) {
  ASSIGN_OR_RETURN(const std::string resolved, DataFilePath(path, access, what));
  return ReadOnlyFile::Open(resolved, access.max_file_bytes, what, access.roots);
}

}  // namespace

int64_t InMemoryTokenBytes(const DataSpec& spec) {
  constexpr int64_t kTokenBytes = sizeof(int32_t);  // tokens_ is int32
  switch (spec.kind) {
    case DataSpec::Kind::kEmbeddedCorpus:
      return static_cast<int64_t>(EmbeddedCorpus().size()) * kTokenBytes;
    case DataSpec::Kind::kInlineTokens:
      return static_cast<int64_t>(spec.tokens.size()) * kTokenBytes;
    default:
      return 0;
  }
}

TokenDataset::~TokenDataset() = default;

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::CreateIndexed(
    const DataSpec& spec, int64_t vocab_size, const DataAccess& access) {
  if (spec.path.empty()) {
    return absl::InvalidArgumentError(
        "the data source is an indexed dataset but no path prefix was given");
  }
  const std::string idx_path = spec.path + ".idx";
  const std::string bin_path = spec.path + ".bin";
  // The index is parsed once, read as it is parsed (never mapped: a file
  // truncated meanwhile fails the parse instead of raising SIGBUS); the
  // data is read in windows.
  ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyFile> idx,
                   OpenDataFile(idx_path, access, "indexed dataset index"));
  ASSIGN_OR_RETURN(std::unique_ptr<ReadOnlyFile> bin,
                   OpenDataFile(bin_path, access, "indexed dataset data"));
  const std::string idx_name = Echo(idx_path);
  const std::string bin_name = Echo(bin_path);
  const IndexReader read = [&idx](int64_t offset, int64_t length, void* out) {
    return idx->ReadAt(offset, length, out);
  };
  ASSIGN_OR_RETURN(MegatronIndex index,
                   ParseMegatronIndex(read, idx->size(), idx_name, bin->size(), bin_name,
                                      access.cancelled));
  idx->Release(0, idx->size());
  std::unique_ptr<TokenDataset> out(new TokenDataset());
  out->file_ = std::move(bin);
  out->width_ = index.width;
  out->size_ = index.tokens;
  out->doc_bounds_ = std::move(index.doc_bounds);
  out->windows_ = spec.windows;
  out->vocab_size_ = vocab_size;
  out->is_signed_ = index.is_signed;
  RETURN_IF_ERROR(CheckFileRange(*out->file_, out->width_, out->size_, vocab_size,
                                 bin_name, access.cancelled, index.is_signed));
  return out;
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Create(
    const DataSpec& spec, int64_t vocab_size, const DataAccess& access) {
  std::unique_ptr<TokenDataset> out(new TokenDataset());
  switch (spec.kind) {
    case DataSpec::Kind::kEmbeddedCorpus:
    case DataSpec::Kind::kInlineTokens: {
      const bool inline_tokens = spec.kind == DataSpec::Kind::kInlineTokens;
      if (inline_tokens && spec.tokens.empty()) {
        return absl::InvalidArgumentError(
            "the inline token list is empty; send token ids");
      }
      // CheckRange may throw (allocation); its own error is a status,
      // carried out of the boundary in `result`.
      absl::Status result;
      RETURN_IF_ERROR(TorchBoundary("loading training data", [&] {
        // Inline ids are checked in int64 before narrowing, so that huge
        // ids are reported as sent.
        at::Tensor tokens =
            inline_tokens
                ? torch::tensor(at::ArrayRef<int64_t>(spec.tokens), torch::kInt64)
                : BytesToTokens(EmbeddedCorpus());
        result = CheckRange(tokens, vocab_size,
                            inline_tokens ? "the inline tokens" : "the embedded corpus");
        if (result.ok()) out->tokens_ = tokens.to(torch::kInt32);
      }));
      RETURN_IF_ERROR(result);
      out->size_ = out->tokens_.numel();
      return out;
    }
    case DataSpec::Kind::kTextFile:
    case DataSpec::Kind::kTokenFile:
      break;
    case DataSpec::Kind::kIndexedDataset:
      return CreateIndexed(spec, vocab_size, access);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown data kind ", static_cast<int>(spec.kind)));
  }
  if (spec.path.empty()) {
    return absl::InvalidArgumentError("the data source is a file but no path was given");
  }
  const bool token_file = spec.kind == DataSpec::Kind::kTokenFile;
  if (token_file && spec.bytes_per_token != 2 && spec.bytes_per_token != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bytes_per_token must be 2 (uint16) or 4 (uint32), got ", spec.bytes_per_token));
  }
  ASSIGN_OR_RETURN(out->file_, OpenDataFile(spec.path, access, "data file"));
  out->width_ = token_file ? spec.bytes_per_token : 1;
  const std::string source = Echo(spec.path);
  const int64_t bytes = out->file_->size();
  if (bytes % out->width_ != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", source, " has ", bytes, " bytes, not a multiple of ", out->width_,
        " bytes per token; check bytes_per_token (2 for uint16, 4 for "
        "uint32)"));
  }
  out->size_ = bytes / out->width_;
  out->vocab_size_ = vocab_size;
  RETURN_IF_ERROR(CheckFileRange(*out->file_, out->width_, out->size_, vocab_size, source,
                                 access.cancelled));
  return out;
}

absl::Status TokenDataset::ReadTokens(int64_t start, int64_t count, int64_t* out) const {
  std::vector<unsigned char> bytes(static_cast<size_t>(count * width_));
  RETURN_IF_ERROR(file_->ReadAt(start * width_, count * width_, bytes.data()));
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t v = DecodeToken(bytes.data() + i * width_, width_);
    if (v >= static_cast<uint64_t>(vocab_size_)) {
      // Checked when the data was opened: the file was rewritten since.
      return absl::DataLossError(absl::StrCat(
          "data file ", Echo(file_->path()), " holds token id ",
          is_signed_ ? int64_t{static_cast<int32_t>(v)} : int64_t{v}, " at position ",
          start + i, ", outside the vocabulary [0, ", vocab_size_,
          "), which it did not when it was checked: it was rewritten since; leave a "
          "training's data files unchanged while it runs"));
    }
    out[i] = v;
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> TokenDataset::Window(int64_t start, int64_t count) const {
  at::Tensor out;
  RETURN_IF_ERROR(TorchBoundary("reading a data window", [&] {
    out = file_ == nullptr ? tokens_.narrow(0, start, count).to(torch::kInt64)
                           : torch::empty({count}, torch::kInt64);
  }));
  if (file_ != nullptr)
    RETURN_IF_ERROR(ReadTokens(start, count, out.data_ptr<int64_t>()));
  return out;
}

absl::Status TokenDataset::Validate(int64_t seq_len) const {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq_len must be at least 1, got ", seq_len));
  }
  if (size() < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the data holds ", size(), " tokens, fewer than seq_len + 1 = ", seq_len + 1,
        "; use a shorter seq_len or more data"));
  }
  if (windows_ == DataSpec::Windows::kWithinDocuments) {
    if (const int64_t longest = LongestDocument(); longest < seq_len + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the longest document holds ", longest,
          " tokens, fewer than seq_len + 1 = ", seq_len + 1,
          "; use a shorter seq_len, packed windows, or data with longer documents"));
    }
  }
  return absl::OkStatus();
}

int64_t TokenDataset::LongestDocument() const {
  int64_t longest = 0;
  for (size_t d = 0; d + 1 < doc_bounds_.size(); ++d) {
    longest = std::max(longest, doc_bounds_[d + 1] - doc_bounds_[d]);
  }
  return longest;
}

absl::StatusOr<TokenBatch> TokenDataset::NextBatch(int64_t batch, int64_t seq_len,
                                                   at::Generator& generator) const {
  RETURN_IF_ERROR(Validate(seq_len));
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be at least 1, got ", batch));
  }
  const bool within = windows_ == DataSpec::Windows::kWithinDocuments;
  absl::MutexLock lock(&starts_mu_);
  if (within && starts_.seq_len != seq_len) {
    // Eligible document j offers its length - seq_len starts.
    WithinDocumentStarts table;
    table.seq_len = seq_len;
    table.cumulative.push_back(0);
    for (size_t d = 0; d + 1 < doc_bounds_.size(); ++d) {
      const int64_t starts = doc_bounds_[d + 1] - doc_bounds_[d] - seq_len;
      if (starts < 1) continue;
      table.first_token.push_back(doc_bounds_[d]);
      table.cumulative.push_back(table.cumulative.back() + starts);
    }
    starts_ = std::move(table);
  }
  TokenBatch out;
  absl::Status read;
  RETURN_IF_ERROR(TorchBoundary("drawing a batch", [&] {
    // Windows [s, s + seq_len] for s uniform in [0, N - seq_len - 1], or
    // for k uniform among the within-document starts.
    const int64_t choices = within ? starts_.cumulative.back() : size() - seq_len;
    at::Tensor starts = at::randint(0, choices, {batch, 1}, generator,
                                    torch::TensorOptions().dtype(torch::kInt64));
    if (within) {
      int64_t* k = starts.data_ptr<int64_t>();
      for (int64_t b = 0; b < batch; ++b) {
        const auto it =
            std::upper_bound(starts_.cumulative.begin(), starts_.cumulative.end(), k[b]) -
            1;
        const size_t j = static_cast<size_t>(it - starts_.cumulative.begin());
        k[b] = starts_.first_token[j] + (k[b] - *it);
      }
    }
    at::Tensor windows;
    if (file_ == nullptr) {
      at::Tensor index = starts + torch::arange(seq_len + 1, torch::kInt64).unsqueeze(0);
      windows = tokens_.index_select(0, index.view({-1}))
                    .view({batch, seq_len + 1})
                    .to(torch::kInt64);
    } else {
      windows = torch::empty({batch, seq_len + 1}, torch::kInt64);
      const int64_t* first = starts.data_ptr<int64_t>();
      int64_t* dst = windows.data_ptr<int64_t>();
      for (int64_t b = 0; b < batch && read.ok(); ++b) {
        read = ReadTokens(first[b], seq_len + 1, dst + b * (seq_len + 1));
      }
      if (!read.ok()) return;
    }
    out.inputs = windows.narrow(1, 0, seq_len).contiguous();
    out.targets = windows.narrow(1, 1, seq_len).contiguous();
  }));
  RETURN_IF_ERROR(read);
  return out;
}

}  // namespace memprofd
