#include "core/snapshot/safetensors.h"

#include <ATen/ATen.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"
#include "core/snapshot/internal/file_io.h"
#include "core/snapshot/internal/shard_writer.h"
#include "core/snapshot/internal/staging.h"

namespace memprofd {
namespace snapshot {
namespace {

struct DtypePair {
  at::ScalarType type;
  const char* name;
};
constexpr DtypePair kPairs[] = {
    {at::kDouble, "F64"},    {at::kFloat, "F32"}, {at::kHalf, "F16"},
    {at::kBFloat16, "BF16"}, {at::kLong, "I64"},  {at::kInt, "I32"},
    {at::kShort, "I16"},     {at::kChar, "I8"},   {at::kByte, "U8"},
    {at::kBool, "BOOL"},
};

}  // namespace

absl::StatusOr<std::string> SafetensorsDtypeOf(at::ScalarType type) {
  for (const auto& p : kPairs) {
    if (p.type == type) return std::string(p.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", c10::toString(type),
                   " cannot be stored in safetensors by memprofd; convert it to a "
                   "floating, integer or bool dtype first"));
}

absl::StatusOr<at::ScalarType> ScalarTypeOfSafetensorsDtype(absl::string_view dtype) {
  for (const auto& p : kPairs) {
    if (dtype == p.name) return p.type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("safetensors dtype \"", dtype, "\" is not supported by memprofd"));
}

const std::map<std::string, std::string>& PtMetadata() {
  static const auto* const kMetadata =
      new std::map<std::string, std::string>{{"format", "pt"}};
  return *kMetadata;
}

struct SafetensorsFile::Mapping {
  void* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr) ::munmap(data, size);
  }
};

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path, const PathRoots* roots) {
  // O_NONBLOCK: a FIFO under a weights file's name is refused below, not
  // waited on.
  ASSIGN_OR_RETURN(const int fd, OpenConfined(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC,
                                              "safetensors file", roots));
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("safetensors file ", path, " does not exist"));
    }
    return snapshot::internal::ErrnoStatus(errno, absl::StrCat("opening ", path));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return snapshot::internal::ErrnoStatus(err, absl::StrCat("stat of ", path));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat("safetensors file ", path, " is not a regular file (",
                     S_ISDIR(st.st_mode) ? "a directory" : "a FIFO, device or socket",
                     "); replace it with the weights file"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(st.st_size);
  if (mapping->size > 0) {
    void* p = ::mmap(nullptr, mapping->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return snapshot::internal::ErrnoStatus(err, absl::StrCat("mapping ", path));
    }
    mapping->data = p;
  }
  ::close(fd);  // the mapping stays valid
  const absl::string_view bytes(static_cast<const char*>(mapping->data), mapping->size);
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensors(bytes, path));
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(path, std::move(mapping), std::move(header)));
}

absl::StatusOr<at::Tensor> SafetensorsFile::Materialize(const TensorEntry& entry) const {
  ASSIGN_OR_RETURN(at::ScalarType type, ScalarTypeOfSafetensorsDtype(entry.dtype));
  char* data = static_cast<char*>(mapping_->data) + header_.data_start() + entry.begin;
  at::Tensor tensor;
  RETURN_IF_ERROR(
      TorchBoundary(absl::StrCat("mapping tensor ", entry.name, " of ", path_), [&] {
        // The deleter owns a reference to the mapping.
        std::shared_ptr<Mapping> keep = mapping_;
        tensor = at::from_blob(
            data, entry.shape, [keep](void*) {}, at::TensorOptions().dtype(type));
        const size_t align = c10::elementSize(type);
        if (reinterpret_cast<uintptr_t>(data) % align != 0) {
          tensor = tensor.clone();
        }
      }));
  return tensor;
}

absl::StatusOr<TensorList> SafetensorsFile::Tensors() const {
  TensorList out;
  out.reserve(header_.tensors.size());
  for (const TensorEntry& e : header_.tensors) {
    ASSIGN_OR_RETURN(at::Tensor t, Materialize(e));
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

absl::StatusOr<at::Tensor> SafetensorsFile::Tensor(absl::string_view name) const {
  for (const TensorEntry& e : header_.tensors) {
    if (e.name == name) return Materialize(e);
  }
  return absl::NotFoundError(absl::StrCat("no tensor \"", name, "\" in ", path_));
}

absl::Status WriteSafetensorsFile(const std::string& path, const TensorList& tensors,
                                  int64_t staging_bytes) {
  std::vector<snapshot::internal::ShardTensor> shard;
  bool on_device = false;
  for (const auto& [name, t] : tensors) {
    RETURN_IF_ERROR(snapshot::internal::CheckTensorWritable(name, t));
    on_device = on_device || !t.device().is_cpu();
    shard.push_back({name, t, t.scalar_type()});
  }
  ASSIGN_OR_RETURN(auto staging,
                   snapshot::internal::StagingBuffer::Create(staging_bytes, on_device));
  absl::StatusOr<int64_t> size = snapshot::internal::WriteShard(
      path, shard, *staging, [](int64_t) { return absl::OkStatus(); });
  if (!size.ok() && size.status().code() != absl::StatusCode::kAlreadyExists) {
    ::unlink(path.c_str());
  }
  return size.status();
}

}  // namespace snapshot
}  // namespace memprofd
