#ifndef MEMPROFD_CORE_PLAN_GEMM_BUFFERS_H_
#define MEMPROFD_CORE_PLAN_GEMM_BUFFERS_H_

// What a bfloat16 matrix product allocates inside itself on this host's CPU.
// On some CPUs (seen on AVX-512 hosts with this LibTorch) every bf16 mm and
// addmm allocates a float32 buffer of its output, plus a few bytes, and frees
// it before it returns: 1 MiB for the weight gradient of a 256 x 1024
// projection, 16 MiB for a 16384-token vocabulary's. A meta kernel allocates
// only the output, so a dry run would miss the buffer at the moment it is
// live. The host's rule is probed once, for real; a dry run for the CPU then
// allocates and frees the same buffer on the meta device at the end of each
// such product, where the real kernel had it live beside its output.
//
// Thread-safety: HostBf16GemmBuffer is thread-safe (probed once per
// process); Bf16GemmBuffers covers the thread that made it.

#include <cstdint>
#include <optional>

namespace memprofd::plan::internal {

// The bytes a bf16 mm of an m x n output allocates beyond it on this host,
// as m * n * 4 + pad: `pad`, or nullopt when it allocates nothing more (or
// the counting CPU allocator is not installed to tell).
std::optional<int64_t> HostBf16GemmBufferPad();

// While alive, at the end of each aten::mm and aten::addmm on this thread
// whose output is a bf16 meta matrix, allocates m * n * 4 + pad bytes on the
// meta device and frees them.
class Bf16GemmBuffers {
 public:
  explicit Bf16GemmBuffers(int64_t pad);
  ~Bf16GemmBuffers();
  Bf16GemmBuffers(const Bf16GemmBuffers&) = delete;
  Bf16GemmBuffers& operator=(const Bf16GemmBuffers&) = delete;

 private:
  uint64_t handle_;  // at::CallbackHandle
  const int64_t previous_pad_;
};

}  // namespace memprofd::plan::internal

#endif  // MEMPROFD_CORE_PLAN_GEMM_BUFFERS_H_
