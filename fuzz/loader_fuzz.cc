// LoadSafetensorsDirectory on a directory the input describes:
//   <index.json> SEP <shard 1> SEP <shard 2> SEP <config.json>
// (SEP = "\n--8<--\n"), written as model.safetensors.index.json,
// model-00001-of-00002.safetensors, model-00002-of-00002.safetensors and
// config.json; a first part starting with "ST" instead puts the rest of that
// part in model.safetensors. Oracle: NOT_FOUND / FAILED_PRECONDITION /
// DATA_LOSS / INVALID_ARGUMENT only; every file read lies inside the
// directory (an index naming "../x" or "/etc/passwd" must not be followed);
// every tensor's bytes can be read.

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/snapshot/loader.h"
#include "fuzz/fuzz_util.h"

using memprofd::snapshot::LoadedWeights;
using memprofd::snapshot::LoadSafetensorsDirectory;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const std::string dir = memprofd::fuzz::ScratchDir() + "/model";
  fs::create_directories(dir);
  memprofd::fuzz::ClearDir(dir);
  // A valid shard outside the directory, which an index must not reach.
  memprofd::fuzz::WriteFileOrDie(memprofd::fuzz::ScratchDir() + "/outside.safetensors",
                                 "");
  std::vector<absl::string_view> parts = memprofd::fuzz::SplitInput(
      absl::string_view(reinterpret_cast<const char*>(data), size), "\n--8<--\n", 4);
  if (parts[0].substr(0, 2) == "ST") {
    memprofd::fuzz::WriteFileOrDie(dir + "/model.safetensors", parts[0].substr(2));
  } else {
    memprofd::fuzz::WriteFileOrDie(dir + "/model.safetensors.index.json", parts[0]);
  }
  if (parts.size() > 1) {
    memprofd::fuzz::WriteFileOrDie(dir + "/model-00001-of-00002.safetensors", parts[1]);
  }
  if (parts.size() > 2) {
    memprofd::fuzz::WriteFileOrDie(dir + "/model-00002-of-00002.safetensors", parts[2]);
  }
  if (parts.size() > 3) memprofd::fuzz::WriteFileOrDie(dir + "/config.json", parts[3]);

  absl::StatusOr<LoadedWeights> weights = LoadSafetensorsDirectory(dir);
  if (!weights.ok()) {
    memprofd::fuzz::CheckBadInputStatus(
        weights.status(),
        {absl::StatusCode::kNotFound, absl::StatusCode::kFailedPrecondition,
         absl::StatusCode::kDataLoss, absl::StatusCode::kInvalidArgument,
         absl::StatusCode::kResourceExhausted});
    return 0;
  }
  for (const std::string& file : weights->files) {
    FUZZ_CHECK(file.find('/') == std::string::npos);
    FUZZ_CHECK(fs::is_regular_file(dir + "/" + file));
  }
  for (const auto& [name, t] : weights->tensors) {
    if (t.numel() > 0) (void)t.to(at::kDouble).sum().item<double>();
  }
  return 0;
}
