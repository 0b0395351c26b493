#ifndef MEMPROFD_CORE_MEMORY_MEMORY_STATS_H_
#define MEMPROFD_CORE_MEMORY_MEMORY_STATS_H_

// Plain published memory statistics, read by the server (RPCs, /metrics) and
// the CLI. No LibTorch.

#include <cstdint>
#include <string>
#include <vector>

#include "core/common/phase.h"

namespace memprofd {
namespace memory {

// One device: "cpu" (the CPU allocator wrapper) or "cuda:N".
struct DeviceMemoryStats {
  std::string name;
  int index = -1;  // kCpuDevice for the CPU, the CUDA ordinal otherwise.
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;   // Since start or the last ResetPeak().
  int64_t alloc_count = 0;  // Events since start (counters).
  int64_t free_count = 0;
  // CUDA caching allocator only (has_cuda_stats).
  bool has_cuda_stats = false;
  int64_t reserved_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t active_bytes = 0;
  int64_t peak_active_bytes = 0;
  int64_t alloc_retries = 0;
  int64_t ooms = 0;
};

// The high-water mark of `device` while the last finished step was in `phase`.
struct PhasePeak {
  std::string device;
  Phase phase = Phase::kIdle;
  int64_t peak_bytes = 0;
};

// The high-water mark of `device` over the whole last finished step.
struct StepPeak {
  std::string device;
  int64_t peak_bytes = 0;
};

struct MemoryStatsView {
  std::vector<DeviceMemoryStats> devices;  // CPU first.
  int64_t last_step = 0;                   // 0 until a step has ended.
  // Only phases entered during the last step, device-major, phase order.
  std::vector<PhasePeak> last_step_phase_peaks;
  std::vector<StepPeak> last_step_peaks;
  Phase current_phase = Phase::kIdle;
  int64_t current_step = 0;
  bool cpu_allocator_installed = false;
  bool recording = false;
  int64_t history_entries = 0;
  int64_t history_max_entries = 0;
  int64_t history_dropped = 0;
};

}  // namespace memory
}  // namespace memprofd

#endif  // MEMPROFD_CORE_MEMORY_MEMORY_STATS_H_
