#include "core/train/data.h"

#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"

namespace memprofd {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file \"", path,
                     "\" does not exist or is not a regular file; give the path of "
                     "a file readable by the daemon"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data file \"", path, "\" cannot be opened: ", std::strerror(errno)));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reading data file \"", path, "\" failed"));
  }
  if (bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data file \"", path, "\" is empty; training needs tokens"));
  }
  return bytes;
}

at::Tensor BytesToTokens(absl::string_view bytes) {
  at::Tensor raw = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(raw.data_ptr(), bytes.data(), bytes.size());
  return raw.to(torch::kInt32);
}

// Little-endian uint16/uint32 ids. The file's ids are checked against the
// vocabulary afterwards, so uint32 values past INT32_MAX (which a vocabulary
// never reaches) are rejected there as negative int32 would be; check them
// here first to give the real value.
absl::StatusOr<at::Tensor> DecodeTokenFile(const std::string& path,
                                           absl::string_view bytes, int bytes_per_token) {
  if (bytes.size() % bytes_per_token != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("token file \"", path, "\" has ", bytes.size(),
                     " bytes, not a multiple of ", bytes_per_token,
                     " bytes per token; check bytes_per_token (2 for uint16, 4 for "
                     "uint32)"));
  }
  const int64_t n = static_cast<int64_t>(bytes.size()) / bytes_per_token;
  at::Tensor out = torch::empty({n}, torch::kInt32);
  int32_t* dst = out.data_ptr<int32_t>();
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  for (int64_t i = 0; i < n; ++i) {
    const unsigned char* p = src + i * bytes_per_token;
    uint32_t v = p[0] | (uint32_t{p[1]} << 8);
    if (bytes_per_token == 4) v |= (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
    if (v > static_cast<uint32_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", v, " at position ", i, " of \"", path,
                       "\" is out of range for any vocabulary"));
    }
    dst[i] = static_cast<int32_t>(v);
  }
  return out;
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
  const int64_t value = tokens[pos].item<int64_t>();
  return absl::InvalidArgumentError(absl::StrCat(
      "token id ", value, " at position ", pos, " of ", source,
      " is outside the model's vocabulary [0, ", vocab_size,
      "); use data tokenized for this model or a model with a larger vocab_size"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Create(const DataSpec& spec,
                                                                   int64_t vocab_size) {
  at::Tensor tokens;
  std::string source;
  std::string bytes;
  switch (spec.kind) {
    case DataSpec::Kind::kEmbeddedCorpus:
      source = "the embedded corpus";
      break;
    case DataSpec::Kind::kTextFile:
    case DataSpec::Kind::kTokenFile: {
      if (spec.path.empty()) {
        return absl::InvalidArgumentError(
            "the data source is a file but no path was given");
      }
      if (spec.kind == DataSpec::Kind::kTokenFile && spec.bytes_per_token != 2 &&
          spec.bytes_per_token != 4) {
        return absl::InvalidArgumentError(
            absl::StrCat("bytes_per_token must be 2 (uint16) or 4 (uint32), got ",
                         spec.bytes_per_token));
      }
      source = absl::StrCat("\"", spec.path, "\"");
      ASSIGN_OR_RETURN(bytes, ReadFile(spec.path));
      break;
    }
    case DataSpec::Kind::kInlineTokens:
      source = "the inline tokens";
      if (spec.tokens.empty()) {
        return absl::InvalidArgumentError(
            "the inline token list is empty; send token ids");
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown data kind ", static_cast<int>(spec.kind)));
  }
  // Decode and CheckRange may throw (allocation); their own errors are
  // statuses, carried out of the boundary in `result`.
  absl::Status result;
  RETURN_IF_ERROR(TorchBoundary("loading training data", [&] {
    switch (spec.kind) {
      case DataSpec::Kind::kEmbeddedCorpus:
        tokens = BytesToTokens(EmbeddedCorpus());
        break;
      case DataSpec::Kind::kTextFile:
        tokens = BytesToTokens(bytes);
        break;
      case DataSpec::Kind::kTokenFile: {
        absl::StatusOr<at::Tensor> t =
            DecodeTokenFile(spec.path, bytes, spec.bytes_per_token);
        if (!t.ok()) {
          result = t.status();
          return;
        }
        tokens = *std::move(t);
        break;
      }
      case DataSpec::Kind::kInlineTokens:
        // Checked in int64 before narrowing, so that huge ids are reported as sent.
        tokens = torch::tensor(at::ArrayRef<int64_t>(spec.tokens), torch::kInt64);
        break;
    }
    result = CheckRange(tokens, vocab_size, source);
    if (result.ok()) tokens = tokens.to(torch::kInt32);
  }));
  RETURN_IF_ERROR(result);
  return std::unique_ptr<TokenDataset>(new TokenDataset(std::move(tokens)));
}

int64_t TokenDataset::size() const { return tokens_.numel(); }

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
  return absl::OkStatus();
}

absl::StatusOr<TokenBatch> TokenDataset::NextBatch(int64_t batch, int64_t seq_len,
                                                   at::Generator& generator) const {
  RETURN_IF_ERROR(Validate(seq_len));
  if (batch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_size must be at least 1, got ", batch));
  }
  TokenBatch out;
  RETURN_IF_ERROR(TorchBoundary("drawing a batch", [&] {
    // Windows [s, s + seq_len] for s uniform in [0, N - seq_len - 1].
    at::Tensor starts = at::randint(0, size() - seq_len, {batch, 1}, generator,
                                    torch::TensorOptions().dtype(torch::kInt64));
    at::Tensor index = starts + torch::arange(seq_len + 1, torch::kInt64).unsqueeze(0);
    at::Tensor windows = tokens_.index_select(0, index.view({-1}))
                             .view({batch, seq_len + 1})
                             .to(torch::kInt64);
    out.inputs = windows.narrow(1, 0, seq_len).contiguous();
    out.targets = windows.narrow(1, 1, seq_len).contiguous();
  }));
  return out;
}

}  // namespace memprofd
