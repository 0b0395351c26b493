// SafetensorsFile::Open on an arbitrary file, then every tensor read back
// (mapped or copied) and summed, which touches every byte the header claims.
// Oracle: NOT_FOUND / DATA_LOSS / INVALID_ARGUMENT only, no read outside the
// mapping (ASan, or SIGSEGV), and each tensor's byte size as the header says.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>

#include "core/snapshot/safetensors.h"
#include "fuzz/fuzz_util.h"

using memprofd::snapshot::SafetensorsFile;
using memprofd::snapshot::TensorList;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = memprofd::fuzz::ScratchDir() + "/input.safetensors";
  memprofd::fuzz::WriteFileOrDie(
      path, absl::string_view(reinterpret_cast<const char*>(data), size));
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    memprofd::fuzz::CheckBadInputStatus(
        file.status(), {absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument});
    return 0;
  }
  absl::StatusOr<TensorList> tensors = (*file)->Tensors();
  if (!tensors.ok()) {
    memprofd::fuzz::CheckBadInputStatus(
        tensors.status(),
        {absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument,
         absl::StatusCode::kResourceExhausted});
    return 0;
  }
  FUZZ_CHECK(tensors->size() == (*file)->header().tensors.size());
  for (size_t i = 0; i < tensors->size(); ++i) {
    const at::Tensor& t = (*tensors)[i].second;
    FUZZ_CHECK(static_cast<uint64_t>(t.nbytes()) == (*file)->header().tensors[i].bytes());
    if (t.numel() > 0) (void)t.to(at::kDouble).sum().item<double>();
  }
  return 0;
}
