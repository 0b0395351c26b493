// Training data files: TokenDataset::Create on a file with arbitrary bytes,
// read as text (bytes) or as uint16 / uint32 token ids, then batches drawn
// from it. The first input byte picks the kind and the vocabulary size (a
// small one, so that out-of-range ids are common). Oracle:
// INVALID_ARGUMENT only for bad input; an accepted dataset's ids are all
// below the vocabulary; NextBatch gives targets equal to the inputs shifted
// by one, or Validate's error.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstddef>
#include <cstdint>

#include "core/train/data.h"
#include "core/train/train_options.h"
#include "fuzz/fuzz_util.h"

using memprofd::DataSpec;
using memprofd::TokenDataset;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const std::string path = memprofd::fuzz::ScratchDir() + "/tokens.bin";
  memprofd::fuzz::WriteFileOrDie(
      path, absl::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  DataSpec spec;
  spec.path = path;
  switch (control & 3) {
    case 0:
      spec.kind = DataSpec::Kind::kTextFile;
      break;
    case 1:
      spec.kind = DataSpec::Kind::kTokenFile;
      spec.bytes_per_token = 2;
      break;
    case 2:
      spec.kind = DataSpec::Kind::kTokenFile;
      spec.bytes_per_token = 4;
      break;
    default:
      spec.kind = DataSpec::Kind::kTokenFile;
      spec.bytes_per_token = (control >> 2) & 7;  // mostly invalid widths
      break;
  }
  const int64_t vocab = (control & 0x80) != 0 ? 256 : 50257;
  auto dataset = TokenDataset::Create(spec, vocab);
  if (!dataset.ok()) {
    memprofd::fuzz::CheckBadInputStatus(dataset.status(),
                                        {absl::StatusCode::kInvalidArgument});
    return 0;
  }
  // The file is not changed after Create, so reading it back never fails.
  absl::StatusOr<at::Tensor> window = (*dataset)->Window(0, (*dataset)->size());
  FUZZ_CHECK(window.ok());
  const at::Tensor& tokens = *window;
  FUZZ_CHECK(tokens.numel() == (*dataset)->size() && tokens.numel() > 0);
  FUZZ_CHECK(tokens.min().item<int64_t>() >= 0 && tokens.max().item<int64_t>() < vocab);
  const int64_t seq_len = 1 + ((control >> 4) & 7);
  at::Generator generator = at::detail::createCPUGenerator(control);
  auto batch = (*dataset)->NextBatch(2, seq_len, generator);
  if (!batch.ok()) {
    FUZZ_CHECK(!(*dataset)->Validate(seq_len).ok());
    memprofd::fuzz::CheckBadInputStatus(batch.status(),
                                        {absl::StatusCode::kInvalidArgument});
    return 0;
  }
  FUZZ_CHECK(batch->inputs.size(0) == 2 && batch->inputs.size(1) == seq_len);
  FUZZ_CHECK(at::equal(batch->inputs.narrow(1, 1, seq_len - 1),
                       batch->targets.narrow(1, 0, seq_len - 1)));
  return 0;
}
