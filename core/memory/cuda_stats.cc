#include "core/memory/cuda_stats.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/version.h>

#include <exception>

namespace memprofd {
namespace memory {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

constexpr size_t kAll = 0;  // StatType::AGGREGATE

}  // namespace

int CudaDeviceCount() {
  try {
    return static_cast<int>(c10::cuda::device_count());
  } catch (const std::exception&) {
    return 0;
  }
}

std::vector<CudaDeviceSample> SampleCudaDevices() {
  std::vector<CudaDeviceSample> out;
  const int n = CudaDeviceCount();
  for (int d = 0; d < n; ++d) {
    try {
      const auto stats = cca::getDeviceStats(d);
      CudaDeviceSample s;
      s.device = d;
      s.allocated_bytes = stats.allocated_bytes[kAll].current;
      s.peak_allocated_bytes = stats.allocated_bytes[kAll].peak;
      s.reserved_bytes = stats.reserved_bytes[kAll].current;
      s.peak_reserved_bytes = stats.reserved_bytes[kAll].peak;
      s.active_bytes = stats.active_bytes[kAll].current;
      s.peak_active_bytes = stats.active_bytes[kAll].peak;
      s.alloc_retries = stats.num_alloc_retries;
      s.ooms = stats.num_ooms;
      s.alloc_count = stats.allocation[kAll].allocated;
      s.free_count = stats.allocation[kAll].freed;
      out.push_back(s);
    } catch (const std::exception&) {
      // The allocator is not initialised for this device yet.
    }
  }
  return out;
}

void ResetCudaPeaks() {
  const int n = CudaDeviceCount();
  for (int d = 0; d < n; ++d) {
    try {
      cca::resetPeakStats(d);
    } catch (const std::exception&) {
    }
  }
}

absl::Status SetCudaHistory(bool enabled, int64_t max_entries) {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  try {
    // RecordContext::NEVER: no stack gathering, so no context recorder is
    // needed; the trace itself is recorded whenever history is enabled.
    cca::recordHistory(enabled, nullptr,
                       static_cast<size_t>(max_entries > 0 ? max_entries : 1),
                       cca::RecordContext::NEVER);
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
  return absl::OkStatus();
#else
  (void)enabled;
  (void)max_entries;
  return absl::UnimplementedError(
      "CUDA allocator history needs LibTorch >= 2.1; only segments are dumped");
#endif
}

CudaAllocatorSnapshot CaptureCudaSnapshot() {
  CudaAllocatorSnapshot out;
  if (CudaDeviceCount() == 0) return out;
  try {
    const auto snap = cca::snapshot();
#if TORCH_VERSION_MAJOR >= 2
    const auto& segments = snap.segments;
#else
    const auto& segments = snap;
#endif
    for (const auto& seg : segments) {
      VizSegment v;
      v.device = static_cast<int>(seg.device);
      v.address = static_cast<uint64_t>(seg.address);
      v.total_size = static_cast<int64_t>(seg.total_size);
      for (const auto& b : seg.blocks) {
        VizBlock vb;
        vb.size = static_cast<int64_t>(b.size);
        vb.requested_size = b.allocated ? vb.size : 0;
        vb.state = b.allocated ? VizBlockState::kActiveAllocated
                   : b.active  ? VizBlockState::kActivePendingFree
                               : VizBlockState::kInactive;
        v.blocks.push_back(vb);
      }
      out.segments.push_back(std::move(v));
    }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
    for (const auto& trace : snap.device_traces) {
      std::vector<VizTraceEntry> entries;
      for (const auto& t : trace) {
        VizTraceEntry e;
        using A = cca::TraceEntry::Action;
        switch (t.action_) {
          case A::ALLOC:
            e.action = VizAction::kAlloc;
            break;
          case A::FREE_REQUESTED:
            e.action = VizAction::kFreeRequested;
            break;
          case A::FREE_COMPLETED:
            e.action = VizAction::kFreeCompleted;
            break;
          case A::SEGMENT_ALLOC:
            e.action = VizAction::kSegmentAlloc;
            break;
          case A::SEGMENT_FREE:
            e.action = VizAction::kSegmentFree;
            break;
          default:
            continue;
        }
        e.addr = static_cast<uint64_t>(t.addr_);
        e.size = static_cast<int64_t>(t.size_);
        entries.push_back(e);
      }
      out.device_traces.push_back(std::move(entries));
    }
#endif
  } catch (const std::exception&) {
    return CudaAllocatorSnapshot{};
  }
  return out;
}

}  // namespace memory
}  // namespace memprofd
