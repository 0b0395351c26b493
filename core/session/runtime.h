#ifndef MEMPROFD_CORE_SESSION_RUNTIME_H_
#define MEMPROFD_CORE_SESSION_RUNTIME_H_

// The process-wide state the engine works through, made explicit.
//
// LibTorch has one CPU allocator and one autograd engine per process, so
// memory accounting (the counting CPU allocator reporting to the recorder,
// the recorder as the phase listener) and the offload engine (autograd's
// saved-tensor hooks) can only be installed once, for the whole process.
// Rather than have the session install them as a side effect, main (and each
// test binary, through tests/testing) makes the one Runtime with Install()
// and hands it to Session::Create; session code reads memory through
// runtime.recorder(), never through a global lookup.
//
// Thread-safety: Install() may be called from any thread, any number of
// times (every call returns the same Runtime). recorder() is thread-safe, as
// MemoryRecorder is. UseDevice() is called by Session::Create, before the
// session's first tensor.

#include <string>

#include "absl/status/statusor.h"

namespace memprofd {
namespace memory {
class MemoryRecorder;
}

// The recorder's device index of a resolved device ("cpu": kCpuDevice,
// "cuda:N": N).
int RecorderDeviceOf(const std::string& device);

class Runtime {
 public:
  // Installs the counting CPU allocator, registers the process's recorder as
  // the phase listener and installs the offload engine, the first time;
  // returns the process's Runtime every time. The allocator's installation
  // may fail (accounting is then off, and a warning is logged once); the
  // offload engine's failure is returned.
  static absl::StatusOr<Runtime*> Install();

  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // Every allocation and free the instrumented allocators see.
  memory::MemoryRecorder& recorder() const { return recorder_; }

  // Prepares for a session computing on `device` (resolved: "cpu" or
  // "cuda:N"): the recorder records CUDA history only for a CUDA device (a
  // CPU daemon on a GPU host creates no CUDA context for it), on CUDA the
  // caching allocator's blocks are attributed (a warning when that is
  // unavailable), and the device's allocations are capped at
  // `memory_limit_bytes` (0: no cap; SessionOptions::device_memory_limit_bytes).
  // The cap's status: INVALID_ARGUMENT beyond the device's size. Call before
  // the session's first tensor.
  absl::Status UseDevice(const std::string& device, int64_t memory_limit_bytes);

 private:
  explicit Runtime(memory::MemoryRecorder& recorder) : recorder_(recorder) {}

  memory::MemoryRecorder& recorder_;
};

}  // namespace memprofd

#endif  // MEMPROFD_CORE_SESSION_RUNTIME_H_
