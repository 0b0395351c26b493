#ifndef MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_H_
#define MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_H_

// Reading and writing safetensors files with LibTorch tensors. The format
// itself (layout, validation) is in safetensors_format.h.

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/snapshot/safetensors_format.h"

namespace memprofd {
class PathRoots;  // core/common/files.h
}  // namespace memprofd

namespace memprofd {
namespace snapshot {

// An ordered state dict: (name, tensor), as named_parameters() gives it.
using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

// "F32" for at::kFloat, ...; INVALID_ARGUMENT for dtypes memprofd does not
// store (complex, quantized, float8, unsigned wider than 8 bits, ...).
absl::StatusOr<std::string> SafetensorsDtypeOf(at::ScalarType type);
// at::kFloat for "F32", ...; INVALID_ARGUMENT for any other string.
absl::StatusOr<at::ScalarType> ScalarTypeOfSafetensorsDtype(absl::string_view dtype);

// The {"format": "pt"} metadata every file carries (transformers needs it).
const std::map<std::string, std::string>& PtMetadata();

// A validated, memory-mapped safetensors file. The mapping is private and
// copy-on-write: writing to a returned tensor never reaches the file. Tensors
// share ownership of the mapping and stay valid after this object is gone;
// their pages are read from disk when touched, so a file much larger than
// memory can be held ("disk" placement). Tensors whose offset is not aligned
// to their element size (files from other writers) are copied instead.
// Thread-safe after Open (all methods are const).
class SafetensorsFile {
 public:
  // NOT_FOUND when missing; DATA_LOSS naming the file when it is corrupt or
  // truncated (see ParseSafetensors); INVALID_ARGUMENT for dtypes memprofd
  // does not handle.
  // With `roots`, the file is confined as OpenConfined says (a link is
  // followed only inside the roots; PERMISSION_DENIED outside, before a
  // byte is read).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(
      const std::string& path, const PathRoots* roots = nullptr);

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }

  // Every tensor, in file (offset) order.
  absl::StatusOr<TensorList> Tensors() const;
  // NOT_FOUND when the file has no tensor `name`.
  absl::StatusOr<at::Tensor> Tensor(absl::string_view name) const;

 private:
  struct Mapping;
  SafetensorsFile(std::string path, std::shared_ptr<Mapping> mapping,
                  SafetensorsHeader header)
      : path_(std::move(path)),
        mapping_(std::move(mapping)),
        header_(std::move(header)) {}
  absl::StatusOr<at::Tensor> Materialize(const TensorEntry& entry) const;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  SafetensorsHeader header_;
};

// Writes `tensors` (any device, any strides) as one safetensors file at
// `path` in the reference writer's layout, streaming through a staging buffer
// of `staging_bytes`, and fsyncs it. Not atomic: snapshots use
// SnapshotWriter. ALREADY_EXISTS when `path` exists; INVALID_ARGUMENT for
// duplicate names or unsupported dtypes; RESOURCE_EXHAUSTED on ENOSPC/EFBIG.
absl::Status WriteSafetensorsFile(const std::string& path, const TensorList& tensors,
                                  int64_t staging_bytes = 64 << 20);

}  // namespace snapshot
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_SAFETENSORS_H_
