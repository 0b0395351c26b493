#ifndef MEMPROFD_CORE_SNAPSHOT_INTERNAL_SHARD_WRITER_H_
#define MEMPROFD_CORE_SNAPSHOT_INTERNAL_SHARD_WRITER_H_

// Writes one safetensors file by streaming its tensors through a staging
// buffer. Owner thread only.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/snapshot/internal/staging.h"

namespace memprofd {
namespace snapshot::internal {

struct ShardTensor {
  std::string name;
  at::Tensor tensor;  // a reference to the caller's tensor, never a copy
  at::ScalarType out_dtype;
  // Its index in the caller's weight list (for TensorAccess); -1 for a
  // tensor that is always resident (a checkpoint's optimizer state).
  int64_t source = -1;
};

// Called around each tensor's data: `before` just before its first byte is
// read (an error stops the write), `after` once its bytes are written or the
// write failed; `after` runs only for a tensor whose `before` succeeded.
struct TensorHooks {
  std::function<absl::Status(const ShardTensor&)> before;
  std::function<void(const ShardTensor&)> after;
};

// OK when `tensor` can be written: defined, strided (not sparse), with data
// (not on the meta device), of a dtype safetensors and LibTorch share.
// INVALID_ARGUMENT or FAILED_PRECONDITION naming the tensor otherwise.
absl::Status CheckTensorWritable(const std::string& name, const at::Tensor& tensor);

// Lays `tensors` out as the reference writer does (metadata {"format":"pt"}
// plus `metadata`),
// creates `path` (O_EXCL), writes header and data, fsyncs and closes it.
// `after_chunk(bytes)` runs after every data chunk and may return an error
// (cancellation) to stop; `hooks` (optional) around each tensor. Returns the file's size.
// The caller removes the file on failure.
absl::StatusOr<int64_t> WriteShard(
    const std::string& path, const std::vector<ShardTensor>& tensors,
    StagingBuffer& staging, absl::FunctionRef<absl::Status(int64_t)> after_chunk,
    const std::map<std::string, std::string>& metadata = {},
    const TensorHooks* hooks = nullptr);

}  // namespace snapshot::internal
}  // namespace memprofd

#endif  // MEMPROFD_CORE_SNAPSHOT_INTERNAL_SHARD_WRITER_H_
