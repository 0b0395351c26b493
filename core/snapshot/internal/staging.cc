#include "core/snapshot/internal/staging.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/common/torch_boundary.h"

namespace memprofd {
namespace snapshot::internal {
namespace {

// Calls fn on pieces of `t` that, taken in order, cover its elements in
// row-major order, each of at most max_elems elements. Views only: never
// copies (a reshape of a non-contiguous tensor would copy all of it).
absl::Status ForEachPiece(const at::Tensor& t, int64_t max_elems,
                          absl::FunctionRef<absl::Status(const at::Tensor&)> fn) {
  const int64_t numel = t.numel();
  if (numel == 0) return absl::OkStatus();
  if (numel <= max_elems) return fn(t);
  if (t.is_contiguous()) {
    const at::Tensor flat = t.view({-1});
    for (int64_t off = 0; off < numel; off += max_elems) {
      RETURN_IF_ERROR(fn(flat.narrow(0, off, std::min(max_elems, numel - off))));
    }
    return absl::OkStatus();
  }
  const int64_t rows = t.size(0);
  const int64_t row = numel / rows;
  if (row <= max_elems) {
    const int64_t k = max_elems / row;
    for (int64_t r = 0; r < rows; r += k) {
      RETURN_IF_ERROR(fn(t.narrow(0, r, std::min(k, rows - r))));
    }
    return absl::OkStatus();
  }
  for (int64_t r = 0; r < rows; ++r) {
    RETURN_IF_ERROR(ForEachPiece(t.select(0, r), max_elems, fn));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingBuffer>> StagingBuffer::Create(int64_t bytes,
                                                                     bool pinned) {
  if (bytes < kMinBytes) {
    return absl::InvalidArgumentError(absl::StrCat("staging buffer of ", bytes,
                                                   " bytes is too small; use at least ",
                                                   kMinBytes, " (default 64 MiB)"));
  }
  return std::unique_ptr<StagingBuffer>(new StagingBuffer(bytes, pinned));
}

absl::Status StagingBuffer::EnsureAllocated() {
  if (buffer_.defined()) return absl::OkStatus();
  return TorchBoundary(
      absl::StrCat("allocating a ", bytes_, "-byte staging buffer"), [&] {
        buffer_ = at::empty({bytes_},
                            at::TensorOptions().dtype(at::kByte).pinned_memory(pinned_));
      });
}

absl::Status StagingBuffer::Stream(
    const at::Tensor& src, at::ScalarType out_dtype,
    absl::FunctionRef<absl::Status(const void*, size_t)> sink) {
  // Parameters require grad: without this, copying them into the buffer
  // would record autograd history.
  c10::NoGradGuard no_grad;
  if (src.device().is_cpu() && src.scalar_type() == out_dtype && src.is_contiguous() &&
      !src.is_conj() && !src.is_neg()) {
    // Already host bytes in the file's form: no copy at all.
    const char* data = static_cast<const char*>(src.data_ptr());
    const int64_t total = static_cast<int64_t>(src.nbytes());
    for (int64_t off = 0; off < total; off += bytes_) {
      RETURN_IF_ERROR(
          sink(data + off, static_cast<size_t>(std::min(bytes_, total - off))));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(EnsureAllocated());
  const int64_t out_size = static_cast<int64_t>(c10::elementSize(out_dtype));
  const bool two_regions = !src.device().is_cpu() && src.scalar_type() != out_dtype;
  const int64_t per_elem =
      two_regions ? out_size + static_cast<int64_t>(src.element_size()) : out_size;
  // A multiple of 8 elements keeps the second region aligned.
  const int64_t max_elems = std::max<int64_t>(1, ((bytes_ - 8) / per_elem) / 8 * 8);
  absl::Status piece_status;
  absl::Status torch_status = TorchBoundary("streaming a tensor to the snapshot", [&] {
    piece_status = ForEachPiece(src, max_elems, [&](const at::Tensor& piece) {
      return StreamPiece(piece, out_dtype, sink);
    });
  });
  RETURN_IF_ERROR(torch_status);
  return piece_status;
}

absl::Status StagingBuffer::StreamPiece(
    const at::Tensor& piece, at::ScalarType out_dtype,
    absl::FunctionRef<absl::Status(const void*, size_t)> sink) {
  uint8_t* base = buffer_.data_ptr<uint8_t>();
  const auto cpu = at::TensorOptions().device(at::kCPU);
  const int64_t n = piece.numel();
  const int64_t out_bytes = n * static_cast<int64_t>(c10::elementSize(out_dtype));
  if (!piece.device().is_cpu() && !piece.is_contiguous()) {
    peak_device_temp_bytes_ =
        std::max<int64_t>(peak_device_temp_bytes_, n * piece.element_size());
  }
  if (piece.device().is_cpu() || piece.scalar_type() == out_dtype) {
    at::from_blob(base, piece.sizes(), cpu.dtype(out_dtype)).copy_(piece);
    return sink(base, static_cast<size_t>(out_bytes));
  }
  // Device source needing a conversion: LibTorch's device-to-host copy with a
  // dtype change would allocate a host temporary of the source dtype, so do
  // the two steps ourselves inside the buffer.
  const int64_t raw_bytes = (n * piece.element_size() + 7) / 8 * 8;
  at::Tensor raw = at::from_blob(base, piece.sizes(), cpu.dtype(piece.scalar_type()));
  raw.copy_(piece);
  at::from_blob(base + raw_bytes, piece.sizes(), cpu.dtype(out_dtype)).copy_(raw);
  return sink(base + raw_bytes, static_cast<size_t>(out_bytes));
}

}  // namespace snapshot::internal
}  // namespace memprofd
