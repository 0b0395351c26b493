#include "core/snapshot/internal/shard_writer.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/snapshot/internal/file_io.h"
#include "core/snapshot/safetensors.h"

namespace memprofd {
namespace snapshot::internal {

absl::Status CheckTensorWritable(const std::string& name, const at::Tensor& tensor) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is undefined"));
  }
  if (tensor.layout() != at::kStrided) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " is not dense (sparse layouts cannot be saved)"));
  }
  if (tensor.is_meta()) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, " is on the meta device and has no data to save"));
  }
  return snapshot::SafetensorsDtypeOf(tensor.scalar_type()).status();
}

absl::StatusOr<int64_t> WriteShard(const std::string& path,
                                   const std::vector<ShardTensor>& tensors,
                                   StagingBuffer& staging,
                                   absl::FunctionRef<absl::Status(int64_t)> after_chunk,
                                   const std::map<std::string, std::string>& metadata,
                                   const TensorHooks* hooks) {
  std::vector<snapshot::TensorSpec> specs;
  std::map<std::string, const ShardTensor*> by_name;
  for (const ShardTensor& t : tensors) {
    RETURN_IF_ERROR(CheckTensorWritable(t.name, t.tensor));
    ASSIGN_OR_RETURN(std::string dtype, snapshot::SafetensorsDtypeOf(t.out_dtype));
    specs.push_back(
        {t.name, std::move(dtype),
         std::vector<int64_t>(t.tensor.sizes().begin(), t.tensor.sizes().end())});
    by_name[t.name] = &t;
  }
  std::map<std::string, std::string> header_metadata = metadata;
  for (const auto& [key, value] : snapshot::PtMetadata()) header_metadata[key] = value;
  ASSIGN_OR_RETURN(snapshot::SafetensorsLayout layout,
                   snapshot::LayoutSafetensors(std::move(specs), header_metadata));
  ASSIGN_OR_RETURN(OutputFile file, OutputFile::Create(path));
  RETURN_IF_ERROR(file.Write(layout.header_bytes.data(), layout.header_bytes.size()));
  for (const snapshot::TensorEntry& entry : layout.entries) {
    const ShardTensor& t = *by_name.at(entry.name);
    const int64_t before = file.bytes_written();
    if (hooks != nullptr && hooks->before) RETURN_IF_ERROR(hooks->before(t));
    absl::Status streamed =
        staging.Stream(t.tensor, t.out_dtype, [&](const void* data, size_t size) {
          RETURN_IF_ERROR(file.Write(data, size));
          return after_chunk(static_cast<int64_t>(size));
        });
    if (hooks != nullptr && hooks->after) hooks->after(t);
    RETURN_IF_ERROR(streamed);
    if (file.bytes_written() - before != static_cast<int64_t>(entry.bytes())) {
      return absl::InternalError(absl::StrCat("tensor ", entry.name, " streamed ",
                                              file.bytes_written() - before,
                                              " bytes, expected ", entry.bytes()));
    }
  }
  const int64_t size = file.bytes_written();
  RETURN_IF_ERROR(file.SyncAndClose());
  return size;
}

}  // namespace snapshot::internal
}  // namespace memprofd
